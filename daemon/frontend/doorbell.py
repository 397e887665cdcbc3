"""What other threads hand the frontend thread, and the eventfd that wakes its loop for it.

Replies come back through a deque plus an eventfd doorbell rather than an
inproc PUSH/PULL pair: the socket hop cost several times the GIL time per
request of a deque append and an eventfd write (docs/decisions.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable, cast

import zmq

from infermux.execution.job import Envelope, Job, Outcome, ReplyTo, internal_sink
from infermux.frontend.pacing import RefusalPacer

log = logging.getLogger("infermux.server")


class Doorbell:
    """The frontend thread's door for the others: the replies they send (executor.ReplyFn), the fds
    they ask it to poll, pipelines' steps to admit, and the eventfd each of them rings; the loop
    polls `fd` beside its socket. On the frontend thread itself a reply is sent at once."""

    def __init__(self, send: Callable[[list[Any], list[Any] | None], None], pacer: RefusalPacer,
                 wake: Callable[[], None]) -> None:
        self.send, self.pacer, self.wake = send, pacer, wake
        self.thread = threading.get_ident()  # the frontend thread's, once its loop runs
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.replies: deque[tuple[list[Any], list[Any]]] = deque()  # (envelope, frames) from other threads
        self.watches: deque[tuple[int, Callable[[], bool]]] = deque()  # fd -> on_ready, for the loop to poll
        self.admissions: deque[Job] = deque()  # pipelines' model steps the frontend admits (admit_step)

    def reply(self, to: ReplyTo, frames: list[Any], outcome: Outcome | None = None) -> None:
        """Send a reply: directly on the frontend thread, else through the queue; an internal
        request's (a pipeline step's) goes to its sink instead (job.Internal)."""
        sink = internal_sink(to)
        if sink is not None:
            sink.deliver(frames, outcome)
            return
        envelope: Envelope = to  # type: ignore[assignment]  # the frontend's requests are its clients' or internal
        if threading.get_ident() == self.thread:
            self.send(envelope + frames, envelope)
            return
        self.replies.append((envelope, frames))
        os.eventfd_write(self.fd, 1)

    def reply_late(self, to: ReplyTo, frames: list[Any], outcome: Outcome | None = None) -> None:
        """`reply`, held back (pacing.py): for a refusal the client can only meet by sending something
        else (a pipeline's 400 or 413 after its steps ran), so that a client looping on it cannot keep
        the steps busy. Safe from any thread: the loop's tick sends it."""
        if internal_sink(to) is not None:
            self.reply(to, frames, outcome)
            return
        self.pacer.hold_later(cast(Envelope, to) + frames)
        self.wake()  # the loop may be asleep: its next tick sends it

    def watch(self, fd: int, on_ready: Callable[[], bool]) -> None:
        """Call `on_ready()` on the frontend thread whenever `fd` is readable, until it returns
        False (then the fd is forgotten). Safe from any thread; takes effect at the next turn."""
        self.watches.append((fd, on_ready))
        self.ring()

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


class Watched:
    """The fds the loop polls beside its socket (workers' lanes, the regions' connections), each
    with the callable that reads it on the frontend thread until it returns False."""

    def __init__(self, poller: zmq.Poller) -> None:
        self.poller = poller
        self.fds: dict[int, Callable[[], bool]] = {}

    def add(self, fd: int, on_ready: Callable[[], bool]) -> None:
        self.fds[fd] = on_ready
        self.poller.register(fd, zmq.POLLIN)

    def handle(self, ready: dict[Any, int]) -> None:
        """Call the reader of each ready fd; forget those that are done, or failed."""
        fds = self.fds
        for fd in ready:
            on_ready = fds.get(fd)
            if on_ready is not None and not _still_watching(on_ready):
                del fds[fd]
                self.poller.unregister(fd)


def _still_watching(on_ready: Callable[[], bool]) -> bool:
    try:
        return on_ready()
    except Exception:  # a watcher's bug must not take the frontend (and the daemon) down
        log.exception("internal error reading a worker's lane; no longer watching it")
        return False
