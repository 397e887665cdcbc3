"""The registry: every model, its versions (models/version.py), their engines and placements.

Loads run on loader threads; the frontend reads states and placements
without locks (each is replaced in one assignment). A version is placed by
the placer of its `placement` (models/placer.py: hot in this process, cold
in a worker process); the registry keeps the memory budget for both
(models/memory.py) and replaces what serves a version through one switch
(models/switch.py). The states of a version:
docs/architecture.md#states-of-a-model-version.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator, Protocol, Sequence

from infermux.config import COLD, HOT, Config, ModelConfig
from infermux.events import EventLog
from infermux.execution.hooks import FrontendHooks
from infermux.execution.placement import Change, Placement
from infermux.models import life
from infermux.models import fallback as fallbacks
from infermux.models import promote as moves
from infermux.models.budget import BudgetExceeded, MemoryBudget, release_freed_memory
from infermux.models.hot import HotPlacer, WarmShape, no_shapes
from infermux.models.memory import MemoryKeeper
from infermux.models.overrides import Overrides
from infermux.models.placer import LoadFailed, Placer, missing_engine
from infermux.models.switch import Switch
from infermux.models.verified import EngineSigning, SignatureRefused, release
from infermux.models.version import Model, ModelVersion, State, version_key

__all__ = ["Catalog", "Model", "ModelVersion", "Registry", "State", "version_key"]

log = logging.getLogger("infermux.registry")

REFUSED_RETRY_S = 1.0  # a load refused for memory is tried again on demand after this


class Catalog(Protocol):
    """What pin/unpin need from the engine-directory watcher (swap/swapper.py)."""

    def versions_on_disk(self, name: str) -> set[str]: ...

    def pins_changed(self, name: str) -> None: ...


class Registry:
    """Models by name; loads and unloads versions on loader threads.

    `hooks` are the frontend's callbacks (execution/hooks.py), handed to the placers and the
    switch. `placers` holds a placer per placement: hot from the start, cold once the
    composition root adds the worker pool (`add_placer`, app.py). `overrides` are the
    operators' live changes (restored from the state file at start): every version added
    takes those that still hold.
    """

    def __init__(self, config: Config, events: EventLog, hooks: FrontendHooks,
                 overrides: Overrides | None = None) -> None:
        self.config = config
        self.events = events
        self.hooks = hooks
        self.overrides = overrides if overrides is not None else Overrides(events)
        self.models: dict[str, Model] = {}
        self.catalog: Catalog | None = None  # the engine-directory watcher, when there is one
        self.signing: EngineSigning | None = None  # set by the Server under engine_signing_keys (verified.py)
        self._lock = threading.Lock()
        self.memory = MemoryKeeper(self, MemoryBudget(config.daemon.memory_budget, config.path))
        self.placers: dict[str, Placer] = {}
        # The shapes its pipelines send a model, to warm it at (the Server sets it: pipelines/warmshapes.py).
        self.warm_shapes: Callable[[str], Sequence[WarmShape]] = no_shapes
        self.add_placer(HotPlacer(hooks, self.warming, lambda: self.config.routing.strategy,
                                  lambda name: self.warm_shapes(name)))
        self.switch = Switch(self, hooks.quiesce)
        self._changing: set[tuple[str, str]] = set()  # versions being moved or stopped (`claim`)
        self._refused: dict[tuple[str, str], float] = {}  # refused for memory: when on demand may try again
        self.overrides.follow(config)  # a file changed while the daemon was stopped wins where it differs
        for mc in config.models:
            self.add(self.overrides.apply(mc))

    def add_placer(self, placer: Placer) -> None:
        """Place versions of `placer.kind` with it."""
        self.placers = {**self.placers, placer.kind: placer}

    def follow(self, config: Config) -> None:
        """The configuration in force from now on (a reload): budget, strategies, workers read it."""
        self.config = config

    def add(self, mc: ModelConfig) -> ModelVersion:
        """Register a version (not loaded yet) with the settings `mc` (live changes included)."""
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
        self.overrides.forget(mv.name, mv.version, "version no longer served")
        if not versions:
            self.overrides.forget_model(mv.name, "model no longer served")

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
        """Every version of every model, and each model's candidate (swap/rollout.py), which no request
        reaches but which holds memory and shows in every view."""
        return [mv for m in self.models.values() for mv in (*m.ordered(), *([m.candidate] if m.candidate else []))]

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
        if mv.config.placement != COLD:
            return
        if mv.state is State.UNLOADED or (mv.state is State.FAILED and self._may_retry(mv)):
            self.start_loading([mv])

    def _may_retry(self, mv: ModelVersion) -> bool:
        """Whether a failed version may be loaded again on demand (a refusal, after a pause)."""
        at = self._refused.get(mv.config.key)
        return at is not None and time.monotonic() >= at

    def _mark_loading(self, mv: ModelVersion) -> None:
        mv.state, mv.reason, mv.load_started = State.LOADING, "", time.monotonic()

    def load(self, mv: ModelVersion) -> bool:
        """Load, warm up and start serving one version; False (state failed) on error.

        The same for both placements: make room in the memory budget, have the version's
        placer load it (models/placer.py), then one finishing step (`_placed`).
        """
        mc = mv.config
        placer = self.placers.get(mc.placement)
        if mv.state is not State.LOADING:  # not on demand: an operator's load forgets past crashes and refusals
            self._refused.pop(mc.key, None)
            if placer is not None:
                placer.forgive(mv)
            self._mark_loading(mv)
        life.say(self.events, mv, "loading", engine=str(mc.engine))
        try:
            if placer is None:
                raise LoadFailed(f"placement {mc.placement!r} is not available in this daemon; use "
                                 f"placement = {HOT!r}")
            if not mc.engine.exists():  # said here, before anything is evicted for it or a worker is started
                raise LoadFailed(missing_engine(mc.engine))
            self._admit(mv)  # under engine_signing_keys the placer loads mv.source, the checked copy
            self.memory.make_room(mv)  # may stop idle cold workers; BudgetExceeded if it cannot fit
            placement = placer.load(mv)
        except SignatureRefused as exc:
            return self.fail(mv, exc, during="signature check")
        except BudgetExceeded as exc:
            return self._refuse(mv, exc)
        except LoadFailed as exc:
            return self.fail(mv, exc, during=exc.during)
        except Exception as exc:
            return self.fail(mv, exc)
        self._placed(mv, placement)
        return True

    def _admit(self, mv: ModelVersion) -> None:
        """Under engine_signing_keys, check `mv`'s engine and set `mv.source` to the private copy of
        the checked bytes that its placer loads (SignatureRefused if no signature checks out;
        models/verified.py). A discovered model's backend and options come from its model.toml,
        which the signature covers too."""
        release(mv.source)
        mv.source = None
        if self.signing is not None:
            mv.source = self.signing.admit(mv.config, from_settings=not self.config.versions(mv.name))

    def warming(self, mv: ModelVersion, backend: str) -> None:
        """A placer loaded `mv`'s engine and starts warming it up (the `Warming` hook of both)."""
        mv.state = State.WARMING
        self.events.emit("warming", mv.name, mv.version, backend=backend)

    def _placed(self, mv: ModelVersion, placement: Placement) -> None:
        """The one finishing step of every load, hot or cold: `mv` serves from `placement`."""
        mc = mv.config
        mv.engine, mv.placement = placement.engine, placement
        mv.memory_bytes = self.memory.placed(mc, placement)
        mv.last_load_s = time.monotonic() - mv.load_started
        mv.reason = ""
        mv.state = State.READY
        worker = placement.worker_info()
        where = {"pid": worker["pid"], "engine_ms": worker["load_ms"]} if worker is not None else {}
        life.say(self.events, mv, "loaded", backend=placement.backend, contexts=mc.contexts,
                         load_ms=round(mv.last_load_s * 1000), memory_mb=round(mv.memory_bytes / 2**20, 1),
                         placement=placement.kind, **where)
        self.memory.settle(mv)
        self.check_fallbacks(mc.name)
        watch = getattr(placement.engine, "watch", None)
        if callable(watch):  # an engine that changes while it serves: a TensorRT plan rebuilding
            watch(lambda kind, reason: self._engine_news(mv, kind, reason))

    def _refuse(self, mv: ModelVersion, exc: BudgetExceeded) -> bool:
        """The memory budget refused `mv` (the keeper said why, as a `refused` event); on demand,
        a cold version is tried again after a pause."""
        self._refused[mv.config.key] = time.monotonic() + REFUSED_RETRY_S
        mv.state, mv.reason = State.FAILED, f"refused: {exc}"
        return False

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
        life.say(self.events, mv, "failed", reason=mv.reason)
        return False

    def unload(self, mv: ModelVersion, timeout: float | None = None, reason: str = "unloaded") -> None:
        """Drain the version's queue, then release its engine; `reason` says why, when not asked
        for by name (replaced, idle, evicted, promoted...)."""
        placement = mv.placement
        if placement is None:
            mv.state = State.UNLOADED
            return
        why = {"reason": reason} if reason != "unloaded" else {}
        mv.state = State.DRAINING
        life.say(self.events, mv, "draining", queued=placement.depth(), **why)
        mv.placement = None
        placement.stop(timeout, reason)
        if mv.engine is not None:
            mv.engine.close()
        release(mv.source)
        mv.source = None
        mv.engine, mv.memory_bytes, mv.state, mv.reason = None, 0, State.UNLOADED, ""  # a past reason is stale
        release_freed_memory()
        life.say(self.events, mv, "unloaded", **why)

    def close(self, timeout: float | None = None) -> None:
        """Drain and unload everything (daemon shutdown), then let the placers end what is left."""
        for mv in self.all_versions():
            if mv.placement is not None:
                self.unload(mv, timeout, reason="daemon stopping")
        for placer in self.placers.values():
            placer.close()

    def replace(self, mc: ModelConfig) -> bool:
        """Load `mc` beside what serves its version, switch to it, drain the old (models/switch.py).

        If the new one fails to load or warm up, the old one keeps serving.
        """
        return self.switch.replace(mc)

    def remove(self, mv: ModelVersion, timeout: float | None = None) -> None:
        """Drain and unload `mv`, then forget it (its model too, once it has no versions)."""
        self.unload(mv, timeout)
        self.discard(mv)
        self.events.emit("removed", mv.name, mv.version)

    def configure(self, mv: ModelVersion, **changes: Any) -> None:
        """Change settings of a version live; its placement (hot or cold) applies them at once."""
        fewer = changes.get("contexts", mv.config.contexts) < mv.config.contexts
        mv.config = replace(mv.config, **changes)
        placement = mv.placement
        if placement is not None:
            placement.apply(Change.of(changes))
            if placement.kind == HOT and mv.ready:  # contexts: more copies (a worker's is measured by its pool)
                mv.memory_bytes = placement.footprint()
        if fewer:  # the removed contexts' sessions are gone: hand their memory back to the system
            release_freed_memory()

    def promote(self, name: str, version: str) -> str:
        """Move a version from its worker process into the daemon (cold → hot), losing no request."""
        return moves.promote(self, name, version)

    def demote(self, name: str, version: str) -> str:
        """Move a version from the daemon into a worker process (hot → cold), losing no request."""
        return moves.demote(self, name, version)

    def memory_used(self) -> int:
        return sum(mv.memory_bytes for mv in self.all_versions())

    # -- keeping others off a version that changes -----------------------------------------

    def claim(self, mv: ModelVersion) -> bool:
        """Mark `mv` as being moved or stopped, unless something else already is: False then.
        Idle unload, eviction and another move keep off a claimed version (`release`)."""
        with self._lock:
            if mv.config.key in self._changing:
                return False
            self._changing.add(mv.config.key)
            return True

    def release(self, mv: ModelVersion) -> None:
        with self._lock:
            self._changing.discard(mv.config.key)

    def changing(self, mv: ModelVersion) -> bool:
        """Whether something is moving or stopping `mv` now (`claim`)."""
        return mv.config.key in self._changing

    @contextmanager
    def claimed(self, mv: ModelVersion) -> Iterator[None]:
        """`claim` for a block; ValueError if something else already changes `mv`."""
        if not self.claim(mv):
            raise ValueError(f"{mv.name}:{mv.version} is already being moved or stopped; try again")
        try:
            yield
        finally:
            self.release(mv)

