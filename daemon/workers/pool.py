"""Cold placements: the worker processes of `mode = "multiproc"` versions.

`Workers.load(mv)` is what `Registry.load` does for a cold version: take the
spare worker (or start one), send it LOAD, wait for READY, then serve the
version through a `WorkerProxy`. A watcher thread then keeps each worker
honest: a worker idle for `idle_unload_s` is stopped (the next request
starts it again), one without a heartbeat for `[daemon] worker_hang_s` is
killed, and a dead one has its requests failed at once (by its proxy) and is
restarted on the next demand after a short backoff; three crashes within a
minute put the version in `failed`.

The memory budget is kept by memory.py (`self.memory`), which may stop idle
cold workers through `_evicted` to make room for a load.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import zmq

from infermux.models import budget as mem
from infermux.workers import slots as shm
from infermux.workers import wire as wire
from infermux.execution.executor import LateFn, ReplyFn
from infermux.execution.inline import InlinePolicy
from infermux.plugins import backends
from infermux.plugins.base import BackendError
from infermux.transport.regions import RegionTable
from infermux.workers.mps import Mps
from infermux.workers.process import WorkerExited, WorkerProcess, sweep_sockets
from infermux.models.memory import MemoryKeeper
from infermux.config import ModelConfig
from infermux.models.verified import release
from infermux.models.version import ModelVersion, State
from infermux.workers.proxy import RemoteEngine, Watch, WorkerProxy

if TYPE_CHECKING:
    from infermux.models.registry import Registry

log = logging.getLogger("infermux.workers")

CRASH_WINDOW_S = 60.0
MAX_CRASHES = 3  # within the window: the version goes to `failed`
BACKOFF_S = (0.0, 0.1, 0.5, 2.0)  # restart delay after 0, 1, 2, 3 recent crashes
REFUSED_RETRY_S = 1.0  # a load refused for memory is tried again on demand after this
LOAD_TIMEOUT_S = 600.0  # a TensorRT plan of several GB takes a while to deserialize
WATCH_S = 0.1
SLOT_IDLE_S = 5.0
SPARE_STOP_S = 2.0  # at shutdown, the spare's time to exit before it is killed (packaging/k8s's grace period counts it)


class Workers:
    """Starts, watches and stops worker processes."""

    def __init__(self, registry: "Registry", run_dir: Path, reply: ReplyFn, on_late: LateFn, watch: Watch,
                 regions: RegionTable | None = None) -> None:
        self.registry = registry
        self.regions = regions
        self.events = registry.events
        self.run_dir = run_dir
        self._reply, self._on_late, self._watch_fd = reply, on_late, watch
        daemon = registry.config.daemon
        self.budget = mem.MemoryBudget(daemon.memory_budget, registry.config.path)
        self.memory = MemoryKeeper(registry, self.budget, stop=self._evicted, stoppable=self._stoppable)
        self.ctx = zmq.Context()
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._spare: WorkerProcess | None = None
        self._spare_starting = False
        self._crashes: dict[tuple[str, str], deque[float]] = {}
        self._retry_at: dict[tuple[str, str], float] = {}
        self._busy: set[tuple[str, str]] = set()  # being moved or stopped: the watcher keeps off
        self.turns = 0
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
                and any(mc.mode == "multiproc" for mc in config.models))

    def _preload(self) -> list[str]:
        names = set()
        for mc in self.registry.config.models:
            if mc.mode == "multiproc":
                names.add(mc.backend or backends.SUFFIXES.get(mc.engine.suffix.lower(), ""))
        return sorted(n for n in names if n)

    # -- processes ----------------------------------------------------------------------

    def mps_env(self, mc: ModelConfig | None = None) -> dict[str, str]:
        """The MPS client variables a worker for `mc` (None: the spare) starts with; raises MpsUnavailable."""
        daemon = self.registry.config.daemon
        percentage = (mc.mps_thread_percentage if mc is not None else 0) or daemon.mps_thread_percentage
        return self.mps.environment(daemon.mps, daemon.mps_pipe_dir, percentage)

    def _spawn(self, env: Mapping[str, str]) -> WorkerProcess:
        daemon = self.registry.config.daemon
        process = WorkerProcess(self.ctx, self.run_dir, next(self._ids), self._preload(),
                                heartbeat_s=min(0.25, self.hang_s / 4),
                                inline=InlinePolicy(daemon.inline_max_us, daemon.inline_busy_max_us),
                                log_level=daemon.log_level, env=env)
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

    def load(self, mv: ModelVersion) -> bool:
        """Serve `mv` from a worker process; False (state failed) on error. Runs on a loader thread."""
        mc = mv.config
        delay = self._backoff(mc.key)
        if delay:
            time.sleep(delay)
        try:
            self.make_room(mv)
        except mem.BudgetExceeded as exc:
            return self._refuse(mv, exc)
        try:
            env = self.mps_env(mc)
            process = self._take_spare(env)
            spare = process is not None
            process = process or self._spawn(env)
        except Exception as exc:
            return self.registry.fail(mv, exc, during="worker start")
        self.events.emit("worker_started", mc.name, mc.version, pid=process.pid, spare=spare,
                         mps=env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "on") if env else "off")
        free_before = self.budget.available()
        try:
            ready = self._send_load(process, mv)
        except (WorkerExited, TimeoutError, BackendError, wire.MalformedMessage) as exc:
            process.stop(1.0)
            process.close()
            self.events.emit("worker_stopped", mc.name, mc.version, pid=process.pid, reason="load failed")
            self._refill()
            return self.registry.fail(mv, exc, during=getattr(exc, "during", "load"))
        strategy = mc.strategy or self.registry.config.routing.strategy
        proxy = WorkerProxy(process, mc, ready, self._reply, self._on_late, self._exited, mv.stats, strategy,
                            self._watch_fd, self.regions)
        proxy.unseen_bytes = self.memory.unseen(free_before, process.rss() - process.hello.rss)
        mv.engine = RemoteEngine(ready.inputs, ready.outputs, ready.memory_bytes)
        mv.scheduler = proxy
        mv.memory_bytes = self.memory.measure(mc.key, proxy)
        mv.last_load_s = time.monotonic() - mv.load_started
        mv.reason = ""
        mv.state = State.READY
        self.events.emit("loaded", mc.name, mc.version, backend=ready.backend, contexts=mc.contexts,
                         load_ms=round(mv.last_load_s * 1000), engine_ms=ready.load_ms,
                         memory_mb=round(mv.memory_bytes / 2**20, 1), placement="cold", pid=process.pid)
        self.memory.settle(mv)
        self._refill()
        return True

    def _send_load(self, process: WorkerProcess, mv: ModelVersion) -> wire.Ready:
        # The daemon's proxy bounds what is in flight; the worker's own queue must never refuse.
        config = replace(mv.config, engine=mv.source or mv.config.engine, max_queue=1 << 30,
                         strategy=mv.config.strategy or self.registry.config.routing.strategy)
        if not process.send([wire.Load(config).encode()], wait_s=10.0):
            raise WorkerExited(f"worker {process.pid} does not take messages")
        while True:
            message = process.wait_for(wire.Stage, wire.Ready, wire.Error, timeout_s=LOAD_TIMEOUT_S)
            if isinstance(message, wire.Stage):
                mv.state = State.WARMING
            elif isinstance(message, wire.Error):
                error = BackendError(message.reason)
                error.during = message.during  # type: ignore[attr-defined]
                raise error
            elif isinstance(message, wire.Ready):
                return message

    def _refuse(self, mv: ModelVersion, exc: Exception) -> bool:
        self._retry_at[mv.config.key] = time.monotonic() + REFUSED_RETRY_S
        mv.state, mv.reason = State.FAILED, f"refused: {exc}"
        return False

    def may_retry(self, mv: ModelVersion) -> bool:
        """Whether a failed cold version may be loaded again on demand (a refusal, after a pause)."""
        at = self._retry_at.get(mv.config.key)
        return at is not None and time.monotonic() >= at

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

    def _owner(self, proxy: WorkerProxy) -> ModelVersion | None:
        return next((mv for mv in self.registry.all_versions() if mv.scheduler is proxy), None)

    def _exited(self, proxy: WorkerProxy, how: str, crashed: bool) -> None:
        """A worker ended (its proxy already answered what it held)."""
        mv = self._owner(proxy)
        name, version = proxy.name, proxy.version
        reason = proxy.stop_reason or (f"crashed ({how})" if crashed else how)
        self.events.emit("worker_stopped", name, version, pid=proxy.pid, reason=reason)
        if not crashed:
            return
        self.events.emit("crashed", name, version, pid=proxy.pid, exit=how, reason=reason)
        self._crashes.setdefault((name, version), deque()).append(time.monotonic())
        if mv is None:
            return
        mv.scheduler, mv.engine, mv.memory_bytes = None, None, 0
        release(mv.source)  # the next start checks the signature again
        mv.source = None
        count = self._recent_crashes(mv.config.key)
        if count >= MAX_CRASHES:
            mv.state, mv.reason = State.FAILED, (f"worker crashed {count} times within {CRASH_WINDOW_S:.0f} s "
                                                 f"(last: {reason}); the admin `load` command tries again")
            self.events.emit("failed", name, version, reason=mv.reason)
        else:
            mv.state, mv.reason = State.UNLOADED, f"worker {reason}; it restarts on the next request"

    def forgive(self, mv: ModelVersion) -> None:
        """An operator loads a version by hand: forget its crashes and refusals."""
        self._crashes.pop(mv.config.key, None)
        self._retry_at.pop(mv.config.key, None)

    # -- memory -------------------------------------------------------------------------

    def make_room(self, mv: ModelVersion) -> None:
        """Before any load, hot or cold: see memory.py."""
        self.memory.make_room(mv)

    # -- the watcher --------------------------------------------------------------------

    def _watch(self) -> None:
        last_gpu = 0.0
        while not self._closed:
            time.sleep(WATCH_S)
            now = time.monotonic()
            gpu = None
            if self.budget.gpu is not None and now - last_gpu > 2.0:
                gpu, last_gpu = self.budget.gpu_used(), now
            try:
                for mv in self.registry.all_versions():
                    if isinstance(mv.scheduler, WorkerProxy) and mv.config.key not in self._busy:
                        self._check(mv, mv.scheduler, now, gpu)
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
        if (idle_s > 0 and mv.state is State.READY and proxy.load() == 0
                and now - max(mv.last_used, proxy.created) > idle_s):
            proxy.stop_reason = "idle"
            self._stop(mv, wait=False)
            return
        proxy.slots.trim(SLOT_IDLE_S, keep=len(proxy.executors) * max(1, mv.config.max_batch) + 1)

    def _stoppable(self, mv: ModelVersion) -> bool:
        """Whether the memory keeper may stop `mv` to make room: a cold version serving nothing
        right now, which nothing else is moving or stopping."""
        return (isinstance(mv.scheduler, WorkerProxy) and mv.state is State.READY and mv.scheduler.load() == 0
                and mv.config.key not in self._busy)

    def _evicted(self, mv: ModelVersion) -> None:
        if isinstance(mv.scheduler, WorkerProxy):
            mv.scheduler.stop_reason = "evicted"
        self._stop(mv)

    def _stop(self, mv: ModelVersion, wait: bool = True) -> None:
        """Unload a cold version (idle, evicted), unless something else is already moving it."""
        key = mv.config.key
        with self._lock:
            if key in self._busy:
                return
            self._busy.add(key)

        def run() -> None:
            try:
                self.registry.unload(mv, self.registry.config.daemon.drain_timeout_s)
            finally:
                with self._lock:
                    self._busy.discard(key)

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

    # -- promote/demote support --------------------------------------------------------------

    def tick(self) -> None:
        """Run by the frontend at the end of every loop turn (Server.ticks)."""
        self.turns += 1

    def wait_turns(self, n: int = 2, timeout_s: float = 1.0) -> None:
        """Until the frontend finished `n` loop turns: no admission still holds an old scheduler."""
        start, deadline = self.turns, time.monotonic() + timeout_s
        while self.turns - start < n and time.monotonic() < deadline:
            time.sleep(0.002)

    @contextmanager
    def moving(self, mv: ModelVersion) -> Iterator[None]:
        """Keep the watcher (idle unload, eviction) off a version while it changes placement."""
        key = mv.config.key
        with self._lock:
            if key in self._busy:
                raise ValueError(f"{mv.name}:{mv.version} is already being moved or stopped; try again")
            self._busy.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(key)

    # -- the end --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the spare and any worker still running (after the registry unloaded what it could)."""
        self._closed = True
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.stop(SPARE_STOP_S)
            spare.close()
        for mv in self.registry.all_versions():
            proxy = mv.scheduler
            if isinstance(proxy, WorkerProxy):
                proxy.stop_reason = "daemon stopping"
                proxy.stop(0)
        self._watcher.join(1.0)
        self.mps.close()
