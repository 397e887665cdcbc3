"""The frontend: one thread owns the ROUTER socket (docs/architecture.md#threads-and-processes).

It reads requests, validates them (protocol.py), admits them (router.py)
and sends the replies that executor threads leave in its outbox. ZeroMQ
sockets are not thread-safe, so only this thread touches the ROUTER.

Replies come back through a deque plus an eventfd doorbell rather than
the inproc PUSH/PULL pair first designed: the socket hop cost several times
the GIL time per request of a deque append and an eventfd write (the
figures: docs/decisions.md). Worker processes' replies skip even that:
the loop polls their fast lanes itself (`watch`, lane.py).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import sys
from collections import deque
import threading
import time
from pathlib import Path
from typing import Any, Callable, cast

import zmq

from infermux import config as cfg
from infermux.config import HOT
from infermux.transport import curve, ipc
from infermux.transport.peers import PeerGuard
from infermux.transport.wire import Choice, CompiledWire, PyzmqWire, Wire, choose, wire_for
from infermux.events import EventLog, Throttle
from infermux.execution.hooks import FrontendHooks
from infermux.execution.inline import InlinePolicy
from infermux.execution.job import Envelope, Job, Outcome, ReplyTo, internal_sink
from infermux.execution.streams import StreamTable
from infermux.protocol import (OPERATOR_RETRY_MS, ProtocolError, Request, Status, encode_reply, error_header,
                               limits_reply, request_id)
from infermux.transport.regions import RegionServer, RegionTable
from infermux.models.overrides import Overrides
from infermux.models.registry import Registry, State
from infermux.models.statefile import StateFile
from infermux.models.verdicts import Decisions
from infermux.models.verified import EngineSigning, Sequences, verified_store
from infermux.frontend.express import ExpressLane, express_wanted
from infermux.frontend.mirror import Mirror
from infermux.frontend.oversize import ClientEnvelope, OversizeMemory
from infermux.frontend.pacing import RefusalPacer
from infermux.frontend.parsecache import ParseCache
from infermux.frontend.recorder import Recorder
from infermux.frontend.router import Deferred, Router
from infermux.pipelines import warmshapes
from infermux.pipelines.runner import Pipelines
from infermux.transport.curve import CurveError
from infermux.transport.limits import frame_cap, limits_from
from infermux.swap import reload
from infermux.swap.rollout import Rollouts
from infermux.swap.reload import ReloadPlan
from infermux.workers.pool import Workers

log = logging.getLogger("infermux.server")

MAX_ENVELOPE = 8  # identity frames a proxy chain may add before the delimiter
BURST = 64  # messages handled per socket before looking at the other one
QUIET_MS = 50  # at shutdown: how long the socket must stay empty before it is closed
REFUSE_S = 1.0  # ... and the longest it goes on refusing requests before closing anyway
STALLED_RETRY_MS = 100  # the retry time in the 429 a peer gets while its replies are dropped (peers.py)
_TOO_LARGE = Throttle()  # replies over max_reply_bytes: a few lines per interval, then counted
_REFUSED_OVERSIZE = Throttle()  # requests refused uncomputed for such a reply: the same
# ... and their 413 is held back (pacing.py), as is the refusal of a malformed message this large: a
# client looping on one (40 frames of 1 MB) made libzmq's I/O thread read 40 MB tens of times a second.
PACED_REFUSAL_BYTES = 1 << 20
# A refused header this large is held back too: 60 KB keys in a loop kept the frontend thread parsing.
PACED_REFUSAL_HEADER_BYTES = 16 << 10
QUIESCE_S = 1.0  # the longest `quiesce` waits for the loop's turn (its bell wakes the loop at once)
# Under load the loop turns once a request at concurrency 1; its ticks (watchdog, barriers, paused
# refusals, silent streams...) cost ~3 µs a turn together, and none needs to run more often than this.
TICK_S = 0.002


class Server:
    """The daemon's serving core: registry, router and the frontend loop."""

    def __init__(self, config: cfg.Config, run_dir: Path, state_dir: Path | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.state_dir = state_dir
        self.events = EventLog()
        self.limits = limits_from(config.daemon)
        self.ctx = zmq.Context()
        self.curve = curve.CurveGuard.from_config(config.daemon, self.ctx, self.events)
        self.endpoints = [cfg.resolve_endpoint(ep, run_dir) for ep in config.daemon.listen]
        self._outbox: deque[tuple[list[Any], list[Any]]] = deque()  # (envelope, frames) from other threads
        self._bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.inline = InlinePolicy(config.daemon.inline_max_us, config.daemon.inline_busy_max_us)
        self._held: dict[Any, None] = {}  # schedulers with requests queued for the end of this burst
        self._poller = zmq.Poller()
        self._watched: dict[int, Callable[[], bool]] = {}  # fd -> on_ready, polled by the loop
        self._to_watch: deque[tuple[int, Callable[[], bool]]] = deque()  # from other threads
        self._barriers: deque[threading.Event] = deque()  # quiesce(): released between two turns
        self._looping = False  # the loop runs (or drains): only then can an admission be in progress
        # What the layers below may ask of the frontend (execution/hooks.py), handed down once.
        self.hooks = FrontendHooks(reply=self.reply, on_late=self._on_late, inline=self._inline_ok, hold=self._hold,
                                   watch=self.watch, quiesce=self.quiesce)
        # Operators' live changes: kept in `state_dir` across restarts (models/statefile.py), else in memory.
        self.registry = Registry(config, self.events, self.hooks, _overrides(state_dir, self.events, config))
        self.registry.warm_shapes = lambda name: warmshapes.for_model(self.registry.config, name)
        daemon = config.daemon
        self.streams = StreamTable(self.events, daemon.stream_silent_s, daemon.stream_max_keys)
        self.router = Router(self.registry, config, self.reply, self.streams)
        self._admissions: deque[Job] = deque()  # pipelines' model steps the frontend admits (admit_step)
        # Pipelines' model steps admitted on their own threads: one at a time, and `quiesce` waits for it.
        self._stepping = threading.Lock()
        self.pipelines = Pipelines(config.pipelines, self.admit_step, self.reply, self.reply_late,
                                   self._model_inputs, self.limits)
        self.router.pipelines = self.pipelines.by_name
        self.frontend: zmq.Socket | None = None
        self.wire_choice = choose()  # the frontend's socket calls: compiled or pyzmq's (wire.py)
        self.wire: Wire  # the calls on `frontend`, made in bind()
        self.stopping = False
        self.draining = False  # admin `drain`: refuse new requests until `resume`
        self._reload_lock = threading.Lock()
        self.started = time.time()
        self.loop_turns = 0
        self.requests = 0
        self.replies_too_large = 0  # replies over max_reply_bytes, answered 413 instead
        self.parses = ParseCache()  # a header seen before, but for its id, is not decoded again (parsecache.py)
        self.express: ExpressLane | None = None  # the fast path's requests served from C, once bound (express.py)
        self._waiting = self._others_waiting  # bound once: the inline gate asks for it on every request
        self.frontend_native_id: int | None = None  # the loop's thread, whose load the status reports
        self.oversize = OversizeMemory(config.daemon.oversize_memory_s)  # the kinds of request that just made one (oversize.py)
        self.pacer = RefusalPacer()  # refusals held back, a connection that keeps earning them longer
        self.ticks: list[Callable[[], None]] = [self._release_barriers]
        # How soon each tick must run again, in seconds from `now` (None: not until something wakes
        # the loop): an idle loop sleeps until the nearest, so it wakes for due work only.
        self.dues: list[Callable[[float], float | None]] = [self._pacer_due]
        self.on_stopping: list[Callable[[], object]] = []  # called once the loop stops, before the drain
        self.poll_ms = 1000  # the longest the loop sleeps: ticks (liveness) run at least this often
        self._wait_ms = 0  # how long the next turn may sleep: the nearest due, at most poll_ms
        self._next_tick = 0.0  # ... and, under load, not before this (TICK_S)
        self._frontend_thread = threading.get_ident()
        # Inputs that local clients leave in shared memory (regions.py); bound in bind().
        self.regions = RegionTable()
        self.region_server: RegionServer | None = None
        self._lookup: RegionTable | None = None
        # Connections the ROUTER takes, and replies dropped for peers that do not read (peers.py).
        self.peers = PeerGuard(config.daemon.max_connections, config.daemon.reserved_fds)
        self.peers.watch_drops(frame_cap(config.daemon))  # connections libzmq drops for a frame over it
        # Cold models run in worker processes: the pool is the registry's cold placer (workers/pool.py).
        self.workers = Workers(self.registry, run_dir, self.hooks, self.regions)
        self.ticks.append(self.streams.check)  # a stream that went silent: an event
        self.dues.append(self.streams.due)
        self.recorder = Recorder()  # `infermux record`: requests and answers of a model, copied as they pass
        # Candidates shadowing live requests; their verdicts kept in `state_dir` too (models/verdicts.py).
        self.rollouts = Rollouts(self.registry, self.events, Decisions(state_dir, self.events))
        self.mirror = Mirror(self.rollouts)
        self.ticks.append(self.recorder.expire)
        self.ticks.append(self._send_paused)
        self.registry.signing = self.engine_signing(config.daemon)  # before any load: none escapes the check

    def engine_signing(self, daemon: cfg.DaemonConfig) -> EngineSigning | None:
        """The check of engines' signatures under `engine_signing_keys` (models/verified.py), None
        without; its store of verified copies is made afresh. Raises ValueError or OSError for a key
        that cannot be read (config.py read each already)."""
        if not daemon.engine_signing_keys:
            return None
        current = self.registry.signing
        store = current.store if current is not None else verified_store(self.run_dir)
        sequences = current.sequences if current is not None else Sequences(
            self.state_dir / "signatures.json" if self.state_dir is not None else None)
        signing = EngineSigning.from_files(daemon.engine_signing_keys, store, sequences)
        if current is None:
            signing.prepare()
        return signing

    # -- replies from any thread -------------------------------------------

    def reply(self, to: ReplyTo, frames: list[Any], outcome: Outcome | None = None) -> None:
        """Send a reply: directly on the frontend thread, else through the outbox (executor.ReplyFn);
        an internal request's (a pipeline step's) goes to its sink instead (job.Internal)."""
        sink = internal_sink(to)
        if sink is not None:
            sink.deliver(frames, outcome)
            return
        envelope: Envelope = to  # type: ignore[assignment]  # the frontend's requests are its clients' or internal
        if threading.get_ident() == self._frontend_thread:
            self._send(envelope + frames, envelope)
            return
        self._outbox.append((envelope, frames))
        os.eventfd_write(self._bell, 1)

    def reply_late(self, to: ReplyTo, frames: list[Any], outcome: Outcome | None = None) -> None:
        """`reply`, held back (pacing.py): for a refusal the client can only meet by sending something
        else (a pipeline's 400 or 413 after its steps ran), so that a client looping on it cannot keep
        the steps busy. Safe from any thread: the frontend's tick sends it."""
        if internal_sink(to) is not None:
            self.reply(to, frames, outcome)
            return
        self.pacer.hold_later(cast(Envelope, to) + frames)
        self.wake()  # the loop may be asleep: its next tick sends it

    def admit_step(self, job: Job) -> bool:
        """Admit a pipeline's model step (pipelines/calls.py) as a client's request is, on the calling
        pipeline thread: True once admitted there (a refusal goes to the job's sink at once), False
        where it was handed to the frontend thread instead (Router.admit_step: a cold worker to start).

        The router's admissions of steps take `_stepping`, one at a time; the frontend's own go on
        beside them, as executors' fallbacks of late requests (Router.on_late) always did: what they
        share is a placement's queues, which are thread-safe, and its depth bound, which two admissions
        side by side may pass by one. `quiesce` waits for the step being admitted too."""
        with self._stepping:
            try:
                refused = self.router.admit_step(job)
            except Deferred:
                self._admissions.append(job)
                os.eventfd_write(self._bell, 1)
                return False
        if refused is not None:
            self._refuse_step(job, refused)
        return True

    @staticmethod
    def _refuse_step(job: Job, header: dict[str, Any]) -> None:
        sink = internal_sink(job.reply_to)
        assert sink is not None, "a pipeline's step replies to an Internal"
        sink.refused(header)

    def watch(self, fd: int, on_ready: Callable[[], bool]) -> None:
        """Call `on_ready()` on the frontend thread whenever `fd` is readable, until it returns
        False (then the fd is forgotten). Safe from any thread; takes effect at the next turn."""
        self._to_watch.append((fd, on_ready))
        os.eventfd_write(self._bell, 1)

    def _model_inputs(self, name: str) -> list[str] | None:
        """The input names of model `name`'s default version, None while it is not loaded (pipelines:
        their step's tensor then goes unnamed, and the router names it after the version it chooses)."""
        model = self.registry.model(name)
        mv = model.default() if model is not None else None
        engine = mv.engine if mv is not None else None
        return [s.name for s in engine.inputs] if engine is not None else None

    def _on_late(self, job: Job) -> None:
        self.router.on_late(job)

    def _inline_ok(self, service_time_us: float, batching: bool) -> bool:
        """May the frontend thread compute this request itself? (inline.py)"""
        if threading.get_ident() != self._frontend_thread or self.frontend is None:
            return False
        return self.inline.allows(service_time_us, batching, self._waiting)

    def quiesce(self, timeout_s: float = QUIESCE_S) -> bool:
        """Return once the frontend has finished the admission it may be in the middle of.

        The router reads a version's placement and submits to it within one turn of the loop,
        so what was taken out of the routing tables before this call is out of every
        admission's reach once it returns: the switch's barrier (models/switch.py), and the
        one way anything waits for the frontend to let go. A pipeline's step admitted on its own
        thread (admit_step) is waited for first, wherever this is called; then it returns at once
        on the frontend thread (it is between admissions there) and while the loop does not run;
        False if the step's admission or the loop's turn did not finish within `timeout_s`.
        """
        began = time.monotonic()
        if self._stepping.acquire(timeout=timeout_s):  # a pipeline's step being admitted (admit_step)
            self._stepping.release()
        else:
            return False
        if not self._looping or threading.get_ident() == self._frontend_thread:
            return True
        done = threading.Event()
        self._barriers.append(done)
        self.wake()  # an idle loop sleeps: wake it for the tick that releases us
        return done.wait(max(0.0, timeout_s - (time.monotonic() - began)))

    def _release_barriers(self) -> None:
        """A tick, between two turns of the loop: every admission begun before is done."""
        barriers = self._barriers
        while barriers:
            barriers.popleft().set()

    def _hold(self, scheduler: Any) -> bool:
        """Keep a batched model's request for the end of this burst (inline.py); only on the frontend."""
        if threading.get_ident() != self._frontend_thread:
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
        return self.frontend is not None and self.wire.waiting()

    # -- lifecycle -----------------------------------------------------------

    def bind(self) -> None:
        """Create the runtime directory and bind every listen endpoint."""
        if self.curve is not None:
            self.curve.start()  # before any bind: without a ZAP handler libzmq admits every key
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full pipe says EAGAIN (we drop), a gone peer EHOSTUNREACH
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.MAXMSGSIZE, frame_cap(self.config.daemon))  # per frame: limits.py
        sock.setsockopt(zmq.RCVHWM, 10000)
        sock.setsockopt(zmq.SNDHWM, 1000)
        self.peers.attach(self.ctx, sock)  # before bind: every accept (its own thread: peers.py)
        for endpoint in self.endpoints:
            ipc.prepare(endpoint)
            curve.secure_listener(sock, endpoint, self.curve, self.events)
            try:
                with ipc.private_files():
                    sock.bind(endpoint)
            except zmq.ZMQError as exc:
                sock.close(0)
                raise RuntimeError(f"cannot listen on {endpoint}: {exc}; is another infermux running, "
                                   f"or is the directory not writable? (see --runtime-dir)") from None
            ipc.secure(endpoint)
            self.events.emit("listening", endpoint=endpoint)
        identities = self.curve is not None and self.config.daemon.stream_keys == "bound"
        if identities:  # a key is held by the CURVE client's key, which only pyzmq's calls read off a message
            self.wire_choice = Choice(False, 'stream_keys = "bound" with CURVE reads each message\'s client key',
                                      chosen=True)
        self.frontend, self.wire = sock, wire_for(sock, self.wire_choice)
        if isinstance(self.wire, PyzmqWire):
            self.wire.identities = identities
        if isinstance(self.wire, CompiledWire) and express_wanted():
            self.express = ExpressLane(self.wire, self.router, self.parses, lambda: self.limits, self._send,
                                       self.pacer)
        self.events.emit("wire", calls=self.wire_choice.kind, detail=self.wire_choice.describe())
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._bell, zmq.POLLIN)
        self._bind_regions()

    def _bind_regions(self) -> None:
        path = cfg.regions_path(self.config.daemon, self.run_dir)
        if path is None:
            return
        try:
            ipc.prepare(f"ipc://{path}")
            self.region_server = RegionServer(path, self.regions, self.watch, self.events)
        except OSError as exc:
            raise RuntimeError(f"cannot listen for shared-memory regions on {path}: {exc}; "
                               "set [daemon] shared_memory to another name, or \"\" to turn it off") from None
        self.ticks.append(self.region_server.tick)
        self.dues.append(self.region_server.due)
        self._lookup = self.regions
        self.events.emit("listening", endpoint=f"unix://{path}", what="shared-memory regions")

    def start_models(self, done: Callable[[], None] | None = None) -> threading.Thread:
        """Load every configured hot model in the background (requests get 503 meanwhile)."""
        hot = [mv for mv in self.registry.all_versions()
               if (mv.config.placement == HOT or mv.config.preload) and mv.state is State.UNLOADED]
        return self.registry.start_loading(hot, done)

    def serve_forever(self) -> None:
        """Run the frontend loop until `stop()`; then drain and close."""
        assert self.frontend is not None, "bind() first"
        self._frontend_thread = threading.get_ident()
        self.frontend_native_id = threading.get_native_id()
        self._looping = True
        while not self.stopping:
            self.step()
        for hook in self.on_stopping:
            hook()
        self._drain()

    def stop(self) -> None:
        """Ask the loop to stop (safe from a signal handler)."""
        self.stopping = True
        self.wake()

    def wake(self) -> None:
        """Make the loop turn and run its ticks now (any thread, a signal handler too): for work a
        tick does that no socket announces."""
        self._next_tick = 0.0
        try:
            os.eventfd_write(self._bell, 1)
        except OSError:  # closed: the loop has ended
            pass

    def reload(self) -> ReloadPlan:
        """Apply the configuration file again, one reload at a time: SIGHUP (admin/supervisor.py)
        and the admin `reload` command both come here. Returns what changed; a file that does not
        validate raises ConfigError and changes nothing (a `rejected` event says why)."""
        with self._reload_lock:
            self.events.emit("reloading", config=str(self.config.path))
            try:
                new = cfg.load(self.config.path)
            except cfg.ConfigError as exc:
                self.events.emit("rejected", reason=f"configuration not reloaded, the running one stays: {exc}")
                raise
            old = self.config
            overrides = self.registry.overrides
            overrides.take_dropped()  # the reply lists what this reload drops, not what went before
            serving = overrides.over(old)  # what serves: the file as it was, with the live changes
            overrides.follow(new)  # the file wins for each field it changed
            self.config, self.limits = new, limits_from(new.daemon)
            self._reread_client_keys()
            keys_changed = new.daemon.engine_signing_keys != old.daemon.engine_signing_keys
            self._reread_signing_keys(new)
            self.registry.follow(new)
            self.workers.poke()  # a cold model added: the pool's watcher may now want a spare
            self.router.configure(new)
            self.streams.silent_s, self.streams.max_keys = new.daemon.stream_silent_s, new.daemon.stream_max_keys
            self.oversize.memory_s = new.daemon.oversize_memory_s
            steps = reload.apply(self, serving, overrides.over(new))
            if keys_changed:
                steps.signing_would_refuse = self._signing_refusals()
            return steps

    def _reread_client_keys(self) -> None:
        """A client key added to (or removed from) curve_authorized_dir counts from this reload on."""
        if self.curve is None:
            return
        try:
            self.curve.reload()
        except CurveError as exc:
            log.warning("%s; the keys read before stay authorised", exc)

    def _signing_refusals(self) -> list[str]:
        """The versions loaded now that the trusted keys in force would refuse at their next load (a
        restart, a cold worker's restart): said at once, with a warning each, not at the next restart."""
        signing = self.registry.signing
        if signing is None:
            return []
        refused = []
        for model in list(self.registry.models.values()):
            for mv in model.ordered():
                why = signing.problem(mv.config) if mv.ready else None
                if why:
                    refused.append(f"{mv.name}:{mv.version} {why}")
                    log.warning("%s:%s is loaded, and would be refused at its next load: %s", mv.name,
                                mv.version, why)
        return refused

    def _reread_signing_keys(self, new: cfg.Config) -> None:
        """The trusted publishers' keys as `new` lists them, for every load from now on (the versions
        loaded already stay)."""
        try:
            self.registry.signing = self.engine_signing(new.daemon)
        except (ValueError, OSError) as exc:
            log.warning("engine_signing_keys not re-read (%s); the keys read before stay trusted", exc)

    def _drain(self) -> None:
        """Answer everything accepted, refuse the rest, then close."""
        deadline = time.monotonic() + self.config.daemon.drain_timeout_s
        self.events.emit("draining", timeout_s=self.config.daemon.drain_timeout_s)
        closer = threading.Thread(target=self.registry.close, args=(self.config.daemon.drain_timeout_s,),
                                  daemon=True)
        closer.start()
        while time.monotonic() < deadline and (closer.is_alive() or self._outbox):
            self._turn(10, refuse=True)  # workers' lanes too: their replies finish the drain
            self._release_barriers()
        self._looping = False
        self._release_barriers()
        self._forward_replies()
        self._send_paused(every=True)
        # Requests clients sent before the signal may still sit in the socket's
        # queue: refuse them too, until the socket has been quiet for a moment,
        # or for REFUSE_S at most: clients that retry every few ms never let it
        # be quiet, and the daemon must still end (systemd would SIGKILL it).
        refuse_until = time.monotonic() + REFUSE_S
        while self.frontend is not None and time.monotonic() < refuse_until and self.frontend.poll(QUIET_MS):
            self._read_requests(refuse=True)
        self.close()

    def close(self) -> None:
        """Close the frontend and remove its socket files (the zmq context stays for others)."""
        if self.peers.drops is not None:
            self.peers.drops.closing = True  # the connections libzmq ends now are not dropped for their size
        if self.frontend is not None:
            self.frontend.close(linger=500)
        if self.curve is not None:
            self.curve.stop()
        if self.region_server is not None:
            self.region_server.close()
        self.peers.close()
        self.rollouts.close()
        if self.registry.signing is not None:
            self.registry.signing.close()
        os.close(self._bell)
        for endpoint in self.endpoints:
            ipc.remove(endpoint)

    def step(self) -> None:
        """One turn of the loop: wait for what is ready and handle it, then the ticks when due."""
        self._turn(self._wait_ms)
        self.loop_turns += 1
        now = time.monotonic()
        if now >= self._next_tick:
            self._next_tick = now + TICK_S
            for tick in self.ticks:
                tick()
            self._wait_ms = self._longest_wait(time.monotonic())
        if self._held:  # a tick may have queued requests (a worker restart)
            self._run_held()

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

    def _pacer_due(self, now: float) -> float | None:
        return self.pacer.next_due(now)

    # -- the hot path -----------------------------------------------------------

    def _turn(self, timeout_ms: int, refuse: bool = False) -> None:
        """One wait on the sockets, then whatever became ready."""
        ready = dict(self._poller.poll(timeout_ms))
        began = time.perf_counter()
        self._on_ready(ready, refuse)
        self.rollouts.frontend.add(time.perf_counter() - began)  # what a candidate's mirroring may not take

    def _on_ready(self, ready: dict[Any, int], refuse: bool) -> None:
        """Whatever `_turn`'s wait found ready: replies to forward, watched fds, requests to read."""
        if self._bell in ready:
            self._forward_replies()
        if self._watched:
            for fd in ready:
                on_ready = self._watched.get(fd)
                if on_ready is not None and not self._still_watching(on_ready):
                    del self._watched[fd]
                    self._poller.unregister(fd)
        if self.frontend in ready:
            self._read_requests(refuse)

    @staticmethod
    def _still_watching(on_ready: Callable[[], bool]) -> bool:
        try:
            return on_ready()
        except Exception:  # a watcher's bug must not take the frontend (and the daemon) down
            log.exception("internal error reading a worker's lane; no longer watching it")
            return False

    def _forward_replies(self) -> None:
        """Answer the bell: take up the fds `watch` was asked for, send what the outbox holds."""
        try:
            os.eventfd_read(self._bell)
        except BlockingIOError:
            pass
        while self._to_watch:
            fd, on_ready = self._to_watch.popleft()
            self._watched[fd] = on_ready
            self._poller.register(fd, zmq.POLLIN)
        while self._admissions:
            job = self._admissions.popleft()
            refused = self.router.admit(job)
            if refused is not None:
                self._refuse_step(job, refused)
        outbox = self._outbox
        while outbox:
            envelope, frames = outbox.popleft()
            self._send(envelope + frames, envelope)

    def _send(self, frames: list[Any], envelope: list[Any] | None = None) -> None:
        """Queue a reply without ever waiting: the frontend serves everyone, so a peer whose
        pipe is full (it does not read) loses this reply instead of stalling the others.
        `envelope`: the request's own, where the reply answers a computed request."""
        assert self.frontend is not None
        size = sum(len(f) for f in frames)
        if size > self.limits.max_reply_bytes:
            frames = self._bounded(frames, envelope)
            size = sum(len(f) for f in frames)
        elif type(envelope) is ClientEnvelope and envelope.probe is not None:
            self.oversize.fits(envelope.probe)  # its kind no longer makes replies too large
        if envelope is not None:  # a computed request's reply: the connection's refusals start over
            self.pacer.forgive(frames[0])
        # What the client gets (a 413 in place of an oversized reply) is what is recorded and compared.
        if self.recorder.active:
            self.recorder.on_reply(frames, _delimiter(frames))
        if self.mirror.pending:
            self.mirror.on_reply(frames, _delimiter(frames))
        try:
            self.wire.send(frames, copy=size < 1 << 20)
        except zmq.Again:  # only the identity frame can meet a full pipe: nothing was queued
            self.peers.dropped(frames[0])
            return
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                raise
            log.debug("client went away before its reply")
            return
        if self.peers.stalled:
            self.peers.delivered(frames[0])

    def _bounded(self, frames: list[Any], envelope: list[Any] | None = None) -> list[Any]:
        """`frames` if the reply in them (after its envelope) is within max_reply_bytes, else a 413
        in its place: the outputs were computed, and are dropped here rather than queued for the
        client (a 4 MiB input to a model that tiles it made 256 MiB). The request's kind is
        remembered, so that the next like it is refused before it is computed (oversize.py)."""
        split = _delimiter(frames)
        size, limit = sum(len(f) for f in frames[split:]), self.limits.max_reply_bytes
        if size <= limit:
            return frames
        kind = envelope.kind() if type(envelope) is ClientEnvelope else None
        if kind is not None:
            self.oversize.over(kind, size)
        try:
            header = json.loads(bytes(frames[split]))
        except ValueError:
            header = {}
        self.replies_too_large += 1
        where = {k: header[k] for k in ("model", "version") if isinstance(header.get(k), str)}
        held = _TOO_LARGE.admit("reply")
        if held is not None:
            log.warning("a reply of %d bytes is over max_reply_bytes (%d): answered 413 instead%s", size, limit,
                        f" ({held} more not logged)" if held else "")
        return frames[:split] + encode_reply(error_header(
            Status.TOO_LARGE, f"the reply would be {size} bytes; the limit is {limit} (max_reply_bytes): ask for "
            "fewer outputs (\"outputs\"), send a smaller batch, or have outputs written to shared memory "
            "(\"output_regions\"); it was computed", header.get("id"), **where))

    def _read_requests(self, refuse: bool = False) -> None:
        try:
            self._read_burst(refuse)
        finally:
            if self._held:
                self._run_held()

    def _read_burst(self, refuse: bool) -> None:
        assert self.frontend is not None
        n = 0
        while n < BURST:
            if self.express is not None and self._express_open(refuse):
                try:
                    served, message = self.express.run(BURST - n, 0 if n else 1, self._outbox, self.peers.hear_fd,
                                                       self.peers.dropped)
                except Exception:  # the socket's own failure (the callback answers its errors): as _send's
                    log.exception("internal error in the express lane's socket calls")
                    return
                self.requests += served
                n += served
                if message is None:  # nothing waits, the budget is spent, a reply waits or a peer stalled
                    forwarded = bool(self._outbox)
                    if forwarded:
                        self._forward_replies()
                    if not served or not (forwarded or self.peers.stalled):
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
            self._send(frames[:split] + encode_reply(header))

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
        if self.peers.stalled and frames[0] in self.peers.stalled:
            if not self.peers.probe(frames[0]):
                return
            self._send(envelope + encode_reply(error_header(
                Status.TOO_MANY, "replies to this connection are being dropped because it does not read them "
                "(its receive queue is full); read the replies, then retry", request_id(body, self.limits),
                retry_after_ms=STALLED_RETRY_MS)))
            return
        if refuse:
            reason = "shutting down" if self.stopping else "draining (admin `resume` reopens it)"
            header = error_header(Status.NOT_READY, f"infermux is {reason}; retry later",
                                  request_id(body, self.limits), retry_after_ms=OPERATOR_RETRY_MS,
                                  draining=True)  # the whole daemon, not one model: clients move elsewhere
            self._send(envelope + encode_reply(header))
            return
        try:
            if len(body) > self.limits.max_tensors + 1:
                raise ProtocolError(Status.BAD_REQUEST, f"{len(body)} frames; at most "
                                    f"{self.limits.max_tensors} tensors may follow the header (max_tensors)")
            request = self.parses.parse(body, self.limits, self._lookup)
        except ProtocolError as exc:  # or a limits query, which no request field names
            answer = limits_reply(body, self.limits) or error_header(
                exc.status, exc.message, request_id(body, self.limits),
                max_message_bytes=self.limits.max_message_bytes if exc.status is Status.TOO_LARGE else None)
            if sum(len(f) for f in body) >= PACED_REFUSAL_BYTES or (body and len(body[0]) >= PACED_REFUSAL_HEADER_BYTES):
                self._pause(envelope + encode_reply(answer))
            else:  # small mistakes are answered at once: a client fixing its requests waits for nothing
                self._send(envelope + encode_reply(answer))
            return
        envelope.came_with(request)
        if self.oversize and self._refused_oversize(envelope, request):
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
            job.answered(int(Status.BACKEND_ERROR))  # the 500 the burst's handler sends (_read_burst)
            raise
        if refused is not None:
            self._send(envelope + encode_reply(refused))

    def _refused_oversize(self, envelope: ClientEnvelope, request: Request) -> bool:
        """Answer `request` 413 at once if a request of its kind from this connection just made a reply
        over max_reply_bytes (oversize.py), before it is queued or computed: on both the fast path and
        the general one, which it never reaches; else mark it its kind's probe, if the kind is remembered."""
        kind = envelope.kind()
        assert kind is not None
        size = self.oversize.refusal(kind)
        if size is None:
            envelope.probe = kind if self.oversize.probing(kind) else None
            return False
        limit, wait_s = self.limits.max_reply_bytes, self.oversize.memory_s
        held = _REFUSED_OVERSIZE.admit("request")
        if held is not None:
            log.warning("a request of a kind whose reply was just %d bytes, over max_reply_bytes (%d), "
                        "refused without computing it%s", size, limit, f" ({held} more not logged)" if held else "")
        self._pause(envelope + encode_reply(error_header(
            Status.TOO_LARGE, f"refused without computing it: a request of the same shapes from this connection "
            f"just made a reply of {size} bytes; the limit is {limit} (max_reply_bytes): ask for fewer outputs "
            "(\"outputs\"), send a smaller batch, or have outputs written to shared memory (\"output_regions\"); "
            f"one request of these shapes is computed again {wait_s:g} s after the last reply over the limit",
            request.id, model=request.model, version=request.version)))
        return True

    def _pause(self, frames: list[Any]) -> None:
        """Send a refusal when its connection's time comes (pacing.py; at a turn of the loop after it)."""
        if not self.pacer.hold(frames):
            self._send(frames)

    def _send_paused(self, every: bool = False) -> None:
        """A tick: send the refusals held back whose time has come (`every`: all, at the drain)."""
        if len(self.pacer):
            for frames in self.pacer.due(every):
                self._send(frames)

    # -- status for notify/admin ------------------------------------------------

    def summary(self) -> str:
        """One line for systemd's STATUS=: models ready/loading and request count."""
        versions = self.registry.all_versions()
        count = {s: sum(1 for mv in versions if mv.state is s) for s in State}
        parts = [f"{count[State.READY]}/{len(versions)} models ready"]
        busy = count[State.LOADING] + count[State.WARMING]
        if busy:
            parts.append(f"{busy} loading")
        if count[State.FAILED]:
            parts.append(f"{count[State.FAILED]} failed")
        parts.append(f"{self.requests} requests")
        return ", ".join(parts)


def _overrides(state_dir: Path | None, events: EventLog, config: cfg.Config) -> Overrides:
    """The live changes, restored from the state file in `state_dir` and saved there on every change."""
    if state_dir is None:
        return Overrides(events)
    store = StateFile(state_dir, events, config.daemon)
    return Overrides(events, store.write, store.read())


def _delimiter(frames: list[Any]) -> int:
    """Index just past the envelope (identities + empty delimiter)."""
    for i in range(1, min(len(frames), MAX_ENVELOPE + 1)):
        if len(frames[i]) == 0:
            return i + 1
    return 1  # a raw DEALER that sent no delimiter: the identity alone routes the reply


if sys.platform != "linux":  # pragma: no cover
    log.warning("infermux is developed and tested on Linux only")
