"""The backend plugin interface (docs/architecture.md#backends).

A backend turns an engine file into an `Engine`; an engine hands out
`Context`s, one per executor thread. Contexts are never shared between
threads (a TensorRT execution context is not thread-safe); what they hold in
common, the weights, the engine holds once: a TensorRT engine, or the
onnxruntime session that a CPU version's contexts share.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype name and shape of one engine input or output.

    `-1` in `shape` marks a dynamic dimension. `min_shape`/`max_shape`
    give the accepted range where the backend knows it (TensorRT
    optimization profiles); `None` means unbounded.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    min_shape: tuple[int, ...] | None = None
    max_shape: tuple[int, ...] | None = None

    def accepts(self, dtype: str, shape: Sequence[int]) -> str | None:
        """Why `dtype`/`shape` is not accepted for this tensor, or None if it is."""
        if dtype != self.dtype:
            return f"input {self.name!r} must be {self.dtype}, got {dtype}"
        if len(shape) != len(self.shape):
            return (f"input {self.name!r} must have rank {len(self.shape)} "
                    f"(shape {list(self.shape)}), got {list(shape)}")
        for axis, (want, got) in enumerate(zip(self.shape, shape)):
            if want >= 0 and want != got:
                return (f"input {self.name!r} dimension {axis} must be {want} "
                        f"(shape {list(self.shape)}), got {list(shape)}")
        if self.min_shape is not None and self.max_shape is not None:
            if any(g < lo or g > hi for g, lo, hi in zip(shape, self.min_shape, self.max_shape)):
                return (f"input {self.name!r} shape {list(shape)} is outside the engine's "
                        f"range {list(self.min_shape)}..{list(self.max_shape)}")
        return None


class BackendError(Exception):
    """The backend failed to load an engine or to run it (status 500 / state failed)."""


class InputRejected(BackendError):
    """The request's tensors do not fit the engine (status 400)."""


class OutputsMismatch(BackendError):
    """`infer_into` was given arrays whose shapes this run did not produce (the caller runs `infer`)."""


@runtime_checkable
class Context(Protocol):
    """One execution context: used by exactly one thread at a time."""

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


@runtime_checkable
class WritesOutputs(Protocol):
    """A context that can compute its outputs straight into arrays the caller owns.

    A cold model's worker hands it views on the request's shared-memory slot,
    which saves copying the outputs there afterwards (docs/workers.md).
    Optional: contexts without it are called through `infer`.
    """

    def infer_into(self, inputs: Mapping[str, np.ndarray],
                   outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Like `infer`, with the named outputs written into `outputs`' arrays (returned as they
        are). Raises OutputsMismatch, having served nothing, if their shapes or dtypes are not
        what this run produces."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A loaded, read-only model; thread-safe; makes contexts."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]

    def create_context(self) -> Context: ...

    def memory_bytes(self) -> int:
        """What it holds now: its weights once, plus the activations of each context it made
        that is not closed (docs/architecture.md#memory-footprints)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class OnDevice(Protocol):
    """An engine whose memory lives on a GPU: `memory_bytes()` counts that GPU's memory, measured
    where the backend could (docs/tensorrt.md#memory-accounting), and the host RSS its load adds
    (libraries, the file read) must not be charged to it."""

    device: int


@runtime_checkable
class Backend(Protocol):
    """Loads engine files with one of `suffixes`."""

    name: str
    suffixes: tuple[str, ...]

    def load(self, path: Path, options: Mapping[str, Any]) -> Engine: ...
