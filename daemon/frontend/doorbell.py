"""What other threads hand the frontend thread, and the eventfd that wakes its loop for it.

Replies come back through a deque plus an eventfd doorbell rather than an
inproc PUSH/PULL pair: the socket hop cost several times the GIL time per
request of a deque append and an eventfd write (docs/decisions.md).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any, Callable

from infermux.execution.job import Job


class Doorbell:
    """The queues other threads fill for the frontend thread (replies, fds to poll, pipelines' steps to
    admit) and the eventfd each of them rings; the loop polls `fd` beside its socket."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.replies: deque[tuple[list[Any], list[Any]]] = deque()  # (envelope, frames) from other threads
        self.watches: deque[tuple[int, Callable[[], bool]]] = deque()  # fd -> on_ready, for the loop to poll
        self.admissions: deque[Job] = deque()  # pipelines' model steps the frontend admits (admit_step)

    def ring(self) -> None:
        """Wake the loop (any thread, a signal handler too); raises OSError once closed."""
        os.eventfd_write(self.fd, 1)

    def answer(self) -> None:
        """The loop heard the bell: reset it before taking what the queues hold."""
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)


class Barrier:
    """The frontend's `quiesce` (execution/hooks.py): wait until the admission the frontend may be in
    the middle of is done. Waiters are released by the loop's tick, between two turns."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        # Pipelines' model steps admitted on their own threads: one at a time, and `wait` waits for it.
        self.stepping = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self.looping = False  # the loop runs (or drains): only then can an admission be in progress

    def wait(self, timeout_s: float, on_frontend: bool) -> bool:
        """Return once a step being admitted on its own thread is done and, off the frontend thread,
        once the loop has turned; False if either did not happen within `timeout_s`.

        The router reads a version's placement and submits to it within one turn of the loop,
        so what was taken out of the routing tables before this call is out of every
        admission's reach once it returns: the switch's barrier (models/switch.py), and the
        one way anything waits for the frontend to let go. A pipeline's step admitted on its own
        thread (Server.admit_step) is waited for first, wherever this is called; then it returns
        at once on the frontend thread (it is between admissions there) and while the loop does
        not run.

        The router's admissions of steps take `stepping`, one at a time; the frontend's own go on
        beside them, as executors' fallbacks of late requests (Router.on_late) always did: what
        they share is a placement's queues, which are thread-safe, and its depth bound, which two
        admissions side by side may pass by one.
        """
        began = time.monotonic()
        if self.stepping.acquire(timeout=timeout_s):  # a pipeline's step being admitted (admit_step)
            self.stepping.release()
        else:
            return False
        if not self.looping or on_frontend:
            return True
        done = threading.Event()
        self._waiting.append(done)
        self._wake()  # an idle loop sleeps: wake it for the tick that releases us
        return done.wait(max(0.0, timeout_s - (time.monotonic() - began)))

    def release(self) -> None:
        """A tick, between two turns of the loop: every admission begun before is done."""
        waiting = self._waiting
        while waiting:
            waiting.popleft().set()
