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

RENICE_ROUNDS = 8  # looks at a process's threads at most: one that makes threads without end is not waited on


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


def lower_process(pid: int, nice: int, what: str) -> None:
    """Every thread of process `pid` at the daemon's nice value plus `nice` (capped at 19): a cold version's
    worker, before its engine loads, so that the threads its session makes later inherit the value."""
    if nice <= 0:
        return
    target = min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, os.getpid()) + nice)
    done: set[int] = set()
    for _ in range(RENICE_ROUNDS):  # again until no new thread shows: one made meanwhile took its maker's old value
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")} - done
        except OSError:
            tids = {pid} - done  # no /proc: its main thread at least
        if not tids:
            return
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, target)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
            except OSError as exc:
                log.warning("cannot lower the priority of %s (nice = %d): %s; it runs at the daemon's",
                            what, nice, exc)
                return
        done |= tids
