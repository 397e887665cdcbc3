"""What the shadow thread reads about the box and about a candidate (swap/rollout.py): the share of the
CPUs' time that was idle, the share of its time the frontend thread worked, and what a candidate's worker
process used while it computed one request (its CPU and its memory). Each is read by one thread at a time;
none decides anything.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from infermux.models.version import ModelVersion

CPU_WINDOW_S = 0.05  # the CPUs' idle share is measured over this long at least


def _pid(candidate: ModelVersion) -> int | None:
    pid = getattr(candidate.placement, "pid", None)
    return pid if isinstance(pid, int) else None


def cpu_ns(pid: int, proc: str = "/proc") -> int | None:
    """The nanoseconds on a CPU of every live thread of process `pid` (the first field of each thread's
    schedstat); None where /proc does not say."""
    total, found = 0, False
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            total += int(Path(f"{proc}/{pid}/task/{tid}/schedstat").read_bytes().split()[0])
            found = True
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return total if found else None


class WorkerCpu:
    """The CPU a candidate's worker process used from now on: it computes one mirrored request at a time, so
    that is the request's cost, without what a busy box kept a nice-19 process waiting."""

    def __init__(self, candidate: ModelVersion) -> None:
        self.pid = _pid(candidate)
        self.before = cpu_ns(self.pid) if self.pid is not None else None

    def used_us(self) -> int | None:
        """Microseconds on a CPU since it was made; None where they cannot be read (wall time is used)."""
        after = cpu_ns(self.pid) if self.pid is not None else None
        if after is None or self.before is None:
            return None
        return max(0, after - self.before) // 1000


class MemoryProbe:
    """The most memory a candidate's worker process held beyond what it held fresh, before it loaded anything
    (an interpreter and its imports, which a hot model's own version does not hold): its footprint now (with
    its GPU memory), or its peak resident memory (VmHWM) where higher, which a request that allocates and
    frees a lot leaves behind."""

    def __init__(self, candidate: ModelVersion) -> None:
        self.candidate = candidate

    def held(self) -> int | None:
        """The bytes it was seen to hold (None where they cannot be read)."""
        placement = self.candidate.placement
        if placement is None or not hasattr(placement, "footprint"):
            return None
        now = int(placement.footprint())
        pid = _pid(self.candidate)
        try:
            status = Path(f"/proc/{pid}/status").read_text() if pid is not None else ""
        except OSError:
            status = ""
        peak = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0)
        hello = getattr(getattr(placement, "process", None), "hello", None)
        base = getattr(hello, "rss", 0) or 0
        held = max(now, peak)
        return max(1, held - base) if held else None


class CpuIdle:
    """The share of the machine's CPU time that was idle, from /proc/stat, over the last CPU_WINDOW_S or more."""

    def __init__(self, path: str = "/proc/stat", clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.clock = path, clock
        self._last = self._read()
        self._idle = 1.0

    def _read(self) -> tuple[float, int, int] | None:
        """(when, idle ticks, all ticks) of every CPU together; None where there is no /proc/stat."""
        try:
            with open(self.path, "rb") as f:
                ticks = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return self.clock(), ticks[3] + (ticks[4] if len(ticks) > 4 else 0), sum(ticks[:8])

    def idle(self) -> float:
        """The idle share (0 to 1) over the last window; 1.0 where it cannot be told."""
        if self._last is None or self.clock() - self._last[0] < CPU_WINDOW_S:
            return self._idle
        now = self._read()
        if now is None:
            return 1.0
        idle, total = now[1] - self._last[1], now[2] - self._last[2]
        if total > 0:  # else no tick passed yet: keep the last reading and the window's start
            self._last, self._idle = now, idle / total
        return self._idle


class LoopBusy:
    """The share of wall time a loop spent working rather than waiting, over the last CPU_WINDOW_S or more.

    The loop's own thread calls `add` with each turn's working time; another thread reads `share`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.busy_s = 0.0
        self._last = (clock(), 0.0)
        self._share = 0.0

    def add(self, seconds: float) -> None:
        self.busy_s += seconds  # one writer, the loop's thread; a float read elsewhere is never torn

    def share(self) -> float:
        """The working share (0 to 1) since the window began; the last one while it is shorter than the window."""
        now, busy = self.clock(), self.busy_s
        then, before = self._last
        if now - then >= CPU_WINDOW_S:
            self._last, self._share = (now, busy), min(1.0, (busy - before) / (now - then))
        return self._share
