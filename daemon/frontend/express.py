"""The express lane: the fast path's requests received, looked up and answered from C.

At concurrency 64 one thread, the frontend's, caps the daemon's QPS: it
computes each small request itself, and the Python around the backend's
call (receiving each message, its envelope, the parse, the `Job`, the
router's and executor's steps, the reply's trip through `Server.reply`)
cost as much again as the call (docs/performance.md). This lane takes the
requests that the fast path would take, read from a known header layout
(parsecache.py), and does the rest of that work once:

- in C (`_wire.serve`), for a burst of messages while the socket has
  one: receive, find the envelope's end, cut the header's plain id out and
  look the rest up in the parse cache's table of express layouts, check
  each tensor frame's size; then one call into Python, `ExpressLane.serve`,
  and the reply it returns sent, to the envelope the request came with;
- in Python, per request: what the fast path asks (Router.idle: the
  version and the idle context its placement offers) and the tensors
  accepted for the layout and engine, the compute and its reply
  (Executor.compute of a `Bare` request), with no `Job`; its statistics
  and estimates are kept and folded once the burst ends (Executor.settle;
  a statistics reading folds them first, so it never misses a reply
  already sent).

Anything else goes down the general path, unchanged and in order: a
message the table has no entry for (the first two of a layout, shared
memory, a version or a stream key asked for) or whose frames do not fit
it, and a request that something about needs deciding (the lane's
callback returns None before doing anything). The burst itself runs only
when nothing the general path would do for every request is pending
(`Server._express_open`): no drain or stop, no stalled peer, the recorder
off, no candidate mirrored, no oversize kind remembered, no reply waiting
in the outbox; and it stops when a reply is dropped for a full pipe (that
peer is stalled from then on).

The lane needs the compiled socket calls (wire.py): with pyzmq's calls
(INFERMUX_WIRE=python), or with INFERMUX_EXPRESS=off, the fast path runs
in Python as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Callable, cast

import numpy as np

from infermux.execution.executor import Bare, Executor
from infermux.execution.job import Envelope, Job
from infermux.frontend.oversize import ClientEnvelope
from infermux.frontend.pacing import RefusalPacer
from infermux.frontend.parsecache import Layout, ParseCache, fill, id_value
from infermux.frontend.router import Router
from infermux.models.version import ModelVersion
from infermux.protocol import Limits, Status, encode_reply, error_header
from infermux.transport.wire import CompiledWire

log = logging.getLogger("infermux.server")  # the frontend's log: its errors read as the general path's
ENV = "INFERMUX_EXPRESS"  # "off": every request down the general path (to rule the lane out)

# A reply the lane sends itself is under this size: a larger one goes through the frontend's
# `_send`, which may answer 413 in its place (max_reply_bytes) or send it without a copy.
COPY_LIMIT = 1 << 20
MAX_REPLY_FRAMES = 64 - 9  # the C send's frames, less the longest envelope (server.MAX_ENVELOPE + delimiter)


def express_wanted() -> bool:
    """Whether the environment leaves the lane on (INFERMUX_EXPRESS=off turns it off)."""
    return os.environ.get(ENV, "").strip().lower() != "off"


class ExpressLane:
    """One frontend's express lane, on its socket's compiled calls."""

    def __init__(self, wire: CompiledWire, router: Router, parses: ParseCache, limits: Callable[[], Limits],
                 send: Callable[[list[Any], list[Any] | None], None], pacer: RefusalPacer) -> None:
        self._wire = wire
        self.router, self.parses, self._limits, self._send = router, parses, limits, send
        self._pacer = pacer  # a computed request's reply: its connection's refusals start over (pacing.py)
        self._forgiving = False  # whether the pacer remembers a refusal, read once a burst
        self.served = 0  # requests answered by the lane
        self._room = 0  # the largest reply the lane sends itself, read from the limits once a burst
        # The contexts this burst computed on and their versions, settled and marked used after it.
        self._computed: dict[Executor, ModelVersion] = {}
        # What each request asks a context to compute: one record, filled per request (cheaper than
        # a new one, and safe: the lane serves one request at a time, and `compute` keeps none of it),
        # emptied once a burst so that it holds no request's frames after it.
        self._work = Bare({}, 1, None, None, 0, _no_job)

    def run(self, budget: int, asked: int, outbox: deque[Any], hear: Callable[[int], None],
            dropped: Callable[[Any], None]) -> tuple[int, tuple[list[Any], int] | None]:
        """Serve up to `budget` messages (the first `asked` received without asking whether one
        waits) while `outbox` is empty; returns how many were served, and the message the lane
        did not take, as (frames, fd), for the general path (None: no message waits, the budget
        is spent or a reply waits in the outbox). The statistics and estimates of what it
        computed are settled, and its versions marked used, before it returns (Executor.settle)."""
        # Within max_reply_bytes, and small enough to copy: a config reload changes it between bursts.
        self._room = min(COPY_LIMIT - 1024, self._limits().max_reply_bytes)
        self._forgiving = self._pacer.remembers()  # only the general path's refusals add to it
        try:
            served, message = self._wire.serve(self.parses.express, self.serve, hear, dropped, outbox, budget, asked)
        finally:
            now = time.monotonic()
            for executor, mv in self._computed.items():
                executor.settle()
                mv.last_used = now
            self._computed.clear()
            self._work.inputs, self._work.job_of = {}, _no_job
        self.served += served
        return served, message

    def serve(self, layout: Layout, ident: bytes | None, frames: list[Any], split: int) -> list[Any] | bool | None:
        """One request read from `layout` (called from C): the reply's [header, outputs...] to send,
        True where it was answered here, None (nothing done) where the general path must take it."""
        try:
            received = time.perf_counter_ns()
            rows = layout.rows
            fast = self.router.idle(layout.model, rows)
            if fast is None or not self.router.accepts(layout, fast[0]):
                return None
            mv, executor = fast
            # The array's own constructor over the frame: cheaper than frombuffer-and-reshape.
            inputs = {spec.name: np.ndarray(spec.shape, spec.dtype, frame)
                      for spec, frame in zip(layout.inputs, frames[split + 1:])}

            def job_of() -> Job:  # where the general path's reply answers it: a failure, a rare encoding
                return self._job(layout, ident, frames, split, received, mv.config.timeout_ms)

            work = self._work
            work.inputs, work.rows, work.id, work.asked, work.received_ns, work.job_of = \
                inputs, rows, id_value(ident), layout.outputs, received, job_of
            answer = executor.compute(work)
            if answer is None:
                return None
            self._computed[executor] = mv
            if self._forgiving:
                self._pacer.forgive(frames[0])
            if isinstance(answer, bool) or (sum(map(len, answer)) <= self._room and len(answer) <= MAX_REPLY_FRAMES):
                return answer
            envelope = cast(Envelope, job_of().reply_to)  # the lane's Job is a client's (_job)
            self._send(envelope + answer, envelope)  # 413 in its place if over max_reply_bytes, remembered by its kind
            self._forgiving = self._pacer.remembers()
            return True
        except Exception:  # as the general path: a request must never take the frontend down
            log.exception("internal error on a request; answered 500")
            header = error_header(Status.BACKEND_ERROR, "internal error in infermux (logged)", id_value(ident))
            return encode_reply(header)

    def _job(self, layout: Layout, ident: bytes | None, frames: list[Any], split: int, received: int,
             timeout_ms: int) -> Job:
        """The Job the general path would have made of this request."""
        request = fill(layout, ident, frames[split:], self._limits())
        assert request is not None, "the lane checked the frames against the layout"
        envelope = ClientEnvelope(frames[:split])
        envelope.came_with(request)
        deadline = received + (request.timeout_ms or timeout_ms) * 1_000_000
        return Job(envelope, request, frames, received, deadline_ns=deadline)


def _no_job() -> Job:
    """The lane's work record between bursts: no request, so no Job to make."""
    raise AssertionError("the lane's work record holds no request between bursts")
