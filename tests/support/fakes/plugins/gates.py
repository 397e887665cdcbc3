"""Waiting for a file that a test creates: how the stand-in plugins let a test, another process,
decide when a load or a frame goes on, instead of racing a clock."""

from __future__ import annotations

import time
from pathlib import Path


def opened(gate: Path, limit_s: float) -> bool:
    """True once `gate` exists; False if it did not within `limit_s`. Polls: it is another process's file."""
    deadline = time.monotonic() + limit_s
    while not gate.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
