"""The hot placer: a version's engine loaded in this process, warmed up, served by a `Scheduler`.

The daemon's registry uses it for `placement = "hot"` versions, and a worker
process for the one version it serves (workers/child.py): the same load,
warm-up and scheduler either side of the process boundary.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from infermux.config import HOT, ModelConfig
from infermux.execution.hooks import FrontendHooks
from infermux.execution.scheduler import Scheduler
from infermux.models.placer import LoadFailed, Warming, missing_engine
from infermux.models.version import ModelVersion
from infermux.plugins import backends
from infermux.plugins.base import Engine, TensorSpec


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


class HotPlacer:
    """The `Placer` of hot versions (models/placer.py): engine, warm-up, `Scheduler`, in this process.

    `hooks` are the frontend's callbacks the scheduler replies and asks through, `warming` is
    told when the warm-up starts, and `strategy()` is the routing strategy of a version that
    sets none (the configuration's, which a reload may change).
    """

    kind = HOT

    def __init__(self, hooks: FrontendHooks, warming: Warming, strategy: Callable[[], str]) -> None:
        self.hooks, self._warming, self._strategy = hooks, warming, strategy

    def load(self, version: ModelVersion) -> Scheduler:
        mc = version.config
        source = replace(mc, engine=version.source) if version.source else mc  # a signed engine's checked copy
        try:
            if not source.engine.exists():
                raise LoadFailed(missing_engine(source.engine))
            backend = backends.for_path(source.engine, mc.backend or None)
            engine = backend.load(source.engine, dict(mc.options))
        except LoadFailed:
            raise
        except Exception as exc:
            raise LoadFailed(exc) from exc
        try:
            self._warming(version, backend.name)
            row_us = warm_up(engine, source)
            return Scheduler(mc, engine, version.stats, self.hooks, mc.strategy or self._strategy(), row_us,
                             backend.name)
        except Exception as exc:
            engine.close()
            raise LoadFailed(exc, "warm-up") from exc

    def forgive(self, version: ModelVersion) -> None:
        """Nothing holds a hot version back."""

    def close(self) -> None:
        """Nothing outlives the registry's unloads."""
