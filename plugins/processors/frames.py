"""`decode`: an encoded image (JPEG, PNG) or a raw camera frame into an HWC uint8 image.

Raw frames carry `width`, `height` and `stride` (bytes per row of the first
plane); their size must match exactly, since a wrong stride would otherwise
decode as a sheared picture rather than fail.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

import cv2
import numpy as np

from infermux.plugins.processors import DEFAULT_MAX_PIXELS, OPENCV_PIXELS
from infermux.plugins.processors.base import FrameTooLarge, OutOfTime, ProcessorError, Sample, parse_config

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


# A camera writes one scan (three for a non-interleaved baseline), libjpeg's progressive mode ten, and
# an encoder that searches for the smallest file a few dozen: each scan is a pass over the whole frame.
DEFAULT_MAX_SCANS = 100
# The least a decoder spends per pixel, and per pixel and scan of a progressive JPEG, in ns: set
# several times under what libjpeg-turbo was measured to spend on a blank frame (docs/pipelines.md),
# so that an estimate from them is a lower bound on the decode's cost on a faster CPU too: a frame
# refused by it would have cost more.
NS_PER_PIXEL, NS_PER_PIXEL_SCAN = 0.2, 0.02


@dataclass(frozen=True)
class DecodeConfig:
    """`to`: the channel order the model wants ("rgb", "bgr" or "gray"); `max_pixels`: larger frames are
    refused; `max_scans`: a JPEG with more scans is refused from its markers; `max_decode_ms`: the CPU one
    frame's decode may take (refused up front where its estimate is over, and once it took more)."""

    to: str = "rgb"
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_scans: int = DEFAULT_MAX_SCANS
    max_decode_ms: int = 2000

    def check(self) -> tuple[str, str] | None:
        if self.to not in ORDERS:
            return "to", f"must be one of {', '.join(ORDERS)}, got {self.to!r}"
        for name in ("max_pixels", "max_scans", "max_decode_ms"):
            if getattr(self, name) < 1:
                return name, "must be at least 1"
        if self.max_pixels > opencv_pixel_limit():
            return "max_pixels", (f"is over OpenCV's own limit of {opencv_pixel_limit()} pixels, which it reads "
                                  f"from ${OPENCV_PIXELS} at start: set that in the daemon's environment")
        return None


def opencv_pixel_limit() -> int:
    """The most pixels cv2.imdecode allocates for (its default where the variable is not a number)."""
    value = os.environ.get(OPENCV_PIXELS, "")
    return int(value) if value.isdigit() else 1 << 30


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
            image = self._encoded(data, sample)
        elif fmt in RAW:
            image = self._raw(data, fmt, sample)
        else:
            raise ProcessorError(self.step, f"unknown format {sample.format!r}; "
                                 f"known: {', '.join(ENCODED + RAW)}")
        sample.image = sample.tensor = image

    def _encoded(self, data: np.ndarray, sample: Sample) -> np.ndarray:
        head = data.tobytes()
        try:
            width, height = header_size(head)
        except ValueError as exc:  # nothing is decoded whose size is not known first
            raise ProcessorError(self.step, f"cannot decode the image ({data.size} bytes): not a valid JPEG or "
                                 f"PNG ({exc})") from None
        self._check_pixels(width, height)  # refused before decoding allocates it
        self._check_cost(head, width, height, sample)
        flag = cv2.IMREAD_GRAYSCALE if self.config.to == "gray" else cv2.IMREAD_COLOR
        start = time.thread_time()  # the decoder runs on this thread: its CPU, not the box's load
        try:
            image = cv2.imdecode(data, flag)
        except cv2.error:  # OpenCV's own limit (OPENCV_IO_MAX_IMAGE_PIXELS, processors/__init__.py)
            image = None
        spent_ms = (time.thread_time() - start) * 1000
        if image is None:
            raise ProcessorError(self.step, f"cannot decode the image ({data.size} bytes): not a valid JPEG or PNG")
        self._check_pixels(image.shape[1], image.shape[0])
        if spent_ms > self.config.max_decode_ms:  # refused, and remembered: the same frame again costs a hash
            raise FrameTooLarge(self.step, f"decoding the {width}x{height} frame took {spent_ms:.0f} ms of CPU; "
                                f"the step allows {self.config.max_decode_ms} (max_decode_ms)")
        if self.config.to == "rgb":
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        return _hwc(image)

    def _check_cost(self, head: bytes, width: int, height: int, sample: Sample) -> None:
        """Refuse, before decoding, a JPEG of more scans than `max_scans` and a frame whose least cost
        (NS_PER_PIXEL...) is over `max_decode_ms`, or over the time its request has left: a decoder
        cannot be stopped once it runs."""
        scans = 1
        if head[:2] == b"\xff\xd8":
            scans = jpeg_scans(head, self.config.max_scans)
            if scans > self.config.max_scans:
                raise FrameTooLarge(self.step, f"the JPEG has more than {self.config.max_scans} scans (max_scans), "
                                    "each a pass over the whole frame; a camera writes 1, a progressive encoder ~10")
        least_ms = width * height * (NS_PER_PIXEL + NS_PER_PIXEL_SCAN * scans) / 1e6
        if least_ms > self.config.max_decode_ms:
            raise FrameTooLarge(self.step, f"decoding the {width}x{height} frame of {scans} scan(s) would take at "
                                f"least {least_ms:.0f} ms of CPU; the step allows {self.config.max_decode_ms} "
                                "(max_decode_ms)")
        if sample.deadline_ns is not None:
            left_ms = (sample.deadline_ns - time.perf_counter_ns()) / 1e6
            if least_ms > left_ms:
                raise OutOfTime(self.step, f"decoding the {width}x{height} frame of {scans} scan(s) would take at "
                                f"least {least_ms:.0f} ms; the frame's deadline is {max(left_ms, 0):.0f} ms away")

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


