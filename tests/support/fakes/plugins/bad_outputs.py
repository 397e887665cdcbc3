"""A broken third-party backend for tests: onnxruntime that returns outputs the daemon cannot send."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeContext, OnnxRuntimeEngine


class _BadContext(OnnxRuntimeContext):
    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = super().infer(inputs)
        if float(next(iter(inputs.values())).flat[0]) < 0:  # negative input: return something unsendable
            return {name: object() for name in outputs}  # type: ignore[misc]
        return outputs


class _BadEngine(OnnxRuntimeEngine):
    def create_context(self) -> OnnxRuntimeContext:
        good = super().create_context()
        bad = _BadContext.__new__(_BadContext)
        bad.__dict__.update(good.__dict__)
        return bad


class BadOutputsBackend(OnnxRuntimeBackend):
    name = "bad_outputs"

    def load(self, path: Path, options: Mapping[str, Any]) -> OnnxRuntimeEngine:
        engine = super().load(path, options)
        engine.__class__ = _BadEngine
        return engine
