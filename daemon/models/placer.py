"""The placer contract: what makes a placement (execution/placement.py) for a model version.

There is one placer per placement, and the registry keeps them by kind
(`Registry.placers`): `HotPlacer` (models/hot.py) loads the engine in this
process and serves it with a `Scheduler`; the worker pool (workers/pool.py)
starts a worker process for it and serves it through a `WorkerProxy`.
`Registry.load` is the same for both: make room in the memory budget, then
`placers[version.config.placement].load(version)`, then one finishing step
(the version's engine, footprint, state and `loaded` event). A worker process
uses the hot placer for the version it serves (workers/child.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from infermux.execution.placement import Placement
from infermux.models.version import ModelVersion

# warming(version, backend): the engine is loaded and its warm-up starts (the version shows `warming`).
Warming = Callable[[ModelVersion, str], None]


class LoadFailed(Exception):
    """A placer could not place a version: the message says why, `during` in which step
    ("load", "warm-up", "worker start"); the version's reason reads "<during> failed: <why>"."""

    def __init__(self, why: str | BaseException, during: str = "load") -> None:
        super().__init__(str(why))
        self.during = during


class Placer(Protocol):
    """Makes one kind of placement for a version (hot or cold)."""

    @property
    def kind(self) -> str:
        """The placement it makes: "hot" or "cold" (config.PLACEMENTS)."""
        ...

    def load(self, version: ModelVersion) -> Placement:
        """Load `version`'s engine where this placer places it and warm it up, calling the
        `warming` hook it was given in between; return the placement, ready to serve, which the
        registry then makes the version's. Raises `LoadFailed`. Runs on a loader thread."""
        ...

    def forgive(self, version: ModelVersion) -> None:
        """An operator loads `version` by hand: forget what holds it back (a cold worker's crashes)."""
        ...

    def close(self) -> None:
        """The daemon stops and the registry has unloaded what it could: end what is left."""
        ...


def missing_engine(path: Path) -> str:
    """The configured engine file is not there: say where it was looked for and what is there."""
    folder = path.parent
    try:
        there = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        return f"configured engine {path} is missing: looked in {folder}, which does not exist"
    found = f"it holds {', '.join(there[:8])}{' ...' if len(there) > 8 else ''}" if there else "it is empty"
    return f"configured engine {path} is missing: looked in {folder}; {found}"
