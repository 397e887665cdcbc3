"""How busy one thread of the daemon is: the frontend's, which receives, parses and replies to every request.

With one context the frontend thread also computes each request it can
(the fast path), so it is the first thing a busy daemon runs out of: a
thread is on one core at a time, and once it is busy all the time free
cores do not raise the QPS (docs/performance.md, "One thread is the
ceiling"). The daemon reads the thread's CPU time from /proc when
it is asked (status, the console, a Prometheus scrape), off the request
path, and reports the share of a core it used between two reads at least
`every_s` apart.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infermux.admin import hardware

#: The share of a core from which the console and `infermux status` show the frontend thread as busy.
BUSY = 0.7
#: The share from which that one thread is what limits the QPS (the console's red, `infermux tune`'s note).
SATURATED = 0.9


@dataclass(frozen=True)
class Load:
    """A thread's CPU time so far, and the share of one core it used over the last `over_s` seconds."""

    cpu_s: float
    busy_ratio: float | None  # None until two reads `every_s` apart
    over_s: float | None

    def as_json(self) -> dict[str, float | None]:
        return {"cpu_s": round(self.cpu_s, 2),
                "busy_ratio": None if self.busy_ratio is None else round(self.busy_ratio, 3),
                "over_s": None if self.over_s is None else round(self.over_s, 1)}


class ThreadLoad:
    """One thread's load, from `tasks`/<id>/stat (this process's threads by default), read on demand."""

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 tasks: Path = Path("/proc/self/task")) -> None:
        self.every_s, self.clock, self.tasks = every_s, clock, tasks
        self._thread: int | None = None  # the id measured so far
        self._base: tuple[float, float] | None = None  # (when, CPU seconds) the ratio is measured from
        self._window: tuple[float, float] | None = None  # (busy_ratio, over_s) between the last two reads
        self._lock = threading.Lock()

    def read(self, native_id: int | None) -> Load | None:
        """The load now of the thread with this id (threading.get_native_id() on that thread): a new
        id starts a new measurement. None for no id, or once the thread is gone."""
        with self._lock:
            if native_id is None:
                return None
            if native_id != self._thread:
                self._thread, self._base, self._window = native_id, None, None
            sample = hardware.process_sample("thread", native_id, self.tasks)
            if sample is None:
                return None
            now, cpu = self.clock(), sample.cpu_seconds
            if self._base is None:
                self._base = (now, cpu)
            elif now - self._base[0] >= self.every_s:
                since, base_cpu = self._base
                self._window = ((cpu - base_cpu) / (now - since), now - since)
                self._base = (now, cpu)
            return Load(cpu, *(self._window or (None, None)))
