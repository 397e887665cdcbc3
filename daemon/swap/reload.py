"""Apply a new configuration's models and pipelines to a running daemon.

`App.reload` (app.py; SIGHUP and the admin `reload` both) reads and checks the
file, takes in what it owns (its configuration, limits, client keys) and
has the router configure itself, then calls `apply` here, one reload at a
time. New versions load, removed ones drain and unload, changed settings
apply live; a version whose engine, backend, placement or options changed
is loaded anew beside the serving one and switched in once ready
(`Registry.replace`: models/switch.py). A file that does not validate
changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Protocol

from infermux import config as cfg
from infermux.config import HOT, RELOAD, RESTART, DaemonConfig, ModelConfig, settings_of
from infermux.config.cameras import restarted as cameras_restarted
from infermux.events import EventLog
from infermux.models.overrides import Dropped
from infermux.models.registry import Registry
from infermux.models.version import ModelVersion
from infermux.pipelines.runner import PipelineChanges, Pipelines
from infermux.protocol import Limits
from infermux.sinks.hub import Hub

log = logging.getLogger("infermux.reload")

# What a change to a setting asks for, read from its declaration (config/settings.py): a version loaded
# anew (every other model setting applies in place), or a restart of the daemon.
RELOADING_FIELDS = frozenset(key for key, s in settings_of(ModelConfig).items() if s.applies == RELOAD)
RESTART_FIELDS = tuple(key for key, s in settings_of(DaemonConfig).items() if s.applies == RESTART)


@dataclass
class ReloadPlan:
    """What a new configuration changes, version by version."""

    added: list[ModelConfig] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)
    reloaded: list[ModelConfig] = field(default_factory=list)
    changed: list[tuple[ModelConfig, dict]] = field(default_factory=list)
    restart_needed: list[str] = field(default_factory=list)
    pipelines: PipelineChanges = field(default_factory=PipelineChanges)
    overrides_dropped: list[Dropped] = field(default_factory=list)  # live changes the file overruled
    signing_would_refuse: list[str] = field(default_factory=list)  # loaded versions the new keys refuse
    cameras_restarted: list[str] = field(default_factory=list)  # cameras/supervisor.py restarts them (their
    # settings declared applies=CAMERA changed), by the same rule: config/cameras.py restart_needed

    def summary(self) -> dict[str, list[str]]:
        key = lambda m: f"{m.name}:{m.version}"  # noqa: E731
        return {"added": [key(m) for m in self.added], "removed": [f"{n}:{v}" for n, v in self.removed],
                "reloaded": [key(m) for m in self.reloaded],
                "changed": [f"{key(m)} {sorted(c)}" for m, c in self.changed],
                "restart_needed": self.restart_needed,
                "pipelines_added": self.pipelines.added, "pipelines_removed": self.pipelines.removed,
                "pipelines_changed": self.pipelines.changed,
                "overrides_dropped": [d.summary() for d in self.overrides_dropped],
                "signing_would_refuse": self.signing_would_refuse, "cameras_restarted": self.cameras_restarted}


def plan(old: cfg.Config, new: cfg.Config) -> ReloadPlan:
    """Compare two configurations."""
    result = ReloadPlan()
    before = {m.key: m for m in old.models}
    after = {m.key: m for m in new.models}
    result.added = [m for k, m in after.items() if k not in before]
    result.removed = [k for k in before if k not in after]
    for k in before.keys() & after.keys():
        diff = {f.name: getattr(after[k], f.name) for f in fields(ModelConfig)
                if getattr(after[k], f.name) != getattr(before[k], f.name)}
        if diff.keys() & RELOADING_FIELDS:
            result.reloaded.append(after[k])
        elif diff:
            result.changed.append((after[k], diff))
    result.restart_needed = _restart_needed(old, new)
    result.cameras_restarted = cameras_restarted(old.cameras, new.cameras)
    return result


def _restart_needed(old: cfg.Config, new: cfg.Config) -> list[str]:
    """The keys changed that only a restart applies: the daemon's, and `[snapshots]` (its folder and
    writer are made once, at the start)."""
    out = [f"daemon.{name}" for name in RESTART_FIELDS if getattr(old.daemon, name) != getattr(new.daemon, name)]
    return out + [f"snapshots.{f.name}" for f in fields(type(old.snapshots))
                  if getattr(old.snapshots, f.name) != getattr(new.snapshots, f.name)]


class Daemon(Protocol):
    """What a reload reads of the running daemon (app.py's App); it assigns none of it."""

    registry: Registry
    pipelines: Pipelines
    sinks: Hub
    events: EventLog

    @property
    def limits(self) -> Limits:
        """The new configuration's, already in force."""


def apply(daemon: Daemon, old: cfg.Config, new: cfg.Config) -> ReloadPlan:
    """Move the running daemon's models and pipelines from `old` to `new`, each with the live
    changes that hold over the file (models/overrides.py); returns what changed, the live
    changes the new file overruled among it. The registry, router and server already follow `new`."""
    steps = plan(old, new)
    registry = daemon.registry
    for name, version in steps.removed:
        mv = _version(registry, name, version)
        if mv is not None:
            registry.remove(mv, new.daemon.drain_timeout_s)
    for m, diff in steps.changed:
        mv = _version(registry, m.name, m.version)
        if mv is not None:
            registry.configure(mv, **diff)
    _refresh_fallbacks(registry, new)
    for mv in _add_and_replace(registry, steps):
        if mv.config.placement == HOT or mv.config.preload:
            registry.load(mv)
    steps.pipelines = _apply_pipelines(daemon, new)
    daemon.sinks.apply(new.sinks)
    steps.overrides_dropped = registry.overrides.take_dropped()
    for item in steps.restart_needed:
        log.warning("%s changed: restart the daemon to apply it", item)
    daemon.events.emit("reloaded", **{k: ",".join(v) for k, v in steps.summary().items() if v})
    return steps


def _add_and_replace(registry: Registry, steps: ReloadPlan) -> list[ModelVersion]:
    """Register the added versions and load the reloaded ones anew beside what serves; returns the
    versions registered fresh (not yet loaded)."""
    fresh = []
    for m in steps.added:
        found = _version(registry, m.name, m.version)
        if found is not None and found.ready:  # served from engine_dir already: take the configured settings
            registry.replace(m)
        else:
            fresh.append(registry.add(m))
    for m in steps.reloaded:
        if _version(registry, m.name, m.version) is None:
            fresh.append(registry.add(m))
        else:
            registry.replace(m)
    return fresh


def _apply_pipelines(daemon: Daemon, new: cfg.Config) -> PipelineChanges:
    """Added, removed and changed `[[pipelines]]`, after the models (whose names their steps call)."""
    daemon.pipelines.zones.apply(new.cameras)  # before: a rebuilt pipeline's objects exit the zones as they are now
    changes = daemon.pipelines.apply(new.pipelines, daemon.limits)
    for kind, names in (("added", changes.added), ("removed", changes.removed), ("changed", changes.changed)):
        for name in names:
            daemon.events.emit(f"pipeline_{kind}", pipeline=name)
    return changes


def _version(registry: Registry, name: str, version: str) -> ModelVersion | None:
    model = registry.model(name)
    return model.versions.get(version) if model is not None else None


def _refresh_fallbacks(registry: Registry, new: cfg.Config) -> None:
    chain = registry.overrides.fallbacks(cfg.fallback_of(new.models))
    for name, model in registry.models.items():
        model.fallback = chain.get(name, "")
    registry.check_fallbacks()  # loaded models: a fallback must take the same inputs
