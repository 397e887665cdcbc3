"""A model version and its states, and a model's versions (the registry holds them: registry.py).

States: unloaded → loading → warming → ready → draining → unloaded, plus
failed. A ready version has an engine and a placement (execution/placement.py:
hot in the daemon, or cold in a worker process), which a placer made
(models/placer.py).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from infermux.config import ModelConfig
from infermux.protocol import OPERATOR_RETRY_MS
from infermux.plugins.base import Engine
from infermux.execution.placement import Placement
from infermux.execution.stats import ModelStats
from infermux.models.life import Phase


class State(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    CANDIDATE = "candidate"  # loaded beside the serving version, shadowing its requests, served to nobody
    DRAINING = "draining"
    FAILED = "failed"


def version_key(version: str) -> tuple:
    """Sort key that puts "2.10" after "2.9" and numbers before names."""
    parts = version.replace("-", ".").split(".")
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)


@dataclass
class ModelVersion:
    """One version of one model, loaded or not."""

    config: ModelConfig
    state: State = State.UNLOADED
    reason: str = ""
    engine: Engine | None = None
    placement: Placement | None = None  # where it runs once loaded: hot Scheduler or cold WorkerProxy
    stats: ModelStats = field(init=False)
    memory_bytes: int = 0
    load_started: float = 0.0
    last_load_s: float = 0.0
    last_used: float = 0.0
    source: Path | None = None  # the verified copy of its engine it was loaded from (models/verified.py)
    phase: Phase = Phase.FOUND  # where it is in its life (models/life.py), moved by `life.say` only

    def __post_init__(self) -> None:
        if self.state is State.FAILED:  # listed refused from what was decided before (a verdict, a bad file)
            self.phase = Phase.REFUSED
        self.stats = ModelStats(self.config.name, self.config.version, queue_depth=self._queued)

    def _queued(self) -> int:
        placement = self.placement
        return placement.depth() if placement is not None else 0

    def carry_on(self, previous: "ModelVersion") -> None:
        """Stand in for `previous`, the same version served elsewhere (promote/demote): one history,
        its statistics and its last use, whichever placement serves it."""
        self.stats = previous.stats
        self.stats.follow_queue(self._queued)
        self.last_used = previous.last_used

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def version(self) -> str:
        return self.config.version

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    def worker_info(self) -> dict[str, Any] | None:
        """pid, RSS, state... of the worker process serving this version (None when hot or unloaded)."""
        placement = self.placement
        return placement.worker_info() if placement is not None else None

    def eta_ms(self) -> int:
        """When a client should retry while this version loads (never 0)."""
        if self.state in (State.LOADING, State.WARMING):
            expected = self.last_load_s or _load_guess_s(self.config.engine)
            left = expected - (time.monotonic() - self.load_started)
            return max(50, int(left * 1000))
        return OPERATOR_RETRY_MS if self.state is State.FAILED else 200


def config_template(entries: Sequence[ModelConfig]) -> ModelConfig:
    """Settings a discovered version of a configured model inherits: its default entry, else its newest."""
    marked = [mc for mc in entries if mc.default]
    return marked[0] if marked else max(entries, key=lambda mc: version_key(mc.version))


def _load_guess_s(path: Path) -> float:
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    return 0.2 + size / 200e6  # a first load: ~200 MB/s deserialisation plus start-up


class Model:
    """All versions of one model name, and which one serves by default."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._versions: dict[str, ModelVersion] = {}
        self._ordered: list[ModelVersion] = []
        self.pinned: str | None = None
        self.fallback: str = ""
        # A version loaded beside the serving one that shadows its requests (swap/rollout.py): in no
        # routing table, listed with the versions (`Registry.all_versions`) so every view shows it.
        self.candidate: ModelVersion | None = None

    @property
    def versions(self) -> dict[str, ModelVersion]:
        return self._versions

    @versions.setter
    def versions(self, versions: dict[str, ModelVersion]) -> None:
        # Sorted once here, not per request: the hot path reads `ordered()`.
        self._ordered = sorted(versions.values(), key=lambda v: version_key(v.version))
        self._versions = versions

    def ordered(self) -> list[ModelVersion]:
        return self._ordered

    def default(self) -> ModelVersion | None:
        """Pinned (once ready), else marked default, else the newest ready, else the newest."""
        pinned = self._versions.get(self.pinned) if self.pinned is not None else None
        if pinned is not None and pinned.state is State.READY:
            return pinned  # a pin still loading leaves the serving version in place (rollback without 503s)
        newest_ready = None
        for mv in self._ordered:
            if mv.config.default:
                return mv
            if mv.state is State.READY:
                newest_ready = mv
        return newest_ready or (self._ordered[-1] if self._ordered else None)

    def strategy(self, default: str) -> str:
        """How requests naming no version are spread over the ready versions: the newest version's
        `strategy`, else `default` (the `[routing]` table's)."""
        own = self._ordered[-1].config.strategy if self._ordered else ""
        return own or default

    def ready_versions(self) -> list[ModelVersion]:
        return [mv for mv in self._ordered if mv.state is State.READY]