def header_size(data: bytes) -> tuple[int, int]:
    """(width, height) a PNG or JPEG declares, read the way the decoders read it; ValueError saying
    why when there is none to read (not PNG or JPEG, truncated, or laid out against the format).

    Read before decoding so that a small file declaring a huge image (a
    decompression bomb) is refused without allocating it. Anything else
    cv2.imdecode would take (BMP, PPM, TIFF...) is refused here: its size
    is not checked.
    """
    if data[:8] == PNG_SIGNATURE:
        return _png_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    raise ValueError("neither a PNG nor a JPEG signature")


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int]:
    """libpng takes the size from IHDR, which must be the first chunk (13 bytes)."""
    if len(data) < 33:
        raise ValueError("the PNG ends before its IHDR chunk")
    if data[12:16] != b"IHDR" or int.from_bytes(data[8:12], "big") != 13:
        raise ValueError(f"the PNG's first chunk is {data[12:16]!r}, not a 13-byte IHDR")
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if not (width and height):
        raise ValueError(f"the PNG declares {width}x{height}")
    return width, height


# Start-of-frame markers (the frame's size): SOF0-3, 5-7, 9-11, 13-15; C4, C8 and CC are not.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RST0-7 (SOI and EOI are handled apart).
_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])
# A real JPEG reaches its SOF within a few segments (APPn, DQT, DHT, COM); an attacker's file of
# thousands of 4-byte segments would otherwise cost a Python loop turn each.
MAX_JPEG_SEGMENTS = 512


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """The size in the first SOF segment, walking the segments as libjpeg does: any number of 0xFF
    fill bytes before a marker, each segment skipped by its own length, however long."""
    at, end = 2, len(data)
    for _ in range(MAX_JPEG_SEGMENTS):
        marker, at = _marker(data, at)
        if marker in _STANDALONE:
            continue
        if marker in (0xD8, 0xD9, 0xDA, 0x00):  # SOI again, EOI or a scan before any frame header
            raise ValueError(f"marker 0xFF{marker:02X} at byte {at - 1} comes before a frame header")
        if at + 2 > end:
            raise ValueError("the JPEG ends inside a segment's length")
        length = int.from_bytes(data[at:at + 2], "big")
        if length < 2:
            raise ValueError(f"segment 0xFF{marker:02X} at byte {at - 1} has length {length}")
        if marker in _SOF:
            return _frame_size(data, at, length)
        at += length
    raise ValueError(f"no frame header in the JPEG's first {MAX_JPEG_SEGMENTS} segments")


def _marker(data: bytes, at: int) -> tuple[int, int]:
    """The marker at byte `at` (after any 0xFF fill bytes), and the byte after it."""
    end = len(data)
    if at >= end or data[at] != 0xFF:
        raise ValueError(f"no JPEG marker at byte {at}" if at < end else "the JPEG ends before its frame header")
    while at < end and data[at] == 0xFF:  # fill bytes
        at += 1
    if at >= end:
        raise ValueError("the JPEG ends before its frame header")
    return data[at], at + 1


def _frame_size(data: bytes, at: int, length: int) -> tuple[int, int]:
    """(width, height) of the frame header (SOF) segment of `length` bytes at byte `at`."""
    if length < 8 or at + 7 > len(data):
        raise ValueError("the JPEG's frame header is cut short")
    height, width = int.from_bytes(data[at + 3:at + 5], "big"), int.from_bytes(data[at + 5:at + 7], "big")
    if not (width and height):  # a height of 0 is defined later (DNL), which libjpeg refuses too
        raise ValueError(f"the JPEG's frame header declares {width}x{height}")
    return width, height


# In a scan's entropy-coded data a 0xFF byte is followed by 0x00 (a stuffed byte) or a restart marker
# (0xD0-0xD7): any other byte after it is the marker that ends the scan.
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7]")


def jpeg_scans(data: bytes, limit: int) -> int:
    """How many scans (SOS segments) the JPEG holds, counted up to `limit + 1` (a file of more is
    refused whatever their number): the segments are walked by their lengths, each scan's entropy-coded
    data skipped to the marker that ends it. A file laid out against the format counts what was read."""
    at, end, scans = 2, len(data), 0
    for _ in range(MAX_JPEG_SEGMENTS + 8 * (limit + 1)):  # a progressive scan comes with a few tables
        if at >= end or data[at] != 0xFF:  # the end, or no marker where one belongs
            return scans
        while at < end and data[at] == 0xFF:  # fill bytes
            at += 1
        if at >= end or data[at] == 0xD9:  # EOI
            return scans
        marker = data[at]
        at += 1
        if marker in _STANDALONE or marker == 0xD8:
            continue
        if at + 2 > end:
            return scans
        at += max(2, int.from_bytes(data[at:at + 2], "big"))
        if marker == 0xDA:
            scans += 1
            if scans > limit:
                return scans
            found = _SCAN_END.search(data, at)
            if found is None:
                return scans
            at = found.start()
    return scans


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
