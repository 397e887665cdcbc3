"""`yolo`: boxes from a YOLO-style detector's output, filtered by score and non-maximum suppression.

Layouts: "v5" is [N, boxes, 5 + classes] (cx, cy, w, h, objectness,
class scores); "v8" is [N, 4 + classes, boxes] (cx, cy, w, h, class
scores, no objectness), as Ultralytics exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from infermux.plugins.processors.base import (ProcessorError, Region, Sample, model_output, parse_config,
                                              read_lines)


@dataclass(frozen=True)
class YoloConfig:
    """`score`: minimum class score (times objectness for v5); `iou`: NMS overlap; `per_class`: NMS per class."""

    output: str | None = None
    layout: str = "v8"
    score: float = 0.25
    iou: float = 0.45
    max_detections: int = 300
    per_class: bool = True
    labels: Path | None = None

    def check(self) -> tuple[str, str] | None:
        if self.layout not in ("v5", "v8"):
            return "layout", f"must be 'v5' or 'v8', got {self.layout!r}"
        for name in ("score", "iou"):
            if not 0 <= getattr(self, name) <= 1:
                return name, "must be between 0 and 1"
        return ("max_detections", "must be at least 1") if self.max_detections < 1 else None


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of one [x0, y0, x1, y1] box with each row of `others`."""
    ix0 = np.maximum(box[0], others[:, 0])
    iy0 = np.maximum(box[1], others[:, 1])
    ix1 = np.minimum(box[2], others[:, 2])
    iy1 = np.minimum(box[3], others[:, 3])
    inter = np.clip(ix1 - ix0, 0, None) * np.clip(iy1 - iy0, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-9)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, limit: int | None = None) -> np.ndarray:
    """Indices of the boxes kept, best first: each box suppresses later ones overlapping it by > threshold."""
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size and (limit is None or len(keep) < limit):
        best, order = order[0], order[1:]
        keep.append(int(best))
        order = order[iou(boxes[best], boxes[order]) <= threshold]
    return np.array(keep, dtype=np.intp)


def corners(xyxy: np.ndarray) -> np.ndarray:
    """[x0, y0, x1, y1] as the four corners, clockwise from top-left (4, 2)."""
    x0, y0, x1, y1 = xyxy
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)


class Yolo:
    """Sets `sample.regions` (boxes, scores, labels) for the first image of the batch."""

    kind = "yolo"

    def __init__(self, options: Mapping[str, Any], step: str = "yolo") -> None:
        self.step = step
        self.config = parse_config(step, YoloConfig, options)
        self.labels = read_lines(step, "labels", self.config.labels) if self.config.labels else None

    def __call__(self, sample: Sample) -> None:
        out = np.asarray(model_output(self.step, sample, self.config.output), np.float32)
        xyxy, scores, classes = self._candidates(self._check(out)[0])
        finite = np.isfinite(xyxy).all(axis=1)
        if not finite.all():  # a NaN box would suppress every box in NMS: dropped first, and counted
            sample.dropped += int((~finite).sum())
            xyxy, scores, classes = xyxy[finite], scores[finite], classes[finite]
        offset = classes[:, None] * (float(xyxy.max()) + 1) if self.config.per_class and xyxy.size else 0
        kept = nms(xyxy + offset, scores, self.config.iou, self.config.max_detections)
        boxes = sample.transform.to_original(np.stack([corners(xyxy[i]) for i in kept]) if kept.size
                                             else np.zeros((0, 4, 2), np.float32))
        sample.regions = [Region(box, float(scores[i]), self._name(int(classes[i])))
                          for box, i in zip(boxes, kept)]

    def _check(self, out: np.ndarray) -> np.ndarray:
        first = 5 if self.config.layout == "v5" else 4
        values = out.shape[1] if self.config.layout == "v8" else out.shape[-1]
        if out.ndim != 3 or out.shape[0] < 1 or values <= first:
            raise ProcessorError(self.step, f"layout {self.config.layout} expects [N, ...] of rank 3 with more "
                                 f"than {first} values per box, got {list(out.shape)}")
        if self.labels is not None and len(self.labels) != values - first:
            raise ProcessorError(self.step, f"the label file has {len(self.labels)} labels but the model "
                                 f"scores {values - first} classes")
        return out

    def _candidates(self, out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Boxes [x0, y0, x1, y1], scores and classes of the first image's boxes over the score threshold.

        v8 is scored in its own [values, boxes] layout (transposing 8400 x 84 first costs more than the
        rest), and only the boxes over the threshold are arg-maxed: max is ten times cheaper than argmax.
        """
        if self.config.layout == "v8":
            class_scores, cxcywh = out[4:], out[:4]
        else:
            class_scores, cxcywh = (out[:, 5:] * out[:, 4:5]).T, out[:, :4].T
        hit = class_scores.max(axis=0) >= self.config.score
        candidates = class_scores[:, hit]
        classes = candidates.argmax(axis=0)
        scores = candidates[classes, np.arange(candidates.shape[1])]
        cx, cy, w, h = cxcywh[:, hit]
        with np.errstate(invalid="ignore", over="ignore"):  # a model's inf gives NaN corners: dropped by the caller
            xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        return xyxy, scores, classes

    def _name(self, index: int) -> str:
        return self.labels[index] if self.labels is not None else str(index)
