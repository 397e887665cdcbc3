"""The frontend loop: one thread owns the ROUTER socket (docs/architecture.md#threads-and-processes).

It reads requests, validates them (protocol.py), admits them (router.py)
and sends the replies that executor threads leave on its doorbell
(doorbell.py). ZeroMQ sockets are not thread-safe, so only this thread
touches the ROUTER. Worker processes' replies skip even the doorbell: the
loop polls their fast lanes itself (`watch`, lane.py). The loop is given
its parts by the composition root (app.py), which also owns the lifecycle
around it: this module is the loop and nothing else.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import zmq

from infermux import config as cfg
from infermux.events import EventLog
from infermux.execution.hooks import FrontendHooks
from infermux.execution.inline import InlinePolicy
from infermux.execution.job import Job, internal_sink
from infermux.frontend import refusals
from infermux.frontend.doorbell import Barrier, Doorbell, Watched
from infermux.frontend.express import ExpressLane, express_wanted
from infermux.frontend.listen import open_regions, open_router, open_wire
from infermux.frontend.mirror import Mirror
from infermux.frontend.oversize import ClientEnvelope, OversizeMemory
from infermux.frontend.pacing import RefusalPacer
from infermux.frontend.parsecache import ParseCache
from infermux.frontend.recorder import Recorder
from infermux.frontend.router import Deferred, Router
from infermux.frontend.sender import Sender
from infermux.frontend.ticks import Ticks
from infermux.protocol import Status, encode_reply, error_header, request_id
from infermux.swap.rollout import Rollouts
from infermux.transport import ipc
from infermux.transport.curve import CurveGuard
from infermux.transport.limits import limits_from
from infermux.transport.peers import PeerGuard
from infermux.transport.regions import RegionServer, RegionTable
from infermux.transport.wire import CompiledWire, PyzmqWire, Wire, choose

__all__ = ["Server", "REFUSE_S", "limits_from"]

log = logging.getLogger("infermux.server")

BURST = 64  # messages handled per socket before looking at the other one
QUIET_MS = 50  # at shutdown: how long the socket must stay empty before it is closed
REFUSE_S = 1.0  # ... and the longest it goes on refusing requests before closing anyway
QUIESCE_S = 1.0  # the longest `quiesce` waits for the loop's turn (its bell wakes the loop at once)
_delimiter = refusals.delimiter


class Server:
    """The frontend loop: reads requests on the ROUTER, admits them, sends the replies. Its parts
    come from the composition root (app.py); the router and rollouts once they exist (`admit_with`)."""

    def __init__(self, config: cfg.Config, run_dir: Path, events: EventLog, ctx: zmq.Context,
                 curve: CurveGuard | None, peers: PeerGuard, regions: RegionTable, recorder: Recorder) -> None:
        self.config, self.run_dir, self.events, self.ctx, self.curve = config, run_dir, events, ctx, curve
        self.peers, self.regions, self.recorder = peers, regions, recorder
        self.limits = limits_from(config.daemon)
        self.endpoints = [cfg.resolve_endpoint(ep, run_dir) for ep in config.daemon.listen]
        self.barrier = Barrier(self.wake)
        self.inline = InlinePolicy(config.daemon.inline_max_us, config.daemon.inline_busy_max_us)
        self._held: dict[Any, None] = {}  # schedulers with requests queued for the end of this burst
        self._poller = zmq.Poller()
        self.watched = Watched(self._poller)  # fds polled beside the socket (workers' lanes...)
        self.router: Router  # set by admit_with, before bind
        self.rollouts: Rollouts
        self.mirror: Mirror
        self.socket: zmq.Socket | None = None
        self.wire_choice = choose()  # the frontend's socket calls: compiled or pyzmq's (wire.py)
        self.wire: Wire  # the calls on `socket`, made in bind()
        self.stopping = False
        self.draining = False  # admin `drain`: refuse new requests until `resume`
        self.loop_turns = self.requests = 0
        self.parses = ParseCache()  # a header seen before, but for its id, is not decoded again (parsecache.py)
        self.express: ExpressLane | None = None  # the fast path's requests served from C, once bound (express.py)
        self._waiting = self._others_waiting  # bound once: the inline gate asks for it on every request
        self.frontend_native_id: int | None = None  # the loop's thread, whose load the status reports
        self.oversize = OversizeMemory(config.daemon.oversize_memory_s)  # the kinds of request that just made one
        self.pacer = RefusalPacer()  # refusals held back, a connection that keeps earning them longer
        self.sender = Sender(self.limits, peers, self.pacer, self.oversize, recorder)
        self.bell = Doorbell(self.sender.send, self.pacer, self.wake)  # what other threads hand the loop
        self._outbox = self.bell.replies  # read on every request: one attribute, not two
        self.reply, self.reply_late, self.watch = self.bell.reply, self.bell.reply_late, self.bell.watch
        # What the layers below may ask of the frontend (execution/hooks.py), handed down once.
        self.hooks = FrontendHooks(reply=self.reply, on_late=self._on_late, inline=self._inline_ok, hold=self._hold,
                                   watch=self.watch, quiesce=self.quiesce)
        self.timer = Ticks()  # what runs between two turns, and how long an idle loop sleeps (ticks.py)
        self.ticks, self.dues = self.timer.ticks, self.timer.dues
        self.ticks += [self.barrier.release, recorder.expire, self.sender.send_paused]
        self.dues.append(self.pacer.next_due)
        self.region_server: RegionServer | None = None  # shared-memory inputs (regions.py), once bound
        self._lookup: RegionTable | None = None

    def admit_with(self, router: Router, rollouts: Rollouts) -> None:
        """The router that admits requests, and the rollouts whose candidates shadow them: built on
        the registry, which is built on this loop's hooks, so they come after it."""
        self.router, self.rollouts, self.mirror = router, rollouts, Mirror(rollouts)
        self.sender.mirror = self.mirror

    @property
    def replies_too_large(self) -> int:
        """Replies over max_reply_bytes, answered 413 instead."""
        return self.sender.replies_too_large

    def follow(self, daemon: cfg.DaemonConfig) -> None:
        """The request limits and settings of a reloaded configuration, from the next request on."""
        self.limits = self.sender.limits = limits_from(daemon)
        self.oversize.memory_s = daemon.oversize_memory_s

    # -- what other threads may ask (and the doorbell's reply, reply_late, watch) ----

    def admit_step(self, job: Job) -> bool:
        """Admit a pipeline's model step (pipelines/calls.py) as a client's request is, on the calling
        pipeline thread: True once admitted there (a refusal goes to the job's sink at once), False
        where it was handed to the frontend thread instead (Router.admit_step: a cold worker to start).
        Steps are admitted one at a time, beside the frontend's own admissions (docs/pipelines.md),
        and `quiesce` waits for the one under way."""
        with self.barrier.stepping:
            try:
                refused = self.router.admit_step(job)
            except Deferred:
                self.bell.admissions.append(job)
                self.bell.ring()
                return False
        if refused is not None:
            self._refuse_step(job, refused)
        return True

    @staticmethod
    def _refuse_step(job: Job, header: dict[str, Any]) -> None:
        sink = internal_sink(job.reply_to)
        assert sink is not None, "a pipeline's step replies to an Internal"
        sink.refused(header)

    def _on_late(self, job: Job) -> None:
        self.router.on_late(job)

    def _inline_ok(self, service_time_us: float, batching: bool) -> bool:
        """May the frontend thread compute this request itself? (inline.py)"""
        if threading.get_ident() != self.bell.thread or self.socket is None:
            return False
        return self.inline.allows(service_time_us, batching, self._waiting)

    def quiesce(self, timeout_s: float = QUIESCE_S) -> bool:
        """Return once the frontend has finished the admission it may be in the middle of: the
        switch's barrier (models/switch.py; Barrier.wait says how); False if it did not in time."""
        return self.barrier.wait(timeout_s, threading.get_ident() == self.bell.thread)

    def _hold(self, scheduler: Any) -> bool:
        """Keep a batched model's request for the end of this burst (inline.py); only on the frontend."""
        if threading.get_ident() != self.bell.thread:
            return False
        self._held[scheduler] = None
        return True

    def _run_held(self) -> None:
        """The burst is over: compute held batches here while nothing else waits, wake executors for the rest."""
        held, self._held = self._held, {}
        for scheduler in held:
            scheduler.run_held(self._batch_inline_ok)

    def _batch_inline_ok(self, batch_us: float, requests: int) -> bool:
        return self.inline.allows_batch(batch_us, requests, self._others_waiting())

    def _others_waiting(self) -> bool:
        """Whether more requests sit in the socket right now (what the inline limits depend on)."""
        return self.socket is not None and self.wire.waiting()

    # -- the loop's life ------------------------------------------------------

    def bind(self) -> None:
        """Bind every listen endpoint and the shared-memory regions' socket; raises RuntimeError."""
        daemon = self.config.daemon
        sock = open_router(self.ctx, daemon, self.endpoints, self.curve, self.peers, self.events)
        self.wire, self.wire_choice = open_wire(sock, self.wire_choice, self.curve, daemon)
        self.socket, self.sender.wire = sock, self.wire
        if isinstance(self.wire, CompiledWire) and express_wanted():
            self.express = ExpressLane(self.wire, self.router, self.parses, lambda: self.limits, self.sender.send,
                                       self.pacer)
        self.events.emit("wire", calls=self.wire_choice.kind, detail=self.wire_choice.describe())
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self.bell.fd, zmq.POLLIN)
        self.region_server = open_regions(daemon, self.run_dir, self.regions, self.watch, self.events)
        if self.region_server is not None:
            self.ticks.append(self.region_server.tick)
            self.dues.append(self.region_server.due)
            self._lookup = self.regions

    def serve_forever(self) -> None:
        """Run the loop until `stop()`; the root drains (`drain`) and closes it after."""
        assert self.socket is not None, "bind() first"
        self.bell.thread = threading.get_ident()
        self.frontend_native_id = threading.get_native_id()
        self.barrier.looping = True
        while not self.stopping:
            self.step()

    def stop(self) -> None:
        """Ask the loop to stop (safe from a signal handler)."""
        self.stopping = True
        self.wake()

    def wake(self) -> None:
        """Make the loop turn and run its ticks now (any thread, a signal handler too): for work a
        tick does that no socket announces."""
        self.timer.soon()
        try:
            self.bell.ring()
        except OSError:  # closed: the loop has ended
            pass

    def drain(self, deadline: float, busy: Callable[[], bool]) -> None:
        """Answer everything accepted while `busy()` (the registry closing) until `deadline`, refuse
        the rest, then stop looping."""
        while time.monotonic() < deadline and (busy() or self._outbox):
            self._turn(10, refuse=True)  # workers' lanes too: their replies finish the drain
            self.barrier.release()
        self.barrier.looping = False
        self.barrier.release()
        self._forward_replies()
        self.sender.send_paused(every=True)
        # Requests clients sent before the signal may still sit in the socket's
        # queue: refuse them too, until the socket has been quiet for a moment,
        # or for REFUSE_S at most: clients that retry every few ms never let it
        # be quiet, and the daemon must still end (systemd would SIGKILL it).
        refuse_until = time.monotonic() + REFUSE_S
        while self.socket is not None and time.monotonic() < refuse_until and self.socket.poll(QUIET_MS):
            self._read_requests(refuse=True)

    def close(self) -> None:
        """Close the socket and remove its files (the zmq context stays for others)."""
        if self.peers.drops is not None:
            self.peers.drops.closing = True  # the connections libzmq ends now are not dropped for their size
        if self.socket is not None:
            self.socket.close(linger=500)
        if self.region_server is not None:
            self.region_server.close()
        self.peers.close()
        self.bell.close()
        for endpoint in self.endpoints:
            ipc.remove(endpoint)

    def step(self) -> None:
        """One turn of the loop: wait for what is ready and handle it, then the ticks when due."""
        self._turn(self.timer.wait_ms)
        self.loop_turns += 1
        self.timer.run_if_due()
        if self._held:  # a tick may have queued requests (a worker restart)
            self._run_held()

    # -- the hot path -----------------------------------------------------------

    def _turn(self, timeout_ms: int, refuse: bool = False) -> None:
        """One wait on the sockets, then whatever became ready."""
        ready = dict(self._poller.poll(timeout_ms))
        began = time.perf_counter()
        self._on_ready(ready, refuse)
        self.rollouts.frontend.add(time.perf_counter() - began)  # what a candidate's mirroring may not take

    def _on_ready(self, ready: dict[Any, int], refuse: bool) -> None:
        """Whatever `_turn`'s wait found ready: replies to forward, watched fds, requests to read."""
        if self.bell.fd in ready:
            self._forward_replies()
        if self.watched.fds:
            self.watched.handle(ready)
        if self.socket in ready:
            self._read_requests(refuse)

    def _forward_replies(self) -> None:
        """Answer the bell: take up the fds `watch` was asked for, admit the steps handed over, send
        what the outbox holds."""
        bell = self.bell
        bell.answer()
        while bell.watches:
            self.watched.add(*bell.watches.popleft())
        while bell.admissions:
            job = bell.admissions.popleft()
            refused = self.router.admit(job)
            if refused is not None:
                self._refuse_step(job, refused)
        outbox = self._outbox
        while outbox:
            envelope, frames = outbox.popleft()
            self.sender.send(envelope + frames, envelope)

    def _read_requests(self, refuse: bool = False) -> None:
        try:
            self._read_burst(refuse)
        finally:
            if self._held:
                self._run_held()

    def _read_burst(self, refuse: bool) -> None:
        n = 0
        while n < BURST:
            if self.express is not None and self._express_open(refuse):
                served, message = self._express_run(n)
                if served < 0:
                    return
                n += served
                if message is None:
                    if self._express_done(served):
                        return
                    continue
                frames, fd = message
            else:
                if n and not self._others_waiting():  # asked, not tried (waiting.py)
                    return
                try:
                    frames, fd = self.wire.recv()
                except zmq.Again:  # the poll's readiness can be stale
                    return
            n += 1
            self._general(frames, fd, refuse)

    def _express_run(self, n: int) -> tuple[int, tuple[list[Any], int] | None]:
        """The express lane's run over what is left of the burst: requests served, and the message it
        left for the general path (None if none); -1 served if its socket calls failed."""
        assert self.express is not None
        try:
            served, message = self.express.run(BURST - n, 0 if n else 1, self._outbox, self.peers.hear_fd,
                                               self.peers.dropped)
        except Exception:  # the socket's own failure (the callback answers its errors): as Sender.send's
            log.exception("internal error in the express lane's socket calls")
            return -1, None
        self.requests += served
        return served, message

    def _express_done(self, served: int) -> bool:
        """The lane stopped with no message: nothing waits, its budget is spent, a reply waits or a
        peer stalled. Send what waits; whether the burst is over."""
        forwarded = bool(self._outbox)
        if forwarded:
            self._forward_replies()
        return not served or not (forwarded or self.peers.stalled)

    def _general(self, frames: list[Any], fd: int, refuse: bool) -> None:
        """A message down the general path: `_handle`, whose failure is a 500, not the loop's end."""
        self.peers.hear_fd(fd)  # this connection speaks: never closed as idle
        self.requests += 1
        if self._outbox:  # executors' replies go out between requests, not after the whole burst
            self._forward_replies()
        try:
            self._handle(frames, refuse or self.draining)
        except Exception:  # a request must never take the frontend (and the daemon) down
            log.exception("internal error on a request; answered 500")
            split = _delimiter(frames)
            header = error_header(Status.BACKEND_ERROR, "internal error in infermux (logged)",
                                  request_id(frames[split:], self.limits))
            self.sender.send(frames[:split] + encode_reply(header))

    def _express_open(self, refuse: bool) -> bool:
        """Whether the express lane may take this burst's requests (express.py): nothing that the
        general path does for every request is pending."""
        self.parses.check_limits(self.limits)
        return not (refuse or self.draining or self.stopping or self.peers.stalled or self.recorder.active
                    or self.rollouts.by_model or self.oversize or self._outbox)

    def _handle(self, frames: list[Any], refuse: bool) -> None:
        received = time.perf_counter_ns()
        split = _delimiter(frames)
        envelope, body = ClientEnvelope(frames[:split]), frames[split:]
        envelope.user = self.wire.user_id if type(self.wire) is PyzmqWire and self.wire.identities else None
        if (self.peers.stalled or refuse) and refusals.unserved(self.sender, envelope, body, refuse, self.stopping):
            return
        request = refusals.parsed(self.sender, self.parses, self._lookup, envelope, body)
        if request is None:
            return
        envelope.came_with(request)
        if self.oversize and refusals.oversized(self.sender, envelope, request):
            return
        if self.recorder.active:  # before admission: an inline answer is sent inside it
            self.recorder.on_request(envelope, request)
        if self.rollouts.by_model:  # a candidate shadows this model (swap/rollout.py)
            self.mirror.on_request(envelope, request)
        job = Job(envelope, request, frames, received, deadline_ns=0)  # the router sets the deadline
        try:
            if self.router.admit_fast(job, self.parses.layout):  # computed and answered: nothing needed deciding
                return
            refused = self.router.admit(job)  # None: admitted; else the error reply
        except Exception:
            job.answered(int(Status.BACKEND_ERROR))  # the 500 the burst's handler sends (_general)
            raise
        if refused is not None:
            self.sender.send(envelope + encode_reply(refused))


if sys.platform != "linux":  # pragma: no cover
    log.warning("infermux is developed and tested on Linux only")
