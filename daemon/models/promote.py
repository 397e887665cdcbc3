"""Promote (cold → hot) and demote (hot → cold) a version without dropping a request.

The new placement is loaded beside the serving one under a shadow
`ModelVersion` (same config but the mode, same statistics), then switched in
with one assignment of `mv.scheduler`; once the frontend has finished any
admission that still held the old scheduler, the old one drains what it
accepted and stops. The version stays `ready` throughout. If the new
placement fails to load, the old one keeps serving and the error says why.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from infermux.models.verified import release
from infermux.models.version import ModelVersion, State

if TYPE_CHECKING:
    from infermux.models.registry import Registry

HOT, COLD = "inproc", "multiproc"


def find(registry: "Registry", name: str, version: str) -> ModelVersion:
    model = registry.model(name)
    if model is None:
        raise ValueError(f"unknown model {name!r}; models: {', '.join(sorted(registry.models)) or 'none'}")
    mv = model.versions.get(str(version))
    if mv is None:
        raise ValueError(f"model {name!r} has no version {version!r}; versions: "
                         f"{', '.join(v.version for v in model.ordered())}")
    return mv


def promote(registry: "Registry", name: str, version: str) -> str:
    """Move a version from its worker process into the daemon."""
    return _move(registry, find(registry, name, version), HOT)


def demote(registry: "Registry", name: str, version: str) -> str:
    """Move a version out of the daemon into a worker process."""
    return _move(registry, find(registry, name, version), COLD)


def _move(registry: "Registry", mv: ModelVersion, mode: str) -> str:
    label, where = f"{mv.name}:{mv.version}", "hot (in the daemon)" if mode == HOT else "cold (in a worker)"
    if registry.workers is None:
        raise ValueError("this daemon has no worker processes")
    if mv.config.mode == mode:
        raise ValueError(f"{label} is already {where}")
    if mv.state in (State.LOADING, State.WARMING, State.DRAINING):
        raise ValueError(f"{label} is {mv.state.value}; try again once it is ready")
    started = time.monotonic()
    with registry.workers.moving(mv):
        if mv.state is not State.READY:  # not loaded: change where it will load
            mv.config = replace(mv.config, mode=mode)
            if mode == HOT and not registry.load(mv):
                raise ValueError(f"{label} failed to load hot: {mv.reason}")
            return f"{label} is now {where}" + (" and loaded" if mode == HOT else "; it starts on demand")
        shadow = ModelVersion(replace(mv.config, mode=mode))
        shadow.stats = mv.stats  # one version, one history, whichever process serves it
        if not registry.load(shadow):
            raise ValueError(f"{label} stays {'cold' if mode == HOT else 'hot'}: the new placement failed "
                             f"({shadow.reason})")
        old_engine, old = mv.engine, mv.scheduler
        mv.config = shadow.config
        mv.engine = shadow.engine
        mv.scheduler = shadow.scheduler  # the switch: the router takes this from the next request on
        mv.memory_bytes, mv.last_load_s = shadow.memory_bytes, shadow.last_load_s
        old_source, mv.source = mv.source, shadow.source  # each placement holds its own verified copy
        if old is not None:
            if shadow.scheduler is not None:
                old.hand_over(shadow.scheduler, "promoted" if mode == HOT else "demoted")
            registry.workers.wait_turns()
            old.stop(registry.config.daemon.drain_timeout_s)
        if old_engine is not None:
            old_engine.close()
        release(old_source)
    ms = round((time.monotonic() - started) * 1000)
    worker = mv.worker_info()
    registry.events.emit("promoted" if mode == HOT else "demoted", mv.name, mv.version, took_ms=ms,
                         **({"pid": worker["pid"]} if worker is not None else {}))
    return f"{label} is now {where} (moved in {ms} ms)"
