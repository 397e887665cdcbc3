"""A clock the test moves by hand: time-based behaviour checked without sleeping."""

from __future__ import annotations


class Clock:
    """Time that moves only when the test says so (`clock.now += 2`); call it for the time."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
