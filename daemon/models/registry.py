"""The registry: every model, its versions (models/version.py), their engines and placements.

Loads run on a loader thread; the frontend reads states and placements
without locks (each is replaced in one assignment). Cold versions are
loaded by the worker pool (workers/pool.py), which the Server hands in.
The states of a version: docs/architecture.md#states-of-a-model-version.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from infermux.models.budget import release_freed_memory
from infermux.models.memory import hot_footprint
from infermux.config import Config, ModelConfig
from infermux.events import EventLog
from infermux.execution.executor import LateFn, ReplyFn
from infermux.plugins import backends
from infermux.plugins.base import BackendError, Engine, TensorSpec
from infermux.execution.inline import HoldFn, InlineGate
from infermux.models import fallback as fallbacks
from infermux.models import promote as moves
from infermux.models.verified import EngineSigning, SignatureRefused, release
from infermux.models.version import Model, ModelVersion, State, version_key
from infermux.execution.placement import Change
from infermux.execution.scheduler import Scheduler

if TYPE_CHECKING:
    from infermux.workers.pool import Workers

__all__ = ["Catalog", "Model", "ModelVersion", "Registry", "State", "missing_engine", "rss_bytes", "version_key",
           "warm_up", "warmup_inputs"]

log = logging.getLogger("infermux.registry")


def rss_bytes() -> int:
    """This process's resident memory (Linux), or 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def missing_engine(path: Path) -> str:
    """The configured engine file is not there: say where it was looked for and what is there."""
    folder = path.parent
    try:
        there = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        return f"configured engine {path} is missing: looked in {folder}, which does not exist"
    found = f"it holds {', '.join(there[:8])}{' ...' if len(there) > 8 else ''}" if there else "it is empty"
    return f"configured engine {path} is missing: looked in {folder}; {found}"


