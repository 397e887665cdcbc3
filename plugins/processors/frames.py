"""`decode`: an encoded image (JPEG, PNG) or a raw camera frame into an HWC uint8 image.

Raw frames carry `width`, `height` and `stride` (bytes per row of the first
plane); their size must match exactly, since a wrong stride would otherwise
decode as a sheared picture rather than fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import cv2
import numpy as np

from infermux.plugins.processors.base import FrameTooLarge, ProcessorError, Sample, parse_config

ENCODED = ("jpeg", "jpg", "png")
RAW = ("bgr", "rgb", "gray", "nv12", "i420")
ORDERS = ("rgb", "bgr", "gray")

# (input format, wanted order) -> cv2 conversion code; None = the pixels are already in that order.
_PACKED = {
    ("bgr", "rgb"): cv2.COLOR_BGR2RGB, ("bgr", "bgr"): None, ("bgr", "gray"): cv2.COLOR_BGR2GRAY,
    ("rgb", "rgb"): None, ("rgb", "bgr"): cv2.COLOR_RGB2BGR, ("rgb", "gray"): cv2.COLOR_RGB2GRAY,
    ("gray", "rgb"): cv2.COLOR_GRAY2RGB, ("gray", "bgr"): cv2.COLOR_GRAY2BGR, ("gray", "gray"): None,
}
_YUV = {
    ("nv12", "rgb"): cv2.COLOR_YUV2RGB_NV12, ("nv12", "bgr"): cv2.COLOR_YUV2BGR_NV12,
    ("nv12", "gray"): cv2.COLOR_YUV2GRAY_NV12,
    ("i420", "rgb"): cv2.COLOR_YUV2RGB_I420, ("i420", "bgr"): cv2.COLOR_YUV2BGR_I420,
    ("i420", "gray"): cv2.COLOR_YUV2GRAY_I420,
}
_CHANNELS = {"bgr": 3, "rgb": 3, "gray": 1}


@dataclass(frozen=True)
class DecodeConfig:
    """`to`: the channel order the model wants ("rgb", "bgr" or "gray"); `max_pixels`: larger frames are refused."""

    to: str = "rgb"
    max_pixels: int = 8192 * 8192

    def check(self) -> tuple[str, str] | None:
        if self.to not in ORDERS:
            return "to", f"must be one of {', '.join(ORDERS)}, got {self.to!r}"
        if self.max_pixels < 1:
            return "max_pixels", "must be at least 1"
        return None


class Decode:
    """Sets `sample.image` (and `sample.tensor`) from `sample.data` in `sample.format`."""

    kind = "decode"

    def __init__(self, options: Mapping[str, Any], step: str = "decode") -> None:
        self.step = step
        self.config = parse_config(step, DecodeConfig, options)

    def __call__(self, sample: Sample) -> None:
        if sample.data is None:
            raise ProcessorError(self.step, "the request has no frame")
        data = np.ascontiguousarray(sample.data).reshape(-1).view(np.uint8)
        fmt = sample.format.lower()
        if fmt in ENCODED:
            image = self._encoded(data)
        elif fmt in RAW:
            image = self._raw(data, fmt, sample)
        else:
            raise ProcessorError(self.step, f"unknown format {sample.format!r}; "
                                 f"known: {', '.join(ENCODED + RAW)}")
        sample.image = sample.tensor = image

    def _encoded(self, data: np.ndarray) -> np.ndarray:
        declared = encoded_size(data.tobytes()[:65536])
        if declared is not None:  # refused before decoding allocates it
            self._check_pixels(*declared)
        flag = cv2.IMREAD_GRAYSCALE if self.config.to == "gray" else cv2.IMREAD_COLOR
        image = cv2.imdecode(data, flag) if data.size else None
        if image is None:
            raise ProcessorError(self.step, f"cannot decode the image ({data.size} bytes): not a valid JPEG or PNG")
        self._check_pixels(image.shape[1], image.shape[0])
        if self.config.to == "rgb":
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        return _hwc(image)

    def _raw(self, data: np.ndarray, fmt: str, sample: Sample) -> np.ndarray:
        width, height = self._dimensions(sample, fmt)
        self._check_pixels(width, height)
        if fmt in _CHANNELS:
            return self._packed(data, fmt, width, height, sample.stride or width * _CHANNELS[fmt])
        return self._yuv(data, fmt, width, height, sample.stride or width)

    def _dimensions(self, sample: Sample, fmt: str) -> tuple[int, int]:
        width, height = sample.width, sample.height
        if not isinstance(width, int) or not isinstance(height, int) or width < 1 or height < 1:
            raise ProcessorError(self.step, f"a {fmt} frame needs positive integer 'width' and 'height', "
                                 f"got {width!r} x {height!r}")
        if fmt in ("nv12", "i420") and (width % 2 or height % 2):
            raise ProcessorError(self.step, f"a {fmt} frame needs even width and height, got {width}x{height}")
        return width, height

    def _check_pixels(self, width: int, height: int) -> None:
        if width * height > self.config.max_pixels:
            raise FrameTooLarge(self.step, f"frame {width}x{height} is over the {self.config.max_pixels} "
                                f"pixels this step accepts")

    def _packed(self, data: np.ndarray, fmt: str, width: int, height: int, stride: int) -> np.ndarray:
        channels = _CHANNELS[fmt]
        self._check_size(data, fmt, width, height, stride, width * channels, stride * height)
        rows = data.reshape(height, stride)[:, :width * channels].reshape(height, width, channels)
        code = _PACKED[(fmt, self.config.to)]
        if code is None:
            return np.ascontiguousarray(rows)  # a copy only where the stride pads rows
        return _hwc(cv2.cvtColor(rows, code))

    def _yuv(self, data: np.ndarray, fmt: str, width: int, height: int, stride: int) -> np.ndarray:
        if fmt == "i420" and stride % 2:  # its U and V planes have half the stride
            raise ProcessorError(self.step, f"an i420 frame needs an even stride, got {stride}")
        needed = stride * height * 3 // 2
        self._check_size(data, fmt, width, height, stride, width, needed)
        planes = data.reshape(height * 3 // 2, stride)
        if stride != width:
            planes = _packed_yuv(data, fmt, width, height, stride)
        return _hwc(cv2.cvtColor(planes, _YUV[(fmt, self.config.to)]))

    def _check_size(self, data: np.ndarray, fmt: str, width: int, height: int, stride: int,
                    row_bytes: int, needed: int) -> None:
        if stride < row_bytes:
            raise ProcessorError(self.step, f"stride {stride} is less than a {fmt} row of width {width} "
                                 f"({row_bytes} bytes)")
        if data.size != needed:
            raise ProcessorError(self.step, f"frame is {data.size} bytes but {fmt} {width}x{height} with stride "
                                 f"{stride} is {needed} bytes")


def encoded_size(head: bytes) -> tuple[int, int] | None:
    """(width, height) a PNG or JPEG declares in its header, or None where it declares none readable.

    Read before decoding so that a small file declaring a huge image (a
    decompression bomb) is refused without allocating it.
    """
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 9 <= len(head) and head[at] == 0xFF:
        marker, length = head[at + 1], int.from_bytes(head[at + 2:at + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start-of-frame segment
            return int.from_bytes(head[at + 7:at + 9], "big"), int.from_bytes(head[at + 5:at + 7], "big")
        at += 2 + length
    return None


def _packed_yuv(data: np.ndarray, fmt: str, width: int, height: int, stride: int) -> np.ndarray:
    """A strided NV12/I420 frame as the tightly packed single plane cv2.cvtColor reads."""
    luma = data[:stride * height].reshape(height, stride)[:, :width]
    chroma = data[stride * height:]
    if fmt == "nv12":
        uv = chroma.reshape(height // 2, stride)[:, :width]
        return np.concatenate([luma, uv])
    half = stride // 2
    u = chroma[:half * height // 2].reshape(height // 2, half)[:, :width // 2]
    v = chroma[half * height // 2:].reshape(height // 2, half)[:, :width // 2]
    out = np.empty(width * height * 3 // 2, np.uint8)
    out[:width * height] = luma.reshape(-1)
    quarter = width * height // 4
    out[width * height:width * height + quarter] = u.reshape(-1)
    out[width * height + quarter:] = v.reshape(-1)
    return out.reshape(height * 3 // 2, width)


def _hwc(image: np.ndarray) -> np.ndarray:
    """Gray images as (H, W, 1), so every later step sees three dimensions."""
    return image[:, :, None] if image.ndim == 2 else image
