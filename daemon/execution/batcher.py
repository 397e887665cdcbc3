"""Dynamic batching: which requests may share one inference, and how.

Requests merge along axis 0 only when every engine input has a dynamic
batch dimension and the requests agree on input names, dtypes and every
non-batch dimension. Outputs are split back by each request's rows.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from infermux.plugins.base import TensorSpec


def batchable(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    """Whether an engine's tensors allow merging requests along axis 0."""
    return all(s.shape and s.shape[0] == -1 for s in (*inputs, *outputs))


def row_limit(inputs: Sequence[TensorSpec]) -> int | None:
    """The most rows one call may carry: the smallest batch maximum the engine states
    (a TensorRT profile's max shape), or None where the engine sets no bound."""
    limits = [s.max_shape[0] for s in inputs if s.max_shape and s.shape and s.shape[0] == -1]
    return min(limits) if limits else None


def signature(inputs: Mapping[str, np.ndarray]) -> tuple:
    """What two requests must share to be merged: names, dtypes, non-batch dims."""
    return tuple((name, a.dtype.str, a.shape[1:]) for name, a in inputs.items())


def rows(inputs: Mapping[str, np.ndarray]) -> int:
    """The request's batch size (dim 0 of its first input; 1 for scalars)."""
    for a in inputs.values():
        return a.shape[0] if a.ndim else 1
    return 1


def merge(requests: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One input dict holding every request's rows, in order."""
    return {name: np.concatenate([r[name] for r in requests], axis=0) for name in requests[0]}


def split(outputs: Mapping[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Per-request outputs cut from a merged result, by the requests' row counts."""
    cuts = np.cumsum(sizes)[:-1]
    per_output = {name: np.split(value, cuts, axis=0) for name, value in outputs.items()}
    return [{name: parts[i] for name, parts in per_output.items()} for i in range(len(sizes))]
