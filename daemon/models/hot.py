"""The hot placer: a version's engine loaded in this process, warmed up, served by a `Scheduler`.

The daemon's registry uses it for `placement = "hot"` versions, and a worker
process for the one version it serves (workers/child.py): the same load,
warm-up and scheduler either side of the process boundary.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
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


log = logging.getLogger("infermux.models")


@dataclass(frozen=True)
class WarmShape:
    """A shape a model will be sent (a pipeline's model step: daemon/pipelines/warmshapes.py), to warm
    it at: `input` the input's name ("" for the model's only input), `why` where it comes from."""

    input: str
    shape: tuple[int, ...]
    dtype: str
    why: str = ""


def no_shapes(model: str) -> Sequence[WarmShape]:
    """No shapes known beyond the engine's own (a daemon without pipelines, a worker process)."""
    return ()


def shaped_inputs(specs: Sequence[TensorSpec], shape: WarmShape) -> dict[str, np.ndarray] | None:
    """Zeros of `shape` for a one-input engine that accepts it; None where it does not (another
    input named, another dtype, a shape outside the engine's range): that shape is not warmed."""
    if len(specs) != 1 or shape.input not in ("", specs[0].name):
        return None
    spec = specs[0]
    if spec.accepts(shape.dtype, shape.shape) is not None:
        return None
    return {spec.name: np.zeros(shape.shape, dtype=spec.dtype)}


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


def warm_up(engine: Engine, mc: ModelConfig, shapes: Sequence[WarmShape] = ()) -> float:
    """Run the engine before any client is sent to it; returns µs per input row.

    The first call pays one-off set-up, so the second one is timed. Then each of `shapes` the
    engine accepts is run twice: a dynamic-shape model pays a first call at each new shape (memory
    planned and allocated for it), which a camera's first frame would pay otherwise.
    """
    context = engine.create_context()
    inputs = warmup_inputs(engine.inputs, mc.engine)
    try:
        context.infer(inputs)
        start = time.perf_counter()
        context.infer(inputs)
        elapsed_us = (time.perf_counter() - start) * 1e6
        for shape in shapes:
            shaped = shaped_inputs(engine.inputs, shape)
            if shaped is None:
                log.info("model %s not warmed at %s %s (%s): its engine does not take it", mc.name, shape.dtype,
                         list(shape.shape), shape.why)
                continue
            began = time.perf_counter()
            context.infer(shaped)
            context.infer(shaped)
            log.info("model %s warmed at %s %s for %s in %.0f ms", mc.name, shape.dtype, list(shape.shape),
                     shape.why, (time.perf_counter() - began) * 1000)
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

    def __init__(self, hooks: FrontendHooks, warming: Warming, strategy: Callable[[], str],
                 shapes: Callable[[str], Sequence[WarmShape]] = no_shapes) -> None:
        self.hooks, self._warming, self._strategy, self._shapes = hooks, warming, strategy, shapes

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
            row_us = warm_up(engine, source, self._shapes(mc.name))
            return Scheduler(mc, engine, version.stats, self.hooks, mc.strategy or self._strategy(), row_us,
                             backend.name)
        except Exception as exc:
            engine.close()
            raise LoadFailed(exc, "warm-up") from exc

    def forgive(self, version: ModelVersion) -> None:
        """Nothing holds a hot version back."""

    def close(self) -> None:
        """Nothing outlives the registry's unloads."""