def warmup_inputs(specs: Sequence[TensorSpec], engine_path: Path) -> dict[str, np.ndarray]:
    """`warmup.npz` beside the engine if present, else zeros at the smallest accepted shape."""
    npz = engine_path.parent / "warmup.npz"
    if npz.exists():
        with np.load(npz, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    inputs = {}
    for spec in specs:
        low = spec.min_shape or ()
        shape = [d if d >= 0 else (max(low[i], 1) if low else 1) for i, d in enumerate(spec.shape)]
        inputs[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return inputs


def warm_up(engine: Engine, mc: ModelConfig) -> float:
    """Run the engine before any client is sent to it; returns µs per input row.

    The first call pays one-off set-up, so the second one is timed.
    """
    context = engine.create_context()
    inputs = warmup_inputs(engine.inputs, mc.engine)
    try:
        context.infer(inputs)
        start = time.perf_counter()
        context.infer(inputs)
        elapsed_us = (time.perf_counter() - start) * 1e6
    finally:
        context.close()
    first = next(iter(inputs.values()), None)
    rows = first.shape[0] if first is not None and first.ndim else 1
    return elapsed_us / max(1, rows)


class Catalog(Protocol):
    """What pin/unpin need from the engine-directory watcher (swap/swapper.py)."""

    def versions_on_disk(self, name: str) -> set[str]: ...

    def pins_changed(self, name: str) -> None: ...


class Registry:
    """Models by name; loads and unloads versions on a loader thread."""

    def __init__(self, config: Config, events: EventLog, reply: ReplyFn, on_late: LateFn,
                 inline: InlineGate | None = None, hold: HoldFn | None = None) -> None:
        self.config = config
        self.inline, self.hold = inline, hold
        self.events = events
        self._reply, self._on_late = reply, on_late
        self.models: dict[str, Model] = {}
        self.catalog: Catalog | None = None  # the engine-directory watcher, when there is one
        self._lock = threading.Lock()
        self.workers: Workers | None = None  # set by the Server: cold placements, the memory budget
        self.signing: EngineSigning | None = None  # set by the Server under engine_signing_keys (verified.py)
        for mc in config.models:
            self.add(mc)

    def add(self, mc: ModelConfig) -> ModelVersion:
        """Register a version (not loaded yet)."""
        mv = ModelVersion(mc)
        self.put(mv)
        return mv

    def put(self, mv: ModelVersion) -> ModelVersion | None:
        """Make `mv` its version's entry in one assignment; returns the entry it replaced."""
        mc = mv.config
        with self._lock:
            models = dict(self.models)
            model = models.get(mc.name) or Model(mc.name)
            previous = model.versions.get(mc.version)
            model.versions = {**model.versions, mc.version: mv}
            if mc.fallback and (not model.fallback or mc.default):
                model.fallback = mc.fallback
            models[mc.name] = model
            self.models = models
        return previous

    def discard(self, mv: ModelVersion) -> None:
        """Forget `mv` (if it is still its version's entry), and its model once no version is left."""
        with self._lock:
            model = self.models.get(mv.name)
            if model is None or model.versions.get(mv.version) is not mv:
                return
            versions = {v: other for v, other in model.versions.items() if other is not mv}
            if versions:
                model.versions = versions
            else:
                self.models = {name: m for name, m in self.models.items() if name != mv.name}

    def pin(self, name: str, version: str) -> None:
        """Serve `version` of `name` by default, whatever newer versions appear, until `unpin`.

        A version that is not loaded but whose engine is in engine_dir is loaded
        first; the serving version answers meanwhile.
        """
        model = self.models.get(name)
        if model is None:
            raise ValueError(f"unknown model {name!r}; models: {', '.join(sorted(self.models)) or 'none'}")
        known = set(model.versions) | (self.catalog.versions_on_disk(name) if self.catalog else set())
        if version not in known:
            raise ValueError(f"model {name!r} has no version {version!r}; versions: "
                             f"{', '.join(sorted(known, key=version_key))}")
        model.pinned = version
        self.events.emit("pinned", name, version)
        if self.catalog:
            self.catalog.pins_changed(name)

    def unpin(self, name: str) -> None:
        """Undo `pin`: the version policy chooses again (newer versions catch up)."""
        model = self.models.get(name)
        if model is None:
            raise ValueError(f"unknown model {name!r}; models: {', '.join(sorted(self.models)) or 'none'}")
        model.pinned = None
        self.events.emit("unpinned", name)
        if self.catalog:
            self.catalog.pins_changed(name)

    def model(self, name: str) -> Model | None:
        return self.models.get(name)

    def all_versions(self) -> list[ModelVersion]:
        return [mv for m in self.models.values() for mv in m.ordered()]

    def start_loading(self, versions: list[ModelVersion], done: Callable[[], None] | None = None) -> threading.Thread:
        """Load `versions` in parallel, one thread each, so a slow engine delays no other.

        `done` runs once every one of them is ready or failed.
        """
        for mv in versions:
            self._mark_loading(mv)
        loaders = [threading.Thread(target=self.load, args=(mv,), name=f"load-{mv.name}-{mv.version}", daemon=True)
                   for mv in versions]

        def run() -> None:
            for thread in loaders:
                thread.start()
            for thread in loaders:
                thread.join()
            if done:
                done()

        waiter = threading.Thread(target=run, name="loader", daemon=True)
        waiter.start()
        return waiter

    def on_demand(self, mv: ModelVersion) -> None:
        """A request wants `mv`: start loading it if it is a cold model that is not loaded.

        Hot models load at start and stay unloaded once an operator unloads them.
        """
        if mv.config.mode != "multiproc":
            return
        if mv.state is State.UNLOADED or (mv.state is State.FAILED and self.workers and self.workers.may_retry(mv)):
            self.start_loading([mv])

    def _mark_loading(self, mv: ModelVersion) -> None:
        mv.state, mv.reason, mv.load_started = State.LOADING, "", time.monotonic()

    def load(self, mv: ModelVersion) -> bool:
        """Load, warm up and start serving one version; False (state failed) on error."""
        mc = mv.config
        if mv.state is not State.LOADING:
            if self.workers is not None:
                self.workers.forgive(mv)  # not on demand: an operator's load forgets past crashes
            self._mark_loading(mv)
        self.events.emit("loading", mc.name, mc.version, engine=str(mc.engine))
        if mc.mode == "multiproc" and self.workers is not None:
            if not mc.engine.exists():  # say it here, not as whatever the worker makes of it
                return self.fail(mv, BackendError(missing_engine(mc.engine)))
            try:
                self._admit(mv)  # the worker loads mv.source, the verified copy, under signing
            except SignatureRefused as exc:
                return self.fail(mv, exc, during="signature check")
            except Exception as exc:
                return self.fail(mv, exc)
            loaded = self.workers.load(mv)
            if loaded:
                self.check_fallbacks(mc.name)
            return loaded
        try:
            if self.workers is not None:
                self.workers.make_room(mv)  # may stop idle cold workers; raises if it cannot fit
            if mc.mode != "inproc":
                raise BackendError(f"mode {mc.mode!r} is not available in this build; use mode = \"inproc\"")
            if not mc.engine.exists():
                raise BackendError(missing_engine(mc.engine))
            source = self._admit(mv)
            backend = backends.for_path(source.engine, mc.backend or None)
            engine = backend.load(source.engine, dict(mc.options))
        except SignatureRefused as exc:
            return self.fail(mv, exc, during="signature check")
        except Exception as exc:
            return self.fail(mv, exc)
        try:
            mv.state = State.WARMING
            self.events.emit("warming", mc.name, mc.version)
            row_us = warm_up(engine, source)
            strategy = mc.strategy or self.config.routing.strategy
            scheduler = Scheduler(mc, engine, self._reply, self._on_late, mv.stats, strategy, self.inline, row_us,
                                  self.hold)
        except Exception as exc:
            engine.close()
            return self.fail(mv, exc, during="warm-up")
        mv.engine, mv.scheduler = engine, scheduler
        mv.memory_bytes = hot_footprint(engine, mc)  # one method for every hot path (memory.py)
        mv.last_load_s = time.monotonic() - mv.load_started
        mv.state = State.READY
        self.events.emit("loaded", mc.name, mc.version, backend=backend.name, contexts=mc.contexts,
                         load_ms=round(mv.last_load_s * 1000), memory_mb=round(mv.memory_bytes / 2**20, 1))
        self.check_fallbacks(mc.name)
        watch = getattr(engine, "watch", None)
        if callable(watch):  # an engine that changes while it serves: a TensorRT plan rebuilding
            watch(lambda kind, reason: self._engine_news(mv, kind, reason))
        return True

    def _admit(self, mv: ModelVersion) -> ModelConfig:
        """`mv`'s settings with the engine file to load: its own, or under engine_signing_keys the
        private copy of it whose signature was checked (`mv.source`; SignatureRefused if none checks
        out). A discovered model's backend and options come from its model.toml, which is signed too."""
        release(mv.source)
        mv.source = None
        if self.signing is None:
            return mv.config
        mv.source = self.signing.admit(mv.config, from_settings=not self.config.versions(mv.name))
        return replace(mv.config, engine=mv.source)

    def check_fallbacks(self, name: str | None = None) -> None:
        """Remove each fallback (of or to `name`; all without) that does not take its model's
        inputs, saying why (models/fallback.py): it would only answer 400 in the model's place."""
        for model in list(self.models.values()):
            target = self.models.get(model.fallback) if model.fallback else None
            if target is None or (name is not None and name not in (model.name, target.name)):
                continue
            why = fallbacks.refusal(model, target)
            if why:
                model.fallback = ""
                self.events.emit("fallback_refused", model.name, fallback=target.name, reason=why)

    def _engine_news(self, mv: ModelVersion, kind: str, reason: str) -> None:
        """Progress an engine reports after its load: the version's status reason, and an event
        for each step (not for each builder phase)."""
        mv.reason = "" if kind == "rebuilt" else reason
        if kind != "progress":
            self.events.emit(kind, mv.name, mv.version, reason=reason)

    def fail(self, mv: ModelVersion, exc: BaseException, during: str = "load") -> bool:
        """Mark `mv` failed by `exc` (its reason says during what) and say so; returns False."""
        mv.state, mv.reason = State.FAILED, f"{during} failed: {exc}"
        release(mv.source)
        mv.source = None
        self.events.emit("failed", mv.name, mv.version, reason=mv.reason)
        return False

    def unload(self, mv: ModelVersion, timeout: float | None = None) -> None:
        """Drain the version's queue, then release its engine."""
        if mv.scheduler is None:
            mv.state = State.UNLOADED
            return
        mv.state = State.DRAINING
        self.events.emit("draining", mv.name, mv.version, queued=mv.scheduler.depth())
        scheduler, mv.scheduler = mv.scheduler, None
        scheduler.stop(timeout)
        if mv.engine is not None:
            mv.engine.close()
        release(mv.source)
        mv.source = None
        mv.engine, mv.memory_bytes, mv.state, mv.reason = None, 0, State.UNLOADED, ""  # a past reason is stale
        release_freed_memory()
        self.events.emit("unloaded", mv.name, mv.version)

    def close(self, timeout: float | None = None) -> None:
        """Drain and unload everything (daemon shutdown)."""
        for mv in self.all_versions():
            if mv.scheduler is not None:
                self.unload(mv, timeout)
        if self.workers is not None:
            self.workers.close()

    def replace(self, old: ModelVersion, mc: ModelConfig) -> bool:
        """Load `mc` beside `old`, swap it in with one assignment, then drain `old`.

        If the new one fails to load or warm up, `old` keeps serving.
        """
        shadow = ModelVersion(mc)
        if not self.load(shadow):
            return False
        with self._lock:
            model = self.models[old.name]
            model.versions = {**model.versions, mc.version: shadow}
        self.events.emit("swapped", mc.name, mc.version, engine=str(mc.engine))
        self.unload(old)
        self.check_fallbacks(mc.name)  # the new engine may take other inputs
        return True

    def remove(self, mv: ModelVersion, timeout: float | None = None) -> None:
        """Drain and unload `mv`, then forget it (its model too, once it has no versions)."""
        self.unload(mv, timeout)
        self.discard(mv)
        self.events.emit("removed", mv.name, mv.version)

    def configure(self, mv: ModelVersion, **changes: Any) -> None:
        """Change settings of a version live; its placement (hot or cold) applies them at once."""
        mv.config = replace(mv.config, **changes)
        placement = mv.scheduler
        if placement is not None:
            placement.apply(Change.of(changes))
        if mv.config.mode == "inproc" and mv.engine is not None and mv.ready:  # contexts: more copies
            mv.memory_bytes = hot_footprint(mv.engine, mv.config)

    def promote(self, name: str, version: str) -> str:
        """Move a version from its worker process into the daemon (cold → hot), losing no request."""
        return moves.promote(self, name, version)

    def demote(self, name: str, version: str) -> str:
        """Move a version from the daemon into a worker process (hot → cold), losing no request."""
        return moves.demote(self, name, version)

    def memory_used(self) -> int:
        return sum(mv.memory_bytes for mv in self.all_versions())

