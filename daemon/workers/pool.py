"""The cold placer: worker processes for `placement = "cold"` versions.

`Workers` is the `Placer` of cold versions (models/placer.py): its `load`
takes the spare worker (or starts one), sends it LOAD, waits for READY and
returns the `WorkerProxy` that serves the version; the registry does the
rest, as for a hot version. A watcher thread then keeps each worker it
started honest: a worker idle for `idle_unload_s` is stopped (the next
request starts it again), one without a heartbeat for `[daemon]
worker_hang_s` is killed, and a dead one has its requests failed at once (by
its proxy) and is restarted on the next demand after a short backoff; three
crashes within a minute put the version in `failed`.

The registry keeps the memory budget (models/memory.py); the pool tells its
keeper which cold versions may be stopped to make room, and stops them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Mapping

import zmq

from infermux.config import COLD, ModelConfig
from infermux.execution.hooks import FrontendHooks
from infermux.execution.inline import InlinePolicy
from infermux.execution.priority import lower_process
from infermux.models import life
from infermux.models.placer import LoadFailed
from infermux.models.registry import Registry
from infermux.models.version import ModelVersion, State
from infermux.plugins import backends
from infermux.transport.regions import RegionTable
from infermux.workers import slots as shm
from infermux.workers import wire as wire
from infermux.workers.mps import Mps
from infermux.workers.process import WorkerExited, WorkerProcess, sweep_sockets
from infermux.models.verified import release
from infermux.workers.proxy import WorkerProxy

log = logging.getLogger("infermux.workers")

CRASH_WINDOW_S = 60.0
MAX_CRASHES = 3  # within the window: the version goes to `failed`
BACKOFF_S = (0.0, 0.1, 0.5, 2.0)  # restart delay after 0, 1, 2, 3 recent crashes
LOAD_TIMEOUT_S = 600.0  # a TensorRT plan of several GB takes a while to deserialize
WATCH_S = 0.1
SLOT_IDLE_S = 5.0
SPARE_STOP_S = 2.0  # at shutdown, the spare's time to exit before it is killed (packaging/k8s's grace period counts it)


class Workers:
    """The cold `Placer`: starts, watches and stops worker processes. It places the registry's
    cold versions once the composition root adds it (`Registry.add_placer`, app.py); `hooks` are the frontend's
    callbacks its proxies reply through (they need `watch`)."""

    kind = COLD

    def __init__(self, registry: Registry, run_dir: Path, hooks: FrontendHooks,
                 regions: RegionTable | None = None) -> None:
        self.registry = registry
        self.regions = regions
        self.events = registry.events
        self.run_dir = run_dir
        self.hooks = hooks
        self.memory = registry.memory
        self.memory.evict_with(stop=self._evicted, stoppable=self._stoppable)
        self._placed: dict[WorkerProxy, ModelVersion] = {}  # every proxy it made and the version it serves
        self.ctx = zmq.Context()
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._spare: WorkerProcess | None = None
        self._spare_starting = False
        self._crashes: dict[tuple[str, str], deque[float]] = {}
        self._closed = False
        self.mps = Mps()
        removed = shm.sweep_stale()
        sweep_sockets(run_dir)
        if removed:
            self.events.emit("swept", segments=len(removed), reason="left by a daemon that was killed")
        self._watcher = threading.Thread(target=self._watch, name="workers", daemon=True)
        self._watcher.start()
        self._refill()

    # -- settings -----------------------------------------------------------------------

    @property
    def hang_s(self) -> float:
        return self.registry.config.daemon.worker_hang_s

    def _want_spare(self) -> bool:
        config = self.registry.config
        return (not self._closed and config.daemon.spare_worker and not self.mps.refused(config.daemon.mps)
                and any(mc.placement == COLD for mc in config.models))

    def _preload(self) -> list[str]:
        names = set()
        for mc in self.registry.config.models:
            if mc.placement == COLD:
                names.add(mc.backend or backends.SUFFIXES.get(mc.engine.suffix.lower(), ""))
        return sorted(n for n in names if n)

    # -- processes ----------------------------------------------------------------------

    def mps_env(self, mc: ModelConfig | None = None) -> dict[str, str]:
        """The MPS client variables a worker for `mc` (None: the spare) starts with; raises MpsUnavailable."""
        daemon = self.registry.config.daemon
        percentage = (mc.mps_thread_percentage if mc is not None else 0) or daemon.mps_thread_percentage
        return self.mps.environment(daemon.mps, daemon.mps_pipe_dir, percentage)

    def _spawn(self, env: Mapping[str, str], nice: int = 0) -> WorkerProcess:
        daemon = self.registry.config.daemon
        process = WorkerProcess(self.ctx, self.run_dir, next(self._ids), self._preload(),
                                heartbeat_s=min(0.25, self.hang_s / 4),
                                inline=InlinePolicy(daemon.inline_max_us, daemon.inline_busy_max_us),
                                log_level=daemon.log_level, env=env)
        # A version's own worker at its `nice` from the start: its interpreter's start-up and imports take
        # spare CPU only too (a spare, started ahead of need, is lowered once it is taken: `load`).
        lower_process(process.pid, nice, f"worker {process.pid}")
        try:
            process.hello = process.wait_for(wire.Hello, timeout_s=60)
        except BaseException:
            process.close()
            raise
        self.memory.worker_base = process.hello.rss or self.memory.worker_base
        return process

    def _refill(self) -> None:
        """Start a spare in the background if one is wanted and none is there."""
        with self._lock:
            if self._spare is not None or self._spare_starting or not self._want_spare():
                return
            self._spare_starting = True
        threading.Thread(target=self._start_spare, name="spare-worker", daemon=True).start()

    def _start_spare(self) -> None:
        process = None
        try:
            process = self._spawn(self.mps_env())
        except Exception as exc:
            log.warning("spare worker failed to start: %s", exc)
        with self._lock:
            self._spare_starting = False
            if process is not None and not self._closed:
                self._spare, process = process, None
                self.events.emit("spare_started", pid=self._spare.pid)
            self._lock.notify_all()
        if process is not None:
            process.close()

    def _take_spare(self, env: Mapping[str, str]) -> WorkerProcess | None:
        """The spare (waiting for one being started: cheaper than starting a second), if it started with
        `env`: CUDA reads an MPS thread percentage only when the worker makes its context, so a model with
        its own percentage gets a worker of its own and the spare waits for the next."""
        with self._lock:
            self._lock.wait_for(lambda: not self._spare_starting, timeout=60)
            if self._spare is None or self._spare.env != env:
                return None
            process, self._spare = self._spare, None
        if process is not None and process.exited():
            process.close()
            return None
        return process

    # -- loading ----------------------------------------------------------------------

    def load(self, version: ModelVersion) -> WorkerProxy:
        """Serve `version` from a worker process (the registry made room for it); raises LoadFailed.
        Runs on a loader thread."""
        mc = version.config
        delay = self._backoff(mc.key)
        if delay:
            time.sleep(delay)
        try:
            env = self.mps_env(mc)
            process = self._take_spare(env)
            spare = process is not None
            process = process or self._spawn(env, mc.nice)
        except Exception as exc:
            raise LoadFailed(exc, "worker start") from exc
        self.events.emit("worker_started", mc.name, mc.version, pid=process.pid, spare=spare,
                         mps=env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "on") if env else "off")
        free_before = self.memory.budget.available()
        try:
            # A spare taken gets its `nice` now (one spawned for it has it from `_spawn`): every thread of the
            # process, before the engine loads, so that the threads its session makes inherit it. A spare taken
            # is this version's alone (it stops with it): never handed on reniced.
            if spare:
                lower_process(process.pid, mc.nice, f"the worker of {mc.name}:{mc.version}")
            ready = self._send_load(process, version)
        except (WorkerExited, TimeoutError, LoadFailed, wire.MalformedMessage) as exc:
            process.stop(1.0)
            process.close()
            self.events.emit("worker_stopped", mc.name, mc.version, pid=process.pid, reason="load failed")
            self._refill()
            raise exc if isinstance(exc, LoadFailed) else LoadFailed(exc) from exc
        strategy = mc.strategy or self.registry.config.routing.strategy
        proxy = WorkerProxy(process, mc, ready, self.hooks, version.stats, strategy, self._exited, self.regions)
        proxy.unseen_bytes = self.memory.unseen(free_before, process.rss() - process.hello.rss)
        with self._lock:
            self._placed[proxy] = version
            self._lock.notify_all()  # the watcher may sleep without a timeout: it has one to watch now
        self._refill()
        return proxy

    def _send_load(self, process: WorkerProcess, mv: ModelVersion) -> wire.Ready:
        # The daemon's proxy bounds what is in flight; the worker's own queue must never refuse.
        # nice = 0 there: its every thread is at the version's nice already (`load`), not to be added twice.
        config = replace(mv.config, engine=mv.source or mv.config.engine, rollout=None, max_queue=1 << 30, nice=0,
                         strategy=mv.config.strategy or self.registry.config.routing.strategy)
        shapes = tuple(self.registry.warm_shapes(config.name))  # what its pipelines send it, to warm it at
        if not process.send([wire.Load(config, shapes).encode()], wait_s=10.0):
            raise WorkerExited(f"worker {process.pid} does not take messages")
        while True:
            message = process.wait_for(wire.Stage, wire.Ready, wire.Error, timeout_s=LOAD_TIMEOUT_S)
            if isinstance(message, wire.Stage):
                self.registry.warming(mv, message.backend)
            elif isinstance(message, wire.Error):
                raise LoadFailed(message.reason, message.during)
            elif isinstance(message, wire.Ready):
                return message

    # -- crashes ----------------------------------------------------------------------

    def _backoff(self, key: tuple[str, str]) -> float:
        recent = self._recent_crashes(key)
        return BACKOFF_S[min(recent, len(BACKOFF_S) - 1)]

    def _recent_crashes(self, key: tuple[str, str]) -> int:
        times = self._crashes.get(key)
        if not times:
            return 0
        now = time.monotonic()
        while times and now - times[0] > CRASH_WINDOW_S:
            times.popleft()
        return len(times)

    def _exited(self, proxy: WorkerProxy, how: str, crashed: bool) -> None:
        """A worker ended (its proxy already answered what it held)."""
        with self._lock:
            mv = self._placed.pop(proxy, None)
        name, version = proxy.name, proxy.version
        reason = proxy.stop_reason or (f"crashed ({how})" if crashed else how)
        self.events.emit("worker_stopped", name, version, pid=proxy.pid, reason=reason)
        if not crashed:
            return
        self._crashes.setdefault((name, version), deque()).append(time.monotonic())
        if mv is None or mv.placement is not proxy:  # not (or no longer) what serves its version
            self.events.emit("crashed", name, version, pid=proxy.pid, exit=how, reason=reason)
            return
        life.say(self.events, mv, "crashed", pid=proxy.pid, exit=how, reason=reason)
        mv.placement, mv.engine, mv.memory_bytes = None, None, 0
        release(mv.source)  # the next start checks the signature again
        mv.source = None
        count = self._recent_crashes(mv.config.key)
        if count >= MAX_CRASHES:
            mv.state, mv.reason = State.FAILED, (f"worker crashed {count} times within {CRASH_WINDOW_S:.0f} s "
                                                 f"(last: {reason}); the admin `load` command tries again")
            life.say(self.events, mv, "failed", reason=mv.reason)
        else:
            mv.state, mv.reason = State.UNLOADED, f"worker {reason}; it restarts on the next request"

    def forgive(self, version: ModelVersion) -> None:
        """An operator loads a version by hand: forget its crashes."""
        self._crashes.pop(version.config.key, None)

    # -- the watcher --------------------------------------------------------------------

    def poke(self) -> None:
        """The configuration changed: let the watcher see whether it now wants a spare."""
        with self._lock:
            self._lock.notify_all()

    def _watching(self) -> bool:
        """Whether the watcher has anything to look at every WATCH_S: a worker, or a spare (running,
        starting or wanted). Without, it sleeps until `place`, a spare, `poke` or `close` wakes it."""
        return bool(self._placed) or self._spare is not None or self._spare_starting or self._want_spare()

    def _watch(self) -> None:
        last_gpu = 0.0
        while not self._closed:
            with self._lock:
                self._lock.wait(WATCH_S if self._watching() else None)
            if self._closed:
                break
            now = time.monotonic()
            gpu = None
            if self.memory.budget.gpu is not None and now - last_gpu > 2.0:
                gpu, last_gpu = self.memory.budget.gpu_used(), now
            try:
                with self._lock:
                    placed = list(self._placed.items())
                for proxy, mv in placed:
                    if not self.registry.changing(mv):
                        self._check(mv, proxy, now, gpu)
                self._check_spare()
            except Exception:  # the watcher must outlive any one surprise
                log.exception("worker watcher")

    def _check(self, mv: ModelVersion, proxy: WorkerProxy, now: float, gpu: dict[int, int] | None) -> None:
        if not proxy.alive:
            return
        mv.memory_bytes = self.memory.measure(mv.config.key, proxy, gpu) or mv.memory_bytes
        silent = now - proxy.last_beat
        if silent > self.hang_s:
            proxy.kill(f"hung (no heartbeat for {silent:.1f} s)")
            return
        idle_s = mv.config.idle_unload_s
        if (idle_s > 0 and mv.state is State.READY and mv.placement is proxy and proxy.load() == 0
                and now - max(mv.last_used, proxy.created) > idle_s):
            self._stop(mv, "idle", wait=False)
            return
        proxy.slots.trim(SLOT_IDLE_S, keep=len(proxy.executors) * max(1, mv.config.max_batch) + 1)

    def _stoppable(self, mv: ModelVersion) -> bool:
        """Whether the memory keeper may stop `mv` to make room: a cold version serving nothing
        right now, which nothing else is moving or stopping."""
        placement = mv.placement
        return (placement is not None and placement.kind == COLD and mv.state is State.READY
                and placement.load() == 0 and not self.registry.changing(mv))

    def _evicted(self, mv: ModelVersion) -> None:
        self._stop(mv, "evicted")

    def _stop(self, mv: ModelVersion, reason: str, wait: bool = True) -> None:
        """Unload a cold version (idle, evicted), unless something else is already moving it."""
        if not self.registry.claim(mv):
            return

        def run() -> None:
            try:
                self.registry.unload(mv, self.registry.config.daemon.drain_timeout_s, reason=reason)
            finally:
                self.registry.release(mv)

        if wait:
            run()
        else:
            threading.Thread(target=run, name=f"stop-{mv.name}-{mv.version}", daemon=True).start()

    def _check_spare(self) -> None:
        with self._lock:
            spare = self._spare
            if spare is not None and spare.exited():
                self._spare = None
        if spare is not None and spare.exited():
            self.events.emit("worker_stopped", pid=spare.pid, reason=f"spare {spare.reason()}")
            spare.close()
        self._refill()

    # -- the end --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the spare and any worker still running (after the registry unloaded what it could)."""
        self._closed = True
        with self._lock:
            spare, self._spare = self._spare, None
            self._lock.notify_all()
        if spare is not None:
            spare.stop(SPARE_STOP_S)
            spare.close()
        with self._lock:
            left = list(self._placed)
        for proxy in left:
            proxy.stop(0, "daemon stopping")
        self._watcher.join(1.0)
        self.mps.close()
