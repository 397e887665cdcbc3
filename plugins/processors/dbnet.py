"""`dbnet`: text regions from a DB-net probability map (PP-OCR's text detector).

Threshold the map, take each connected contour's minimum-area rectangle,
score it by the map's mean inside it, grow it by area * `unclip_ratio` /
perimeter (the detector is trained on shrunk text kernels) and map it to
the original frame. pyclipper and shapely, which PP-OCR uses for the
growing, are not needed: for a rectangle the offset is four moved edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import cv2
import numpy as np

from infermux.plugins.processors.base import (ProcessorError, Region, Sample, model_output, parse_config)

_DILATE = np.ones((2, 2), np.uint8)


@dataclass(frozen=True)
class DbnetConfig:
    """Defaults are PP-OCR's (as rapidocr-onnxruntime configures them)."""

    output: str | None = None
    thresh: float = 0.3
    box_thresh: float = 0.5
    unclip_ratio: float = 1.6
    min_size: float = 3.0
    max_candidates: int = 1000
    dilate: bool = True
    label: str | None = None  # what every region is: events and snapshots name it (no classifier needed)

    def check(self) -> tuple[str, str] | None:
        for name in ("thresh", "box_thresh"):
            if not 0 <= getattr(self, name) <= 1:
                return name, "must be between 0 and 1"
        if self.unclip_ratio < 0:
            return "unclip_ratio", "must not be negative"
        if self.max_candidates < 1:
            return "max_candidates", "must be at least 1"
        if self.label is not None and not 0 < len(self.label) <= 64:
            return "label", "must be 1 to 64 characters"
        return None


def order_box(rect: tuple[Any, Any, float]) -> np.ndarray:
    """The rectangle's corners as [top-left, top-right, bottom-right, bottom-left] (float32 (4, 2))."""
    pts = sorted(cv2.boxPoints(rect).tolist(), key=lambda p: p[0])
    left = sorted(pts[:2], key=lambda p: p[1])
    right = sorted(pts[2:], key=lambda p: p[1])
    return np.array([left[0], right[0], right[1], left[1]], np.float32)


def box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean probability inside the (integer-rounded) box, over its bounding window only."""
    h, w = prob.shape
    x0 = int(np.clip(np.floor(box[:, 0].min()), 0, w - 1))
    x1 = int(np.clip(np.ceil(box[:, 0].max()), 0, w - 1))
    y0 = int(np.clip(np.floor(box[:, 1].min()), 0, h - 1))
    y1 = int(np.clip(np.ceil(box[:, 1].max()), 0, h - 1))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), np.uint8)
    cv2.fillPoly(mask, [(box - [x0, y0]).astype(np.int32)], 1)
    return float(cv2.mean(prob[y0:y1 + 1, x0:x1 + 1], mask)[0])


def unclip(box: np.ndarray, distance: float) -> tuple[Any, Any, float]:
    """The minimum-area rectangle of `box` (tl, tr, br, bl) with every edge moved out by `distance`.

    For a rectangle this is DB-net's polygon offset exactly; it is done on
    integer corners, rounded afterwards, as PP-OCR's pyclipper offset is, so
    the boxes land on the same pixels as the reference implementation's.
    """
    corners = np.trunc(box).astype(np.float64)
    ends = np.roll(corners, -1, axis=0)
    edges = ends - corners
    # Corners run clockwise on screen (y down), so (dy, -dx) points out of the box.
    normals = np.stack([edges[:, 1], -edges[:, 0]], axis=1)
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-9)
    moved = np.concatenate([corners + distance * normals, ends + distance * normals])
    return cv2.minAreaRect(np.round(moved).astype(np.int32))


def regions_from_map(prob: np.ndarray, config: DbnetConfig) -> list[tuple[np.ndarray, float]]:
    """(box in map pixels, score) for each text region of a [H, W] probability map."""
    mask = (prob > config.thresh).astype(np.uint8) * np.uint8(255)
    if config.dilate:
        mask = np.asarray(cv2.dilate(mask, _DILATE))
    contours, _ = cv2.findContours(mask, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    found = []
    for contour in contours[:config.max_candidates]:
        rect = cv2.minAreaRect(contour)
        if min(rect[1]) < config.min_size:
            continue
        box = order_box(rect)
        score = box_score(prob, box)
        if score < config.box_thresh:
            continue
        w, h = rect[1]
        grown = unclip(box, w * h * config.unclip_ratio / (2 * (w + h)))
        if min(grown[1]) < config.min_size + 2:
            continue
        found.append((order_box(grown), score))
    return found


class Dbnet:
    """Sets `sample.regions` from the detector's [1, 1, H, W] map, in original-frame pixels."""

    kind = "dbnet"

    def __init__(self, options: Mapping[str, Any], step: str = "dbnet") -> None:
        self.step = step
        self.config = parse_config(step, DbnetConfig, options)

    def __call__(self, sample: Sample) -> None:
        prob = np.asarray(model_output(self.step, sample, self.config.output), np.float32)
        if prob.ndim != 4 or prob.shape[:2] != (1, 1):
            raise ProcessorError(self.step, f"expects a probability map [1, 1, H, W], got {list(prob.shape)}")
        limit = _frame_size(sample, prob.shape[3], prob.shape[2])
        sample.regions = []
        for box, score in regions_from_map(prob[0, 0], self.config):
            original = np.round(sample.transform.to_original(box))
            np.clip(original, 0, limit, out=original)
            sample.regions.append(Region(original, score, self.config.label))


def _frame_size(sample: Sample, w: int, h: int) -> np.ndarray:
    """[width, height] of the original frame (of the map itself when there is no frame)."""
    if sample.image is not None:
        return np.array([sample.image.shape[1], sample.image.shape[0]], np.float32)
    return np.array([w, h], np.float32)
