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

from infermux.plugins.processors.base import ProcessorError, Sample, parse_config
from infermux.plugins.processors.geometry import INTERPOLATION


@dataclass(frozen=True)
class CropConfig:
    """`rotate_tall`: a crop this many times taller than wide is turned 90° (vertical text); 0 never."""

    rectify: bool = True
    rotate_tall: float = 1.5
    interpolation: str = "cubic"

    def check(self) -> tuple[str, str] | None:
        if self.interpolation not in INTERPOLATION:
            return "interpolation", f"must be one of {', '.join(INTERPOLATION)}"
        return ("rotate_tall", "must not be negative") if self.rotate_tall < 0 else None


def rectify(image: np.ndarray, box: np.ndarray, flag: int = cv2.INTER_CUBIC) -> np.ndarray:
    """The quadrilateral `box` (tl, tr, br, bl) of `image` warped onto an upright rectangle."""
    box = box.astype(np.float32)
    width = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    height = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    width, height = max(width, 1), max(height, 1)
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
        sample.crops = [self._one(sample.image, region.box) for region in sample.regions]

    def _one(self, image: np.ndarray, box: np.ndarray) -> np.ndarray:
        if self.config.rectify:
            out = rectify(image, box, self._flag)
        else:
            h, w = image.shape[:2]
            x0, y0 = np.clip(np.floor(box.min(axis=0)), 0, [w - 1, h - 1]).astype(int)
            x1, y1 = np.clip(np.ceil(box.max(axis=0)), [x0 + 1, y0 + 1], [w, h]).astype(int)
            out = np.ascontiguousarray(image[y0:y1, x0:x1])
        tall = self.config.rotate_tall
        if tall and out.shape[0] >= tall * out.shape[1]:
            out = np.ascontiguousarray(np.rot90(out))
        return out
