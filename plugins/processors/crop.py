"""`crop`: each region cut out of the original frame for a next-stage model, rectified to upright.

With `rectify`, a region's quadrilateral is warped onto a rectangle as wide
as its longer top/bottom edge and as tall as its longer side (PP-OCR's crop
for rotated text); without, the region's axis-aligned bounding box is cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import cv2
import numpy as np

from infermux.plugins.processors import DEFAULT_MAX_PIXELS
from infermux.plugins.processors.base import FrameTooLarge, ProcessorError, Sample, parse_config
from infermux.plugins.processors.geometry import INTERPOLATION


@dataclass(frozen=True)
class CropConfig:
    """`rotate_tall`: a crop this many times taller than wide is turned 90° (vertical text); 0 never.
    `max_scale`: each side of a crop at most this many times the frame's longer side; `max_total_pixels`:
    all of a frame's crops together. Both are checked from the boxes, before anything is cropped."""

    rectify: bool = True
    rotate_tall: float = 1.5
    interpolation: str = "cubic"
    max_scale: float = 2.0
    max_total_pixels: int = DEFAULT_MAX_PIXELS

    def check(self) -> tuple[str, str] | None:
        if self.interpolation not in INTERPOLATION:
            return "interpolation", f"must be one of {', '.join(INTERPOLATION)}"
        if self.max_scale <= 0:
            return "max_scale", "must be positive"
        if self.max_total_pixels < 1:
            return "max_total_pixels", "must be at least 1"
        return ("rotate_tall", "must not be negative") if self.rotate_tall < 0 else None


def rectified_size(box: np.ndarray) -> tuple[int, int]:
    """(width, height) of the rectangle `rectify` warps the quadrilateral `box` onto: its longer
    top/bottom edge by its longer side (each at least 1)."""
    box = box.astype(np.float32)
    with np.errstate(over="ignore"):  # an edge longer than float32 holds is inf: held at 2**62 below
        edges = [float(np.linalg.norm(box[a] - box[b])) for a, b in ((0, 1), (2, 3), (0, 3), (1, 2))]
    width, height = (int(min(max(pair), 2.0 ** 62)) for pair in (edges[:2], edges[2:]))
    return max(width, 1), max(height, 1)


def rectify(image: np.ndarray, box: np.ndarray, flag: int = cv2.INTER_CUBIC) -> np.ndarray:
    """The quadrilateral `box` (tl, tr, br, bl) of `image` warped onto an upright rectangle."""
    box = box.astype(np.float32)
    width, height = rectified_size(box)
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    matrix = cv2.getPerspectiveTransform(box, target)
    out = cv2.warpPerspective(image, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=flag)
    return out[:, :, None] if out.ndim == 2 else out


class Crop:
    """Sets `sample.crops`, one HWC uint8 array per region of `sample.regions`, in the same order."""

    kind = "crop"

    def __init__(self, options: Mapping[str, Any], step: str = "crop") -> None:
        self.step = step
        self.config = parse_config(step, CropConfig, options)
        self._flag = INTERPOLATION[self.config.interpolation]

    def __call__(self, sample: Sample) -> None:
        if sample.image is None:
            raise ProcessorError(self.step, "no original frame to crop from: put a 'decode' step first")
        self._check_sizes(sample.image, [region.box for region in sample.regions])
        sample.crops = [self._one(sample.image, region.box) for region in sample.regions]

    def _check_sizes(self, image: np.ndarray, boxes: list[np.ndarray]) -> None:
        """FrameTooLarge before anything is cropped where a crop would be larger than `max_scale` times
        the frame, or all of them together more than `max_total_pixels`: a box is what a model said, and
        a detector's output can say a box far larger than its frame."""
        h, w = image.shape[:2]
        longest, total = self.config.max_scale * max(h, w), 0
        for i, box in enumerate(boxes):
            if not np.isfinite(box).all():  # the pipeline drops these first (base.finite_regions)
                raise ProcessorError(self.step, f"region {i}'s box is not finite numbers")
            cw, ch = rectified_size(box) if self.config.rectify else self._bounds(box, w, h)[2:]
            if max(cw, ch) > longest:
                raise FrameTooLarge(self.step, f"region {i}'s box would crop to {cw}x{ch} from a {w}x{h} frame; a "
                                    f"crop's side is at most {self.config.max_scale:g} times the frame's longer "
                                    "side (max_scale)")
            total += cw * ch
        if total > self.config.max_total_pixels:
            raise FrameTooLarge(self.step, f"the frame's {len(boxes)} crops would be {total} pixels; the step "
                                f"crops at most {self.config.max_total_pixels} (max_total_pixels)")

    @staticmethod
    def _bounds(box: np.ndarray, w: int, h: int) -> tuple[int, int, int, int]:
        """(x0, y0, width, height) of the box's axis-aligned bounds within the frame (at least 1 x 1)."""
        x0, y0 = np.clip(np.floor(box.min(axis=0)), 0, [w - 1, h - 1]).astype(int)
        x1, y1 = np.clip(np.ceil(box.max(axis=0)), [x0 + 1, y0 + 1], [w, h]).astype(int)
        return int(x0), int(y0), int(x1 - x0), int(y1 - y0)

    def _one(self, image: np.ndarray, box: np.ndarray) -> np.ndarray:
        if self.config.rectify:
            out = rectify(image, box, self._flag)
        else:
            x0, y0, cw, ch = self._bounds(box, image.shape[1], image.shape[0])
            out = np.ascontiguousarray(image[y0:y0 + ch, x0:x0 + cw])
        tall = self.config.rotate_tall
        if tall and out.shape[0] >= tall * out.shape[1]:
            out = np.ascontiguousarray(np.rot90(out))
        return out
