"""The CPU priority of the threads that compute a model's requests or run a pipeline's steps.

A model or pipeline configured with `nice = N` runs its threads at the daemon's
nice value plus N (Linux keeps a nice value per thread): when the CPUs are busy,
the scheduler gives them to the frontend, the ZeroMQ I/O thread and the other
models first. On a 2-core box a pipeline computing a detector on a large frame
otherwise takes a core from the clients of a small classifier, however briefly.
Lowering a priority needs no privilege; a failure is logged and the thread runs on.
"""

from __future__ import annotations

import logging
import os
import threading

from infermux.config import MAX_NICE

log = logging.getLogger("infermux.priority")


def lower_this_thread(nice: int, what: str) -> None:
    """Add `nice` (0-19; the result is capped at 19) to the calling thread's nice value."""
    if nice <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:
        log.warning("cannot lower the priority of %s's thread (nice = %d): %s; it runs at the daemon's",
                    what, nice, exc)
