"""What the shadow thread reads about the box and about a candidate (swap/rollout.py): the share of the
CPUs' time that was idle, the share of its time the frontend thread worked, and the memory a candidate
holds while it computes one request. Each is read by one thread at a time; none decides anything.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from infermux.execution.priority import lower_this_thread
from infermux.models.version import ModelVersion
from infermux.pipelines.calls import StepCall

CPU_WINDOW_S = 0.05  # the CPUs' idle share is measured over this long at least
NICE = 19  # the shadow's threads, and what computes a candidate: the lowest CPU priority

MEMORY_LOOK_S = 0.005  # how often the memory a candidate holds is read while it computes
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MemoryProbe:
    """The most memory a candidate is seen to hold while it computes one request: its worker process's
    footprint (cold), or its engine's figure plus what the daemon's resident memory grew by meanwhile (hot:
    the candidate computes one request at a time, so what the daemon grows by then is mostly its)."""

    def __init__(self, candidate: ModelVersion) -> None:
        self.candidate = candidate
        self.cold = candidate.worker_info() is not None
        self.base = self._read()
        self.peak = self.base

    def _read(self) -> int | None:
        placement = self.candidate.placement
        if self.cold:
            return placement.footprint() if placement is not None else None
        try:
            with open("/proc/self/statm", "rb") as f:
                return int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            return None

    def watch(self, waiter: StepCall, timeout_s: float) -> bool:
        """Wait for the answer, reading the memory meanwhile from a thread of its own (the placement
        may hand the compute back to run on this very thread: StepCall.wait); False if none came
        within `timeout_s`."""
        done = threading.Event()

        def sample() -> None:
            lower_this_thread(NICE, "a candidate's memory probe")
            while not done.wait(MEMORY_LOOK_S):
                now = self._read()
                if now is not None and self.peak is not None:
                    self.peak = max(self.peak, now)

        sampler = threading.Thread(target=sample, name="rollout-memory", daemon=True)
        sampler.start()
        try:
            return waiter.wait(timeout_s)
        finally:
            done.set()
            sampler.join()

    def held(self) -> int | None:
        """The bytes it was seen to hold (None where they cannot be read)."""
        if self.peak is None or self.base is None:
            return None
        if self.cold:
            return self.peak
        engine: Any = self.candidate.engine
        own = engine.memory_bytes() if engine is not None and hasattr(engine, "memory_bytes") else 0
        return own + max(0, self.peak - self.base)


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
