"""The frontend loop's periodic work: ticks run between two turns, and how long an idle loop sleeps.

Each tick (the watchdog, the barrier's release, held refusals, silent
streams, the regions' socket...) is a callable on `ticks`; each may say
on `dues` how soon it must run again, and an idle loop sleeps until the
nearest of them, at most `poll_ms`: it wakes for due work only.
"""

from __future__ import annotations

import math
import time
from typing import Callable

# Under load the loop turns once a request at concurrency 1; none of its ticks needs to run more
# often than this (docs/performance.md).
TICK_S = 0.002


class Ticks:
    """The ticks, their due times, and the wait they allow the loop's next turn."""

    def __init__(self) -> None:
        self.ticks: list[Callable[[], None]] = []
        # How soon each tick must run again, in seconds from `now` (None: not until something wakes
        # the loop).
        self.dues: list[Callable[[float], float | None]] = []
        self.poll_ms = 1000  # the longest the loop sleeps: ticks (liveness) run at least this often
        self.wait_ms = 0  # how long the next turn may sleep: the nearest due, at most poll_ms
        self.next_s = 0.0  # ... and, under load, not before this (TICK_S)

    def run_if_due(self) -> None:
        """After a turn: run every tick if TICK_S has passed since the last run (or `soon` asked)."""
        now = time.monotonic()
        if now >= self.next_s:
            self.next_s = now + TICK_S
            for tick in self.ticks:
                tick()
            self.wait_ms = self._longest_wait(time.monotonic())

    def soon(self) -> None:
        """Run the ticks after the next turn (any thread, a signal handler too)."""
        self.next_s = 0.0

    def _longest_wait(self, now: float) -> int:
        """Milliseconds the loop may sleep from `now`: until the nearest tick's due time, at most
        poll_ms. Worked out after the ticks (at most every TICK_S), not on every turn: under load
        the loop never sleeps that long anyway."""
        wait_s = self.poll_ms / 1000
        for due in self.dues:
            soon = due(now)
            if soon is not None and soon < wait_s:
                wait_s = max(0.0, soon)
        return math.ceil(wait_s * 1000)  # rounded up: a turn that woke a little early would find nothing due
