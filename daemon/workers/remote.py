"""What the daemon knows of a cold version's engine and contexts, which live in its worker process.

The proxy (proxy.py) is the cold placement; these are the descriptions it
holds in place of the real things: a `RemoteEngine` (the tensors and
footprint the worker's READY message gave) and a `ContextView` per context
(as the worker's last heartbeat described it), which the views read as they
read a hot version's executors.
"""

from __future__ import annotations

from typing import Sequence

from infermux.execution.stats import Stats
from infermux.plugins.base import BackendError, Context, TensorSpec


class RemoteEngine:
    """A worker's engine as the daemon sees it: tensor specs and footprint, no contexts."""

    def __init__(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], memory: int) -> None:
        self.inputs: Sequence[TensorSpec] = inputs
        self.outputs: Sequence[TensorSpec] = outputs
        self.memory = memory

    def create_context(self) -> Context:
        raise BackendError("a cold model's contexts live in its worker process")

    def memory_bytes(self) -> int:
        return self.memory

    def close(self) -> None:
        """Nothing here: stopping the proxy stops the process that holds the engine."""


class _Depth:
    """A queue length reported by the worker (what `len(ex.queue)` reads)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def __len__(self) -> int:
        return self.n


class ContextView:
    """One execution context inside the worker, as its last heartbeat described it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.queue = _Depth()
        self.in_flight = 0
        self.served = 0
        self.row_us = 0.0
        self.stats = Stats()  # replaced by this context's share of the version's ModelStats

    @property
    def load(self) -> int:
        return len(self.queue) + self.in_flight


def row_bytes(outputs: Sequence[TensorSpec]) -> int:
    """Bytes per input row the outputs need, by their specs (dynamic dims count as 1)."""
    total = 0
    for spec in outputs:
        count = 1
        for d in spec.shape:
            count *= d if d > 0 else 1
        total += count * _itemsize(spec.dtype)
    return total


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "int8": 1, "uint8": 1, "bool": 1, "int32": 4, "float32": 4}.get(dtype, 8)
