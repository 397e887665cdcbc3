"""`resize`: to a size (stretched or letterboxed), to multiples of N, or to a fixed height.

Every mode records what it did in `sample.transform`, so post-processors
map what they find back to the original frame's pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import cv2
import numpy as np

from infermux.plugins.processors import DEFAULT_MAX_PIXELS
from infermux.plugins.processors.base import FrameTooLarge, Sample, parse_config, working

INTERPOLATION = {"nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR,
                 "cubic": cv2.INTER_CUBIC, "area": cv2.INTER_AREA}
MODES = ("stretch", "letterbox", "multiple", "height")


@dataclass(frozen=True)
class ResizeConfig:
    """See docs/pipelines.md#resize for each mode and the options it reads."""

    mode: str = "stretch"
    size: tuple[int, int] | None = None
    multiple: int = 32
    limit_side: int | None = None
    limit: str = "max"
    max_side: int | None = None  # `multiple`: a frame whose longer side would come out larger is refused
    height: int | None = None
    max_width: int | None = None
    pad_value: int = 114
    pad: bool = True  # `height`: pad up to max_width (false: leave it narrower; a pipeline pads the batch)
    center: bool = True
    interpolation: str = "linear"
    max_pixels: int = DEFAULT_MAX_PIXELS  # the image it makes, checked before making it (mode height: any width)

    def check(self) -> tuple[str, str] | None:
        """The first option out of its bounds, and why (None: all within)."""
        return self._check_mode() or self._check_bounds()

    def _check_mode(self) -> tuple[str, str] | None:
        """The mode, and the size or height it needs."""
        if self.mode not in MODES:
            return "mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}"
        if self.mode in ("stretch", "letterbox") and (self.size is None or min(self.size) < 1):
            return "size", f"must be [width, height], two positive integers, for mode {self.mode!r}"
        if self.mode == "height" and (self.height is None or self.height < 1):
            return "height", "must be a positive integer for mode 'height'"
        return None

    def _check_bounds(self) -> tuple[str, str] | None:
        """The other options."""
        if self.multiple < 1:
            return "multiple", "must be at least 1"
        if self.limit not in ("max", "min"):
            return "limit", f"must be 'max' or 'min', got {self.limit!r}"
        if self.limit_side is not None and self.limit_side < 1:
            return "limit_side", "must be at least 1"
        if self.max_side is not None and (self.max_side < self.multiple or self.mode != "multiple"):
            return "max_side", (f"must be at least `multiple` ({self.multiple})" if self.mode == "multiple"
                                else "applies to mode 'multiple' only")
        if not 0 <= self.pad_value <= 255:
            return "pad_value", "must be 0..255"
        if self.interpolation not in INTERPOLATION:
            return "interpolation", f"must be one of {', '.join(INTERPOLATION)}"
        return ("max_pixels", "must be at least 1") if self.max_pixels < 1 else None


class Resize:
    """Resizes `sample.tensor` (HWC) and composes the scale and padding onto `sample.transform`."""

    kind = "resize"

    def __init__(self, options: Mapping[str, Any], step: str = "resize") -> None:
        self.step = step
        self.config = parse_config(step, ResizeConfig, options)
        self._flag = INTERPOLATION[self.config.interpolation]

    def __call__(self, sample: Sample) -> None:
        image = working(self.step, sample)
        h, w = image.shape[:2]
        mode = self.config.mode
        if mode == "letterbox":
            out, sx, sy, px, py = self._letterbox(image, w, h)
        else:
            tw, th = self._target(w, h)
            self._check_pixels(w, h, max(tw, self.config.max_width or 0) if mode == "height" else tw, th)
            out = self._resize(image, tw, th)
            sx, sy, px, py = tw / w, th / h, 0.0, 0.0
            if mode == "height" and self.config.pad and self.config.max_width and tw < self.config.max_width:
                out = self._pad(out, self.config.max_width, th, 0, 0)
        sample.tensor = out
        sample.transform = sample.transform.then(sx, sy, px, py)

    def output_size(self, w: int, h: int) -> tuple[int, int]:
        """The (width, height) this step makes of a w x h image, as `__call__` would, without an image
        (what the daemon warms a model at); FrameTooLarge where `__call__` would refuse it."""
        c = self.config
        if c.mode == "letterbox":
            assert c.size is not None
            return c.size
        tw, th = self._target(w, h)
        if c.mode == "height" and c.pad and c.max_width and tw < c.max_width:
            return c.max_width, th
        return tw, th

    def _target(self, w: int, h: int) -> tuple[int, int]:
        c = self.config
        if c.mode == "stretch":
            assert c.size is not None
            return c.size
        if c.mode == "height":
            assert c.height is not None
            width = max(1, math.ceil(c.height * w / h))
            return (min(width, c.max_width) if c.max_width else width), c.height
        ratio = 1.0
        if c.limit_side is not None:
            side = max(w, h) if c.limit == "max" else min(w, h)
            if (c.limit == "max" and side > c.limit_side) or (c.limit == "min" and side < c.limit_side):
                ratio = c.limit_side / side
        # Rounded as PP-OCR's detector does, so boxes match its reference pipeline.
        tw = max(c.multiple, round(int(w * ratio) / c.multiple) * c.multiple)
        th = max(c.multiple, round(int(h * ratio) / c.multiple) * c.multiple)
        if c.max_side is not None and max(tw, th) > c.max_side:  # before the model computes on it
            # A small but elongated frame gets here by being scaled up, and a smaller one would not help.
            advice = (f"its shorter side is scaled up to {c.limit_side} (limit = \"min\"), so crop it to a less "
                      f"elongated frame or raise max_side" if ratio > 1 else "send a smaller frame")
            raise FrameTooLarge(self.step, f"the {w}x{h} frame would be resized to {tw}x{th} for the model; the "
                                f"limit is {c.max_side} a side (max_side); {advice}")
        return tw, th

    def _check_pixels(self, w: int, h: int, tw: int, th: int) -> None:
        """FrameTooLarge before resizing where the image made would be over `max_pixels` (mode `height`
        without `max_width` makes an image as wide as its input is elongated)."""
        if tw * th > self.config.max_pixels:
            raise FrameTooLarge(self.step, f"the {w}x{h} image would be resized to {tw}x{th}, over the "
                                f"{self.config.max_pixels} pixels this step makes (max_pixels)")

    def _letterbox(self, image: np.ndarray, w: int, h: int) -> tuple[np.ndarray, float, float, float, float]:
        assert self.config.size is not None
        tw, th = self.config.size
        scale = min(tw / w, th / h)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        px, py = ((tw - nw) // 2, (th - nh) // 2) if self.config.center else (0, 0)
        out = self._pad(self._resize(image, nw, nh), tw, th, px, py)
        return out, nw / w, nh / h, float(px), float(py)

    def _resize(self, image: np.ndarray, tw: int, th: int) -> np.ndarray:
        if image.shape[1] == tw and image.shape[0] == th:
            return image
        out = cv2.resize(image, (tw, th), interpolation=self._flag)
        return out[:, :, None] if out.ndim == 2 else out

    def _pad(self, image: np.ndarray, tw: int, th: int, px: int, py: int) -> np.ndarray:
        """`image` placed at (px, py) on a (th, tw) canvas of pad_value: one allocation, one copy."""
        if image.shape[:2] == (th, tw):
            return image
        out = np.full((th, tw, image.shape[2]), self.config.pad_value, dtype=image.dtype)
        out[py:py + image.shape[0], px:px + image.shape[1]] = image
        return out
