"""Apply a new configuration to a running daemon (SIGHUP, admin `reload`).

New versions load, removed ones drain and unload, changed settings apply
live; a version whose engine, backend, mode or options changed is loaded
anew beside the serving one and swapped in once ready. A file that does not
validate changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from infermux import config as cfg
from infermux.config import ModelConfig
from infermux.models.version import ModelVersion
from infermux.pipelines.runner import PipelineChanges
from infermux.transport.limits import limits_from
from infermux.transport.curve import CurveError

if TYPE_CHECKING:
    from infermux.frontend.server import Server

log = logging.getLogger("infermux.reload")

# Settings that need the engine loaded again; every other one applies live.
RELOADING_FIELDS = {"engine", "backend", "mode", "options"}
LIVE_FIELDS = {"contexts", "max_queue", "timeout_ms", "max_batch", "batch_delay_us", "preferred_batch",
               "idle_unload_s", "preload", "weight", "default", "strategy", "fallback", "queue_policy",
               "per_key_depth"}


@dataclass
class ReloadPlan:
    """What a new configuration changes, version by version."""

    added: list[ModelConfig] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)
    reloaded: list[ModelConfig] = field(default_factory=list)
    changed: list[tuple[ModelConfig, dict]] = field(default_factory=list)
    restart_needed: list[str] = field(default_factory=list)
    pipelines: PipelineChanges = field(default_factory=PipelineChanges)

    def summary(self) -> dict[str, list[str]]:
        key = lambda m: f"{m.name}:{m.version}"  # noqa: E731
        return {"added": [key(m) for m in self.added], "removed": [f"{n}:{v}" for n, v in self.removed],
                "reloaded": [key(m) for m in self.reloaded],
                "changed": [f"{key(m)} {sorted(c)}" for m, c in self.changed],
                "restart_needed": self.restart_needed,
                "pipelines_added": self.pipelines.added, "pipelines_removed": self.pipelines.removed,
                "pipelines_changed": self.pipelines.changed}


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
    for name in ("listen", "admin", "stats", "runtime_dir", "metrics_port", "metrics_host", "curve_secret_key",
                 "curve_authorized_dir", "allow_insecure_tcp"):
        if getattr(old.daemon, name) != getattr(new.daemon, name):
            result.restart_needed.append(f"daemon.{name}")
    return result


def apply(server: "Server", new: cfg.Config) -> ReloadPlan:
    """Move the running daemon to `new`; returns what changed."""
    steps = plan(server.config, new)
    registry = server.registry
    registry.config = new
    server.router.routing = new.routing
    server.config = new
    server.limits = limits_from(new.daemon)
    if server.curve is not None:
        _reread_client_keys(server)
    server.router.weights = {}
    for m in new.models:
        if m.weight:
            server.router.weights.setdefault(m.name, {})[m.version] = m.weight
    for name, version in steps.removed:
        mv = _version(server, name, version)
        if mv is not None:
            registry.remove(mv, new.daemon.drain_timeout_s)
    for m, diff in steps.changed:
        mv = _version(server, m.name, m.version)
        if mv is not None:
            registry.configure(mv, **diff)
    _refresh_fallbacks(server, new)
    fresh = []
    for m in steps.added:
        found = _version(server, m.name, m.version)
        if found is not None and found.ready:  # served from engine_dir already: take the configured settings
            registry.replace(found, m)
        else:
            fresh.append(registry.add(m))
    for m in steps.reloaded:
        old = _version(server, m.name, m.version)
        if old is None:
            fresh.append(registry.add(m))
        else:
            registry.replace(old, m)
    hot = [mv for mv in fresh if mv.config.mode == "inproc" or mv.config.preload]
    for mv in hot:
        registry.load(mv)
    steps.pipelines = _apply_pipelines(server, new)
    for item in steps.restart_needed:
        log.warning("%s changed: restart the daemon to apply it", item)
    server.events.emit("reloaded", **{k: ",".join(v) for k, v in steps.summary().items() if v})
    return steps


def _apply_pipelines(server: "Server", new: cfg.Config) -> PipelineChanges:
    """Added, removed and changed `[[pipelines]]`, after the models (whose names their steps call)."""
    changes = server.pipelines.apply(new.pipelines, server.limits)
    for kind, names in (("added", changes.added), ("removed", changes.removed), ("changed", changes.changed)):
        for name in names:
            server.events.emit(f"pipeline_{kind}", pipeline=name)
    return changes


def _reread_client_keys(server: "Server") -> None:
    """A client key added to (or removed from) curve_authorized_dir counts from this reload on."""
    if server.curve is None:
        return
    try:
        server.curve.reload()
    except CurveError as exc:
        log.warning("%s; the keys read before stay authorised", exc)


def _version(server: "Server", name: str, version: str) -> ModelVersion | None:
    model = server.registry.model(name)
    return model.versions.get(version) if model is not None else None


def _refresh_fallbacks(server: "Server", new: cfg.Config) -> None:
    chain = cfg.fallback_of(new.models)
    for name, model in server.registry.models.items():
        model.fallback = chain.get(name, "")
    server.registry.check_fallbacks()  # loaded models: a fallback must take the same inputs
