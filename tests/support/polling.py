"""Waiting in tests for something the daemon does on its own time."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], what: str = "", timeout_s: float = 20.0, interval_s: float = 0.02) -> T:
    """Call `check()` until it returns something true, and return that; fail naming `what` after `timeout_s`.

    The bound is a liveness bound (a test must end), never a timing outcome: make it generous, as a
    busy 2-core box can take seconds where an idle one takes milliseconds. `check` may assert, to
    stop at once on a state that can never turn good."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}")
        time.sleep(interval_s)
