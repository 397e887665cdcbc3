"""Hot swap (docs/architecture.md#hot-swap): make the registry serve what the engine directory holds.

For every change the watcher reports, per model: load each wanted version
whose file is new or changed beside the serving one (same settings, so the
same placement), warm it up, and let it take over in one step; then retire
what is no longer wanted: out of the routing tables first, then — once the
frontend has finished any request it was admitting — drain its queue and
unload it. Both are the registry's switch (models/switch.py: load beside,
switch, drain). So no request ever finds a version gone between being
routed and being queued, and a swap loses none.

A file that fails its checksum, its load or its warm-up never replaces
what serves: the failure is an event and a state (`failed`, or the serving
version's `reason` when it replaced a serving file), and that exact file
is not tried again, even after a pin and unpin; the next file written is.
Under `version_policy = "latest"` the policy then settles on the newest
version that loads: the next newer one on disk is served in the failed
one's place, with a `settled` event saying why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from infermux.config import COLD, Config, ModelConfig
from infermux.models import life, promote
from infermux.models.overrides import file_weights
from infermux.models.registry import Model, ModelVersion, Registry, State, version_key
from infermux.models.verdicts import file_digest
from infermux.swap.repository import (FolderScreen, ModelPlan, SettingsCache, made_before, plan, rollback_from,
                                      same_file, why_ignored)
from infermux.swap.watcher import EngineFile, EngineWatcher, Snapshot, checksum_problem

if TYPE_CHECKING:
    from infermux.events import EventLog
    from infermux.swap.rollout import Rollouts

log = logging.getLogger("infermux.swap")

Key = tuple[Any, ...]  # what an entry was made from: (file sig, checksum and signature sigs, settings)


def file_key(mc: ModelConfig, f: EngineFile) -> Key:
    return (f.sig, f.companions, mc)


class Daemon(Protocol):
    """What the swapper reads of the running daemon (app.py's App): the configuration in force
    (a reload replaces it), the registry it keeps in step, events, and the rollouts it starts."""

    config: Config
    registry: Registry
    events: "EventLog"
    rollouts: "Rollouts"


class Swapper:
    """Keeps the registry in step with the engine directory; pin/unpin ask it to catch up."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.registry: Registry = daemon.registry
        self.events = daemon.events
        settings = daemon.config.daemon
        self.engine_dir = settings.engine_dir
        self.settings = SettingsCache(self.engine_dir, lambda: self.daemon.config.daemon)
        self.screen = FolderScreen()  # refused folder names, symlinks out of engine_dir (repository.py)
        self.watcher = EngineWatcher(self.engine_dir, self.apply, settings.watch_settle_s,
                                     settings.watch_debounce_s, settings.watch_rescan_s)
        self._made_from: dict[tuple[str, str], Key] = {}  # managed entries: what each was made from
        self._announced: dict[tuple[str, str], Key] = {}  # what "detected" last said per version
        self._reported: dict[str, str] = {}               # model.toml errors already reported
        self._bad: dict[tuple[str, str], tuple[Key, str]] = {}  # files that failed to load, and why
        self._settled: dict[str, tuple[str, ...]] = {}    # stand-ins for failed versions, last announced
        self._failures = 0                                # loads that failed in _load, ever
        self._digests: dict[Path, tuple[Any, str]] = {}    # engine file -> (its sig, its sha256): rollout verdicts
        self._last = Snapshot()
        self.registry.catalog = self
        daemon.rollouts.refused = self._refused
        daemon.rollouts.promoted = lambda name: self.watcher.poke()  # retire what the candidate replaced
        daemon.rollouts.retried = self._retried
        self.decisions = daemon.rollouts.decisions
        # A reload changes which versions the configuration lists: look again.
        self.events.subscribe(lambda event: self.watcher.poke() if event.kind == "reloaded" else None)

    @property
    def config(self) -> Config:
        """The configuration in force (SIGHUP replaces it)."""
        return self.daemon.config

    # -- start and stop --------------------------------------------------------

    def initial_scan(self) -> None:
        """Register what engine_dir holds before the hot models load (so READY includes it); files still
        being written at start get up to `watch_settle_s` to finish."""
        self.watcher.watch()
        snapshot = self._scan_settled()
        for name in sorted(snapshot.models()):
            model = self.registry.model(name)
            p = plan(name, snapshot, self.config, self.settings, model.pinned if model else None)
            if self._report(p):
                continue
            p = self._settle(self._hold_back(self._judge(p, snapshot), snapshot), snapshot, None)
            self._list_refused(p, snapshot)
            self._announce_ignored(p, snapshot, model.pinned if model else None)
            for version, (mc, f) in p.wanted.items():
                if version in p.configured:  # the registry has it from the configuration already
                    self._made_from[(name, version)] = file_key(mc, f)
                    entry = self.registry.model(name).versions[version]  # type: ignore[union-attr]
                    self._check_before_start(entry, f)
                elif f.stable:
                    self._detected(f)
                    self._made_from[(name, version)] = file_key(mc, f)
                    bad = self._bad.get((name, version))
                    if bad is not None:  # refused before the restart: listed so, not loaded
                        self.registry.put(ModelVersion(mc, state=State.FAILED, reason=bad[1]))
                        continue
                    self._served(mc, f)
                    self._check_before_start(self.registry.add(self.registry.overrides.reconcile(mc)), f)
        self._last = snapshot

    def _scan_settled(self) -> Snapshot:
        try:
            snapshot = self.watcher.scan()
            for _ in range(3):
                wait = self.watcher.settler.next_check(time.monotonic())
                if wait is None:
                    break
                time.sleep(wait + 0.01)
                snapshot = self.watcher.scan()
        except OSError as exc:
            log.warning("engine directory not scanned: %s; watching for it", exc)
            return Snapshot()
        return self.screen.apply(snapshot, self.config.daemon)

    def _check_before_start(self, mv: ModelVersion, f: EngineFile) -> None:
        problem = checksum_problem(f)
        if problem:  # start_models loads only unloaded versions: this one stays failed
            self._fail(mv, f"checksum failed: {problem}")

    def start(self) -> None:
        """Handle changes from now on (call once the initial loads are done)."""
        self.watcher.start()

    def stop(self) -> None:
        self.watcher.stop()

    # -- the Catalog the registry's pin/unpin use ------------------------------

    def versions_on_disk(self, name: str) -> set[str]:
        return set(self._last.versions(name))

    def pins_changed(self, name: str) -> None:
        self.watcher.poke()

    # -- one pass -----------------------------------------------------------------

    def apply(self, snapshot: Snapshot) -> None:
        """Bring every model in line with `snapshot` (runs on the watcher thread)."""
        snapshot = self.screen.apply(snapshot, self.config.daemon)
        self._last = snapshot
        managed = {name for name, _ in self._made_from}
        for name in sorted(snapshot.models() | managed, key=str):
            for _ in range(len(snapshot.versions(name)) + 1):  # each failed load may settle one further
                if not self._apply_model(name, snapshot):
                    break
        self._forget_gone(snapshot)

    def _apply_model(self, name: str, snapshot: Snapshot) -> bool:
        """One pass over one model; True if a version failed to load in it (plan again: it settles)."""
        model = self.registry.model(name)
        pinned = model.pinned if model else None
        p = self._settle(self._judge(plan(name, snapshot, self.config, self.settings, pinned), snapshot), snapshot,
                         pinned)
        if self._report(p):
            return False
        self._announce_ignored(p, snapshot, pinned)
        failures = self._failures
        failed = {v for v, (_, f) in p.wanted.items() if self._is_bad(p.name, v, f)}  # as planned: their stand-ins
        self._cancel_unwanted_candidate(p)
        for version in sorted(p.wanted, key=version_key):
            self._update(p, version)
        if self._failures > failures:
            return True
        self._retire_unwanted(p, failed)
        return False

    def _is_bad(self, name: str, version: str, f: EngineFile) -> bool:
        """Whether this very file of `version` failed to load (here, or in the loads at start)."""
        sig = (f.sig, f.companions)
        if (name, version) in self._bad:
            return self._bad[(name, version)][0][:2] == sig
        model = self.registry.model(name)
        mv = model.versions.get(version) if model else None
        made = self._made_from.get((name, version))
        if mv is not None and mv.state is State.FAILED and made is not None and made[:2] == sig:
            self._bad[(name, version)] = (made, mv.reason)
            return True
        return False

    def _settle(self, p: ModelPlan, snapshot: Snapshot, pinned: str | None) -> ModelPlan:
        """Under "latest", serve the newest versions that load: one more per failed one (it stays listed)."""
        files = snapshot.versions(p.name)
        chosen = [v for v in p.wanted if v not in p.configured]
        failed = [v for v in chosen if self._is_bad(p.name, v, p.wanted[v][1])]
        if pinned is not None or not failed or p.wanted[failed[0]][0].version_policy != "latest":
            self._settled.pop(p.name, None)
            return p
        stand_ins = self._stand_ins(p, files, failed)
        template = p.wanted[failed[0]][0]
        for v in stand_ins:
            p.wanted[v] = (replace(template, version=v, engine=files[v].path), files[v])
        if self._settled.get(p.name) != tuple(stand_ins):
            self._settled[p.name] = tuple(stand_ins)
            self._say_settled(p.name, failed, stand_ins, template)
        return p

    def _stand_ins(self, p: ModelPlan, files: dict[str, EngineFile], failed: list[str]) -> list[str]:
        """Up to one per failed version: the newest unlisted, complete, not failed files older than they are."""
        listed = {mc.version for mc in self.config.versions(p.name)}
        older = [v for v in sorted(files, key=version_key, reverse=True)
                 if v not in p.wanted and v not in listed and files[v].stable and not self._is_bad(p.name, v, files[v])
                 and version_key(v) < max(version_key(x) for x in failed)]
        return older[:len(failed)]

    def _say_settled(self, name: str, failed: list[str], stand_ins: list[str], template: ModelConfig) -> None:
        """The `settled` event: why the failed versions do not serve, and what serves instead."""
        reasons = "; ".join(f"version {v}: {self._bad[(name, v)][1]}" for v in failed)
        serving = f"serving version {', '.join(stand_ins)}, the newest that loads" if stand_ins \
            else "no older version is on disk to serve instead"
        if stand_ins and (template.strategy or self.config.routing.strategy) == "weighted":
            serving += ", at its weight's share of the requests (`infermux status` shows each version's share)"
        self.events.emit("settled", name, ",".join(stand_ins), reason=f"{reasons}; {serving}")

    def _forget_gone(self, snapshot: Snapshot) -> None:
        """Drop what was announced about files no longer on disk (one published again is news again): else
        `_announced` kept an entry for every version ever published, unbounded under churn."""
        for key in [key for key in self._announced if key not in snapshot.engines]:
            del self._announced[key]
        for key in [key for key in self._bad if key not in snapshot.engines]:
            del self._bad[key]

    def _report(self, p: ModelPlan) -> bool:
        """Report a broken model.toml once; True if the model must be left as it is."""
        if not p.error:
            self._reported.pop(p.name, None)
            return False
        if self._reported.get(p.name) != p.error:
            self._reported[p.name] = p.error
            self.events.emit("failed", p.name, reason=f"settings not applied: {p.error}")
        return True

    def _update(self, p: ModelPlan, version: str) -> None:
        """Load `version` if its file or settings changed since its entry was made."""
        mc, f = p.wanted[version]
        key, made = file_key(mc, f), self._made_from.get((p.name, version))
        if made == key:
            return  # serving from this very file, or failed on it: wait for the next one
        model = self.registry.model(p.name)
        current = model.versions.get(version) if model else None
        mc = promote.kept_move(made_before(made, key), current, mc)  # an operator's move holds
        if made is not None and made[:2] == key[:2] and current is not None and \
                current.config == self.registry.overrides.apply(mc):
            self._made_from[(p.name, version)] = key  # a reload already applied these settings (live ones over them)
            return
        if not f.stable:
            return  # still being written: the watcher looks again once it settles
        self._detected(f)
        if current is not None and current.state in (State.LOADING, State.WARMING):
            return  # someone else is loading it (on demand); look again on the next pass
        self._made_from[(p.name, version)] = key
        bad = self._bad.get((p.name, version))
        if bad is not None and bad[0][:2] == key[:2]:  # failed before (say, until a pin retired it): not again
            if current is None or current.state is not State.READY:
                self.registry.put(ModelVersion(mc, state=State.FAILED, reason=bad[1]))
            return
        self._bad.pop((p.name, version), None)
        self._load(mc, f, current, p.on_disk, same_file(made, key, current))

    def _detected(self, f: EngineFile, ignored: str = "") -> None:
        """Announce each complete engine file once (again when it changes), and whether it will be served."""
        key = (f.sig, f.companions)
        if self._announced.get((f.model, f.version)) != key:
            self._announced[(f.model, f.version)] = key
            extra = {"ignored": ignored} if ignored else {}
            self.events.emit("detected", f.model, f.version, file=f.path.name, bytes=f.sig.size, **extra)

    def _announce_ignored(self, p: ModelPlan, snapshot: Snapshot, pinned: str | None) -> None:
        configured = {mc.version: mc for mc in self.config.versions(p.name)}
        for version, f in snapshot.versions(p.name).items():
            if version not in p.wanted and f.stable:
                self._detected(f, why_ignored(configured.get(version), pinned))

    def _load(self, mc: ModelConfig, f: EngineFile, current: ModelVersion | None, disk: set[str], same: bool) -> None:
        """Load beside what serves; take over only once warm; never make things worse (`same`: `same_file`)."""
        started = time.monotonic()
        model = self.registry.model(mc.name)
        before = model.default() if model else None
        replacing = current is not None and current.state is State.READY
        mc = self.registry.overrides.reconcile(mc) if replacing or model is None else self._inherit(model, mc)
        mv = ModelVersion(mc)
        problem = checksum_problem(f)
        rollback = rollback_from(before, mc.version, disk)
        serving = current if replacing else None
        if not problem and self._deferred(mc, f, mv, serving, before, rollback, same):
            return
        mv, loaded = self._load_engine(mv, problem, replacing)
        if not loaded:
            self._not_loaded(mc, f, mv, serving)
            return
        previous = self.registry.switch.switch(mv) if replacing else None  # every request from now on: the new engine
        self._served(mc, f)
        self._say_loaded(mc, mv, before, rollback, started)
        if previous is not None:
            self.registry.switch.drain(previous)

    def _deferred(self, mc: ModelConfig, f: EngineFile, mv: ModelVersion, serving: ModelVersion | None,
                  before: ModelVersion | None, rollback: str, same_file: bool) -> bool:
        """True where the version is not loaded now: a rollout shadows it first, or a cold model's is registered,
        to be loaded by the first request. `serving`: the file of its own that serves now (None: a new version)."""
        if mc.rollout is not None and before is not None and before.ready and not rollback and not same_file:
            self._shadow(mc, f, serving)
            return True
        if serving is None and mc.placement == COLD and not mc.preload and not rollback:
            self.registry.put(mv)  # a cold model: registered now, loaded by the first request for it
            return True
        return False

    def _load_engine(self, mv: ModelVersion, problem: str, replacing: bool) -> tuple[ModelVersion, bool]:
        """Load the engine, beside the serving file where it replaces one: the version, and whether it loaded."""
        if problem:
            self._fail(mv, f"checksum failed: {problem}")
            return mv, False
        if replacing:
            mv = self.registry.switch.load_beside(mv.config)
            return mv, mv.ready
        self.registry.put(mv)  # visible as loading: requests naming it get 503 + retry
        return mv, self.registry.load(mv)

    def _say_loaded(self, mc: ModelConfig, mv: ModelVersion, before: ModelVersion | None, rollback: str,
                    started: float) -> None:
        """`rolled_back` where it stands in for a removed version folder; `swapped` where it is now the default."""
        if rollback:
            life.say(self.events, mv, "rolled_back", **{"from": rollback},
                             reason=f"version {rollback}'s engine folder was removed; version {mc.version}, the "
                                    f"newest older version that loads, serves without shadowing")
        after = self.registry.model(mc.name)
        if after is not None and after.default() is mv:
            life.say(self.events, mv, "swapped", previous=_label(before, mv),
                             took_ms=round((time.monotonic() - started) * 1000), **self._traffic(after, mv))

    def _not_loaded(self, mc: ModelConfig, f: EngineFile, mv: ModelVersion, replacing: ModelVersion | None) -> None:
        """A new engine failed: a new file of a serving version leaves it serving, saying why; a new
        version is listed failed, and that file is not tried again."""
        if replacing is not None:
            replacing.reason = f"new engine file rejected ({mv.reason}); serving the previous file"
            return
        self._bad[mc.key] = (file_key(mc, f), mv.reason)
        self._failures += 1
        self.registry.put(mv)  # the failure is this version's state

    def _inherit(self, model: Model, mc: ModelConfig) -> ModelConfig:
        """A new version takes the live settings of the version it supersedes (the newest older
        one) and, under `weighted` routing with weights in force, a share: `canary_weight`, else
        the weight of the version it supersedes. An `inherited` event says what it took."""
        mc = self.registry.overrides.reconcile(mc)  # its own live changes first (a restart, a version back)
        older = [mv for mv in model.ordered() if version_key(mv.version) < version_key(mc.version)]
        superseded = older[-1].version if older else None
        share = None
        weights = self._weights(model)
        if weights:
            share = mc.canary_weight or (weights.get(superseded, 0) if superseded is not None else 0)
        mc, taken = self.registry.overrides.inherit(mc, superseded, share)
        if taken:
            self.events.emit("inherited", mc.name, mc.version, **{"from": superseded or "-"},
                             **{k: ",".join(map(str, v)) if isinstance(v, tuple) else v for k, v in taken.items()})
        return mc

    def _traffic(self, model: Model, mv: ModelVersion) -> dict[str, Any]:
        """What a new default gets under `weighted` routing: its weight and share, said outright
        when that is no traffic at all."""
        weights = self._weights(model)
        if not weights:
            return {}
        total = sum(weights.get(ready.version, 0) for ready in model.ready_versions())
        weight = weights.get(mv.version, 0)
        share = weight / total if total else 0.0
        told = {"weight": weight, "share": f"{share:.0%}"}
        if not share:
            told["note"] = f"no traffic until `infermux ctl set {mv.name} weights=...` gives it a weight"
        return told

    def _weights(self, model: Model) -> dict[str, int]:
        """The weights `weighted` routing spreads `model`'s traffic by; {} when it is not routed so,
        or no weight is given (then the default version serves)."""
        if model.strategy(self.config.routing.strategy) != "weighted":
            return {}
        weights = self.registry.overrides.weights_of(model.name, file_weights(self.config))
        return weights if any(weights.values()) else {}
    # -- rollout verdicts (models/verdicts.py) ------------------------------------

    def _digest(self, f: EngineFile) -> str:
        """sha256 of `f`, read again only when the file changed."""
        known = self._digests.get(f.path)
        if known is None or known[0] != f.sig:
            known = (f.sig, file_digest(f.path))
            self._digests[f.path] = known
        return known[1]

    def _served(self, mc: ModelConfig, f: EngineFile) -> None:
        """A version of a model with a rollout table serves without shadowing (its first, a rollback): kept,
        so that after a restart it serves and newer versions shadow it again (what passed stays "passed")."""
        if mc.rollout is not None and not self.decisions.good(mc.name, mc.version, digest := self._digest(f)):
            self.decisions.record(mc.name, mc.version, digest, "served")

    def _judge(self, p: ModelPlan, snapshot: Snapshot) -> ModelPlan:
        """A version on disk whose file a rollout refused (before a restart too) counts as failed: listed
        with the reason when wanted, never a stand-in, and `_settle` serves the newest older one instead."""
        template = next(iter(p.wanted.values()), None)
        if template is None or template[0].rollout is None:
            return p
        for version, f in snapshot.versions(p.name).items():
            if version in p.configured or not f.stable:
                continue
            why = self.decisions.refused(p.name, version, self._digest(f))
            known = self._bad.get((p.name, version))
            if why and (known is None or known[0][:2] != (f.sig, f.companions)):
                mc = replace(template[0], version=version, engine=f.path)
                self._bad[(p.name, version)] = (file_key(mc, f), why)
        return p

    def _hold_back(self, p: ModelPlan, snapshot: Snapshot) -> ModelPlan:
        """At start, a wanted version never judged (say, a candidate when the daemon stopped) does not
        serve without shadowing while an older version that passed or served is on disk: that one
        serves, and the watcher's first look makes the newer one its candidate."""
        files = snapshot.versions(p.name)
        for version, (mc, f) in sorted(p.wanted.items(), key=lambda item: version_key(item[0])):
            if mc.rollout is None or version in p.configured or self._is_bad(p.name, version, f) \
                    or self.decisions.good(p.name, version, self._digest(f)):
                continue  # a refused one is `_settle`'s: it stands in the newest older one that loads
            good = [v for v in sorted(files, key=version_key, reverse=True) if version_key(v) < version_key(version)
                    and files[v].stable and self.decisions.good(p.name, v, self._digest(files[v]))]
            if good and good[0] not in p.wanted:
                del p.wanted[version]
                p.wanted[good[0]] = (replace(mc, version=good[0], engine=files[good[0]].path), files[good[0]])
                self.events.emit("held_back", p.name, version, reason=f"never judged by its rollout: version "
                                 f"{good[0]} serves, and {version} shadows it once the daemon is up")
        return p

    def _list_refused(self, p: ModelPlan, snapshot: Snapshot) -> None:
        """At start, versions on disk that their rollout refused before are listed, failed with the reason,
        whether the version policy wants them or not."""
        template = next(iter(p.wanted.values()), None)
        if template is None or template[0].rollout is None:
            return
        for version, f in snapshot.versions(p.name).items():
            why = self.decisions.refused(p.name, version, self._digest(f)) if f.stable else ""
            if not why or version in p.wanted or version in p.configured:
                continue
            mc = replace(template[0], version=version, engine=f.path)
            self._made_from[(p.name, version)] = file_key(mc, f)
            self._bad[(p.name, version)] = (file_key(mc, f), why)
            self.registry.put(ModelVersion(mc, state=State.FAILED, reason=why))

    def _retried(self, name: str, version: str) -> None:
        """An operator asked to shadow a refused version again: its file is news again."""
        self._bad.pop((name, version), None)
        self._made_from.pop((name, version), None)
        model = self.registry.model(name)
        current = model.versions.get(version) if model is not None else None
        if current is not None and current.ready and current.reason.startswith("new engine file rejected"):
            current.reason = ""
        self.watcher.poke()

    def _shadow(self, mc: ModelConfig, f: EngineFile, replacing: ModelVersion | None) -> None:
        """A model with `[models.rollout]`: the new engine loads beside what serves as its candidate,
        which shadows live requests until it is promoted or refused (swap/rollout.py)."""
        assert mc.rollout is not None
        candidate = self.daemon.rollouts.load(mc)
        if candidate.ready:
            self.daemon.rollouts.start(candidate, mc, self._digest(f))
        elif replacing is not None:
            replacing.reason = f"new engine file rejected ({candidate.reason}); serving the previous file"
        else:
            self._bad[mc.key] = (file_key(mc, f), candidate.reason)
            self._failures += 1
            self.registry.put(candidate)  # the failure is this version's state

    def _refused(self, candidate: ModelVersion, reason: str) -> None:
        """A rollout refused `candidate`: its file is not tried again, and what serves says why."""
        model = self.registry.model(candidate.name)
        current = model.versions.get(candidate.version) if model is not None else None
        if current is not None and current.ready:  # it would have replaced this very version's file
            current.reason = f"new engine file rejected ({reason}); serving the previous file"
        else:
            made = self._made_from.get(candidate.config.key)
            if made is not None:
                self._bad[candidate.config.key] = (made, reason)
        self.watcher.poke()

    def _cancel_unwanted_candidate(self, p: ModelPlan) -> None:
        """A candidate whose version the plan no longer wants (a pin, a newer version, its file removed) is
        unloaded; it was never judged, so its file is tried again once the plan wants it back."""
        rollout = self.daemon.rollouts.by_model.get(p.name)
        if rollout is None or rollout.candidate.version in p.wanted:
            return
        version = rollout.candidate.version
        model = self.registry.model(p.name)
        pinned = model.pinned if model is not None else None
        newer = [v for v in p.wanted if version_key(v) > version_key(version)]
        why = (f"pinned to {pinned}" if pinned else f"superseded by version {max(newer, key=version_key)}" if newer
               else "its engine file was removed" if version not in p.on_disk else "no longer wanted")
        self.daemon.rollouts.cancel(p.name, why)
        self._made_from.pop((p.name, version), None)

    def _retire_unwanted(self, p: ModelPlan, failed: set[str]) -> None:
        """Drain versions the plan dropped: at once if their file is gone, else once the wanted ones serve
        (`failed`: wanted versions already failed when the plan was made, so their stand-ins are in it)."""
        model = self.registry.model(p.name)
        if model is None:
            return
        # A version that had failed does not hold the others back once one wanted version serves. One refused
        # since the plan was made (inside this pass, or by the shadow thread) does, until the next pass plans
        # its stand-in: else the version that stands in would be retired, then loaded again as a candidate.
        wanted_ready = all(_ready(model, v) or v in failed for v in p.wanted) and any(_ready(model, v) for v in p.wanted)
        for mv in model.ordered():
            if (p.name, mv.version) not in self._made_from or mv.version in p.wanted:
                continue
            removed = mv.version not in p.on_disk
            if not self._stays(p, model, mv, removed, wanted_ready):
                self._retire(p, mv, removed)

    def _stays(self, p: ModelPlan, model: Model, mv: ModelVersion, removed: bool, wanted_ready: bool) -> bool:
        """True where a version the plan dropped stays for now (`removed`: its file is gone)."""
        if not (removed or wanted_ready):
            return True  # e.g. the new version failed: the old one keeps serving
        if not removed and mv.state is State.FAILED and mv.config.rollout is not None \
                and self._is_bad(p.name, mv.version, self._last.versions(p.name)[mv.version]):
            return True  # refused by its rollout: listed, saying why, while its file is there
        if removed and p.wanted and mv.ready and not any(o.ready for o in model.ordered() if o is not mv):
            self._keep_last(mv)  # its folder went, but nothing else serves the model yet
            return True
        return False

    def _retire(self, p: ModelPlan, mv: ModelVersion, removed: bool) -> None:
        """Drain a dropped version; a configured one stays listed, without its file."""
        del self._made_from[(p.name, mv.version)]
        if mv.version in {mc.version for mc in self.config.versions(p.name)}:
            # A configured version stays known (requests naming it get 503) until its file is back.
            gone = ModelVersion(mv.config, reason="engine file removed")
            self.registry.put(gone)
        else:
            self.registry.discard(mv)
        self.registry.switch.drain(mv, "engine file removed" if removed else "superseded")

    def _keep_last(self, mv: ModelVersion) -> None:
        """A model that had a serving version keeps one: the last one ready stays, from memory, until
        another version of the model serves (said once)."""
        reason = "its engine folder was removed; it serves until another version of the model does"
        if mv.reason != reason:
            mv.reason = reason
            self.events.emit("kept", mv.name, mv.version, reason=reason)

    def _fail(self, mv: ModelVersion, reason: str) -> None:
        mv.state, mv.reason = State.FAILED, reason
        life.say(self.events, mv, "failed", reason=reason)


def _ready(model: Model, version: str) -> bool:
    mv = model.versions.get(version)
    return mv is not None and mv.state is State.READY


def _label(before: ModelVersion | None, mv: ModelVersion) -> str:
    if before is None:
        return "none"
    return f"{before.version} (previous file)" if before.version == mv.version else before.version


def attach(daemon: Daemon) -> Swapper | None:
    """The composition root's hook (app.py): scan engine_dir into the registry; None when
    `[daemon] watch = false`."""
    if not daemon.config.daemon.watch:
        return None
    swapper = Swapper(daemon)
    swapper.initial_scan()
    return swapper
