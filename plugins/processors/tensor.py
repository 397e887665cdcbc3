"""`normalize`, `layout` and `cast`: the working image into the tensor a model takes.

`normalize` computes (x * scale - mean) / std as one multiply-add per
element straight into its float32 output (and, with `chw`, in the model's
channel-first layout), so no intermediate frame-sized array is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from infermux.plugins.processors.base import ProcessorError, Sample, parse_config, working

DTYPES = ("float32", "float16", "uint8", "int8", "int32", "int64")


@dataclass(frozen=True)
class NormalizeConfig:
    """Per-channel (x * scale - mean) / std; one value in `mean`/`std` applies to every channel."""

    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    chw: bool = True
    batch: bool = True

    def check(self) -> tuple[str, str] | None:
        if not self.mean:
            return "mean", "must have at least one value"
        if not self.std or any(s == 0 for s in self.std):
            return "std", "must be non-empty with no zero"
        return None


class Normalize:
    """uint8 HWC `sample.tensor` into float32 (N)CHW (or (N)HWC with `chw = false`)."""

    kind = "normalize"

    def __init__(self, options: Mapping[str, Any], step: str = "normalize") -> None:
        self.step = step
        self.config = parse_config(step, NormalizeConfig, options)
        std = np.asarray(self.config.std, np.float32)
        self._gain = np.float32(self.config.scale) / std
        self._offset = -np.asarray(self.config.mean, np.float32) / std

    def __call__(self, sample: Sample) -> None:
        image = working(self.step, sample)
        if image.ndim != 3:
            raise ProcessorError(self.step, f"expects an HWC image, got shape {list(image.shape)}")
        channels = image.shape[2]
        gain, offset = self._per_channel(channels)
        h, w = image.shape[:2]
        if self.config.chw:
            out = np.empty((channels, h, w), np.float32)
            for c in range(channels):  # one strided pass per channel: no transposed copy
                np.multiply(image[:, :, c], gain[c], out=out[c], casting="unsafe")
                out[c] += offset[c]
        else:
            out = np.multiply(image, gain, dtype=np.float32)
            out += offset
        sample.tensor = out[None] if self.config.batch else out

    def _per_channel(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self._gain) not in (1, channels) or len(self._offset) not in (1, channels):
            raise ProcessorError(self.step, f"mean/std have {len(self._offset)}/{len(self._gain)} values "
                                 f"for an image with {channels} channels")
        return (np.broadcast_to(self._gain, (channels,)), np.broadcast_to(self._offset, (channels,)))


@dataclass(frozen=True)
class LayoutConfig:
    """`chw`: HWC -> CHW; `batch`: add a leading batch dimension of 1."""

    chw: bool = True
    batch: bool = True


class Layout:
    """HWC `sample.tensor` to CHW (a contiguous copy, as a model's input frame must be)."""

    kind = "layout"

    def __init__(self, options: Mapping[str, Any], step: str = "layout") -> None:
        self.step = step
        self.config = parse_config(step, LayoutConfig, options)

    def __call__(self, sample: Sample) -> None:
        array = working(self.step, sample)
        if array.ndim != 3:
            raise ProcessorError(self.step, f"expects an HWC array, got shape {list(array.shape)}")
        if self.config.chw:
            array = array.transpose(2, 0, 1)
        sample.tensor = np.ascontiguousarray(array[None] if self.config.batch else array)


@dataclass(frozen=True)
class CastConfig:
    """`dtype`: the numpy dtype name the model's input has."""

    dtype: str = "float32"

    def check(self) -> tuple[str, str] | None:
        if self.dtype not in DTYPES:
            return "dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
        return None


class Cast:
    """`sample.tensor` as `dtype` (no copy if it already is)."""

    kind = "cast"

    def __init__(self, options: Mapping[str, Any], step: str = "cast") -> None:
        self.step = step
        self.config = parse_config(step, CastConfig, options)

    def __call__(self, sample: Sample) -> None:
        sample.tensor = np.ascontiguousarray(working(self.step, sample), dtype=self.config.dtype)
