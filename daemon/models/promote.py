"""Promote (cold → hot) and demote (hot → cold) a version without dropping a request.

A move is the switch's (models/switch.py): the version is loaded beside
itself in the other placement, as a candidate that carries on its
statistics, switched in with one assignment, and the old placement, once
the frontend has let go of it, drains what it accepted and stops. The
version stays `ready` throughout. If the new placement fails to load, the
old one keeps serving and the error says why.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from infermux.config import COLD, HOT, ModelConfig
from infermux.models import life
from infermux.models.version import ModelVersion, State

if TYPE_CHECKING:
    from infermux.models.registry import Registry


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


def _move(registry: "Registry", mv: ModelVersion, placement: str) -> str:
    label, where = f"{mv.name}:{mv.version}", "hot (in the daemon)" if placement == HOT else "cold (in a worker)"
    if COLD not in registry.placers:
        raise ValueError("this daemon has no worker processes")
    if mv.config.placement == placement:
        raise ValueError(f"{label} is already {where}")
    if mv.state in (State.LOADING, State.WARMING, State.DRAINING):
        raise ValueError(f"{label} is {mv.state.value}; try again once it is ready")
    started = time.monotonic()
    with registry.claimed(mv):  # idle unload and eviction keep off it meanwhile
        if mv.state is not State.READY:  # not loaded: change where it will load
            mv.config = replace(mv.config, placement=placement)
            if placement == HOT and not registry.load(mv):
                raise ValueError(f"{label} failed to load hot: {mv.reason}")
            return f"{label} is now {where}" + (" and loaded" if placement == HOT else "; it starts on demand")
        try:
            mv = registry.switch.move(mv, placement, "promoted" if placement == HOT else "demoted")
        except ValueError as exc:
            raise ValueError(f"{label} stays {'cold' if placement == HOT else 'hot'}: {exc}") from None
    ms = round((time.monotonic() - started) * 1000)
    worker = mv.worker_info()
    life.say(registry.events, mv, "promoted" if placement == HOT else "demoted", took_ms=ms,
                         **({"pid": worker["pid"]} if worker is not None else {}))
    return f"{label} is now {where} (moved in {ms} ms)"


def kept_move(made: ModelConfig | None, current: ModelVersion | None, mc: ModelConfig) -> ModelConfig:
    """`mc`, the file's settings for a version made again from its own file (`made`: the file's settings it
    was made under before; None for another file), with the placement an operator moved the serving version
    to. A move is a live change like any other: it holds until the file changes `placement` itself (with
    two placements, a file that changes it away from where the version was made gives the operator's)."""
    if made is None or current is None or not current.ready:
        return mc
    moved = current.config.placement
    if moved != made.placement and mc.placement == made.placement:
        return replace(mc, placement=moved)
    return mc
