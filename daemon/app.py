"""The composition root: the daemon's parts, built in order, and its life from start to stop.

Read top to bottom, `App.__init__` is the order of construction
(docs/architecture.md opens with it): what the transport needs, the
frontend loop (whose callbacks every layer below is handed), the registry
of models, routing and pipelines, the cold placement, rollouts, and the
check of engines' signatures before any load. `run` is the life that
`infermux serve` gives it: `start` (bind, operators' sockets, the
engine directory, signals, models), `serve_forever` (the loop, then
`shutdown`: drain and close), with `reload`, `drain` and `stop` in
between. Each consumer takes the narrow protocol of what it reads
(admin/daemon.py, swap/swapper.py, swap/reload.py, admin/supervisor.py,
admin/health.py), which this object satisfies; nothing takes the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

import zmq

from infermux import config as cfg
from infermux.admin.channel import AdminServer
from infermux.admin.metrics import MetricsServer
from infermux.admin.supervisor import Supervisor
from infermux.config import HOT
from infermux.events import EventLog
from infermux.execution.streams import StreamTable
from infermux.frontend.recorder import Recorder
from infermux.frontend.router import Router
from infermux.frontend.server import Server
from infermux.models.overrides import Overrides
from infermux.models.registry import Registry, State
from infermux.models.statefile import StateFile
from infermux.models.verdicts import Decisions
from infermux.models.verified import EngineSigning, Sequences, verified_store
from infermux.pipelines import warmshapes
from infermux.pipelines.crossings import CrossingsFile
from infermux.pipelines.runner import Pipelines
from infermux.pipelines.snapshots import Snapshots
from infermux.sinks.hub import Hub
from infermux.cameras.supervisor import Cameras
from infermux.cameras.supervisor import attach as attach_cameras
from infermux.swap import reload as reloading
from infermux.swap import swapper as swap
from infermux.swap.reload import ReloadPlan
from infermux.swap.rollout import Rollouts
from infermux.transport import curve
from infermux.transport.curve import CurveError
from infermux.transport.limits import Limits, frame_cap
from infermux.transport.peers import PeerGuard
from infermux.transport.regions import RegionTable
from infermux.workers.pool import Workers

log = logging.getLogger("infermux")


class App:
    """The daemon: its parts, built in order, and its lifecycle (start, serve, reload, drain, stop)."""

    def __init__(self, config: cfg.Config, run_dir: Path, state_dir: Path | None = None) -> None:
        self.config, self.run_dir, self.state_dir = config, run_dir, state_dir
        self.started = time.time()
        self._reload_lock = threading.Lock()
        self.on_stopping: list[Callable[[], object]] = []  # called once the loop stops, before the drain
        self._transport()
        self._frontend()
        self._models()
        self._routing()
        self._placements()
        self._rollouts()
        self.registry.signing = self.engine_signing(config.daemon)  # before any load: none escapes the check
        self.admin: AdminServer | None = None  # the operators' side, opened by start()
        self.metrics: MetricsServer | None = None
        self.swapper: swap.Swapper | None = None
        self.cameras: Cameras | None = None  # [[cameras]]' processes, from start() (cameras/supervisor.py)

    # -- construction, in order ------------------------------------------------

    def _transport(self) -> None:
        """1. Events, the zmq context, CURVE, the connections' guard, shared-memory regions."""
        daemon = self.config.daemon
        self.events = EventLog()
        self.ctx = zmq.Context()
        self.curve = curve.CurveGuard.from_config(daemon, self.ctx, self.events)
        # Connections the ROUTER takes, and replies dropped for peers that do not read (peers.py).
        self.peers = PeerGuard(daemon.max_connections, daemon.reserved_fds)
        self.peers.watch_drops(frame_cap(daemon))  # connections libzmq drops for a frame over it
        self.regions = RegionTable()  # inputs that local clients leave in shared memory (regions.py)
        self.recorder = Recorder()  # `infermux record`: requests and answers of a model, copied as they pass

    def _frontend(self) -> None:
        """2. The frontend loop: its hooks are what every layer below may ask of it (execution/hooks.py)."""
        self.frontend = Server(self.config, self.run_dir, self.events, self.ctx, self.curve, self.peers,
                               self.regions, self.recorder)
        self.endpoints = self.frontend.endpoints
        self.ticks, self.dues = self.frontend.ticks, self.frontend.dues

    def _models(self) -> None:
        """3. The registry; operators' live changes kept in `state_dir` across restarts, else in memory."""
        self.registry = Registry(self.config, self.events, self.frontend.hooks,
                                 _overrides(self.state_dir, self.events, self.config))
        self.registry.warm_shapes = lambda name: warmshapes.for_model(self.registry.config, name)

    def _routing(self) -> None:
        """4. Streams, the router, pipelines (whose model steps the frontend admits)."""
        daemon, frontend = self.config.daemon, self.frontend
        self.streams = StreamTable(self.events, daemon.stream_silent_s, daemon.stream_max_keys)
        self.router = Router(self.registry, self.config, frontend.reply, self.streams)
        self.pipelines = Pipelines(self.config.pipelines, frontend.admit_step, frontend.reply, frontend.reply_late,
                                   self._model_inputs, frontend.limits, self.config.cameras,
                                   CrossingsFile(self.state_dir, self.events))  # lines' counts kept across restarts
        self.router.pipelines = self.pipelines.by_name
        # Tracked objects' events leave the box through the sinks, each spooled under the state directory.
        self.sinks = Hub(self.config.sinks, (self.state_dir or self.run_dir) / "sinks",
                         self.events).attach(self.pipelines.outlet)
        # Keyed streams' newest frames (`ctl snapshot`) and tracked objects' best frames, as JPEGs beside them.
        self.snapshots = Snapshots(self.config.snapshots, (self.state_dir or self.run_dir) / "snapshots")
        self.pipelines.outlet.snapshots = self.snapshots
        self.ticks.append(self.streams.check)  # a stream that went silent: an event
        self.dues.append(self.streams.due)

    def _placements(self) -> None:
        """5. Cold models run in worker processes: the pool is the registry's cold placer (workers/pool.py)."""
        self.workers = Workers(self.registry, self.run_dir, self.frontend.hooks, self.regions)
        self.registry.add_placer(self.workers)

    def _rollouts(self) -> None:
        """6. Candidates shadowing live requests; their verdicts kept in `state_dir` too (models/verdicts.py)."""
        self.rollouts = Rollouts(self.registry, self.events, Decisions(self.state_dir, self.events))
        self.frontend.admit_with(self.router, self.rollouts)

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

    def _model_inputs(self, name: str) -> list[str] | None:
        """The input names of model `name`'s default version, None while it is not loaded (pipelines:
        their step's tensor then goes unnamed, and the router names it after the version it chooses)."""
        model = self.registry.model(name)
        mv = model.default() if model is not None else None
        engine = mv.engine if mv is not None else None
        return [s.name for s in engine.inputs] if engine is not None else None

    # -- the life: start, serve, reload, drain, stop ----------------------------------------

    def run(self) -> int:
        """`infermux serve`: start, serve until stopped, drain and close; the exit status."""
        try:
            self.start()
        except (RuntimeError, OSError) as exc:
            log.error("%s", exc)
            return 1
        try:
            self.serve_forever()
        finally:
            self._stop_operators()
            self.ctx.term()
        log.info("stopped")
        return 0

    def start(self) -> None:
        """Bind the frontend and the operators' sockets, follow the engine directory (discovery before
        READY; hot swap after: docs/hot-swap.md), take signals, load the models in the background."""
        self.bind()
        self.admin = AdminServer(self)
        self.admin.start()
        daemon = self.config.daemon
        if daemon.metrics_port:
            self.metrics = MetricsServer(self, daemon.metrics_port, daemon.metrics_host)
            self.metrics.start()
        self.swapper = swap.attach(self)
        supervisor = Supervisor(self)
        supervisor.install_signals()
        cameras = self.cameras = attach_cameras(self)  # stopped with the loop, before the drain

        def ready() -> None:
            if self.swapper is not None:
                self.swapper.start()
            cameras.start()
            supervisor.models_ready()

        self.start_models(done=ready)

    def bind(self) -> None:
        """Bind every listen endpoint (frontend/listen.py); raises RuntimeError, saying what to do."""
        self.frontend.bind()

    def start_models(self, done: Callable[[], None] | None = None) -> threading.Thread:
        """Load every configured hot model in the background (requests get 503 meanwhile)."""
        hot = [mv for mv in self.registry.all_versions()
               if (mv.config.placement == HOT or mv.config.preload) and mv.state is State.UNLOADED]
        return self.registry.start_loading(hot, done)

    def serve_forever(self) -> None:
        """Run the frontend loop until `stop()`; then drain and close."""
        self.frontend.serve_forever()
        for hook in self.on_stopping:
            hook()
        self.shutdown()

    def shutdown(self) -> None:
        """Answer everything accepted while the registry drains and unloads, refuse the rest, close."""
        timeout_s = self.config.daemon.drain_timeout_s
        deadline = time.monotonic() + timeout_s
        self.events.emit("draining", timeout_s=timeout_s)
        closer = threading.Thread(target=self.registry.close, args=(timeout_s,), daemon=True)
        closer.start()
        self.frontend.drain(deadline, closer.is_alive)
        self.close()

    def close(self) -> None:
        """Close the frontend and what it served with (the zmq context stays for the operators' side)."""
        self.frontend.close()
        if self.curve is not None:
            self.curve.stop()
        self.rollouts.close()
        self.pipelines.stop()  # their objects end (events spooled), then the sinks stop with what waits on disk
        self.sinks.stop()
        self.snapshots.stop()  # after the pipelines: their objects' last snapshots are written
        if self.registry.signing is not None:
            self.registry.signing.close()

    def _stop_operators(self) -> None:
        if self.swapper is not None:
            self.swapper.stop()
        if self.admin is not None:
            self.admin.stop()
        if self.metrics is not None:
            self.metrics.stop()

    def stop(self) -> None:
        """Ask the loop to stop (safe from a signal handler); `serve_forever` then drains and closes."""
        self.frontend.stop()

    def wake(self) -> None:
        """Make the loop turn and run its ticks now (any thread, a signal handler too)."""
        self.frontend.wake()

    @property
    def stopping(self) -> bool:
        return self.frontend.stopping

    @property
    def draining(self) -> bool:
        """Admin `drain`: new requests are refused until `resume`."""
        return self.frontend.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.frontend.draining = value

    @property
    def requests(self) -> int:
        """Requests read so far (the status, and what moves a stats snapshot)."""
        return self.frontend.requests

    @property
    def limits(self) -> Limits:
        """The request limits in force (the configuration's, since the last reload)."""
        return self.frontend.limits

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
            self._follow(new)
            steps = reloading.apply(self, serving, overrides.over(new))
            if new.daemon.engine_signing_keys != old.daemon.engine_signing_keys:
                steps.signing_would_refuse = self._signing_refusals()
            return steps

    def _follow(self, new: cfg.Config) -> None:
        """Every part that reads the configuration reads `new` from now on."""
        self.config = new
        self.frontend.follow(new.daemon)
        self._reread_client_keys()
        self._reread_signing_keys(new)
        self.registry.follow(new)
        self.workers.poke()  # a cold model added: the pool's watcher may now want a spare
        self.router.configure(new)
        self.streams.silent_s, self.streams.max_keys = new.daemon.stream_silent_s, new.daemon.stream_max_keys

    def _reread_client_keys(self) -> None:
        """A client key added to (or removed from) curve_authorized_dir counts from this reload on."""
        if self.curve is None:
            return
        try:
            self.curve.reload()
        except CurveError as exc:
            log.warning("%s; the keys read before stay authorised", exc)

    def _reread_signing_keys(self, new: cfg.Config) -> None:
        """The trusted publishers' keys as `new` lists them, for every load from now on (the versions
        loaded already stay)."""
        try:
            self.registry.signing = self.engine_signing(new.daemon)
        except (ValueError, OSError) as exc:
            log.warning("engine_signing_keys not re-read (%s); the keys read before stay trusted", exc)

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
