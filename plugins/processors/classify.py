"""`classify`: softmax / argmax / top-k over a classifier's [N, C] scores, with a label file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from infermux.plugins.processors.base import (Label, ProcessorError, Sample, model_output, parse_config,
                                              read_lines)


@dataclass(frozen=True)
class ClassifyConfig:
    """`k` best classes per row; `softmax` turns logits into probabilities first; `labels`: one name a line."""

    output: str | None = None
    k: int = 1
    softmax: bool = True
    labels: Path | None = None

    def check(self) -> tuple[str, str] | None:
        return ("k", "must be at least 1") if self.k < 1 else None


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along `axis`, shifted by the maximum so large logits do not overflow."""
    shifted = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores of each row, best first (argmax is k = 1)."""
    k = min(k, scores.shape[-1])
    part = np.argpartition(-scores, k - 1, axis=-1)[..., :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=-1), axis=-1, kind="stable")
    return np.take_along_axis(part, order, axis=-1)


class Classify:
    """Sets `sample.classes` (one top-k list per row) and, where rows match regions, each region's label."""

    kind = "classify"

    def __init__(self, options: Mapping[str, Any], step: str = "classify") -> None:
        self.step = step
        self.config = parse_config(step, ClassifyConfig, options)
        self.labels = read_lines(step, "labels", self.config.labels) if self.config.labels else None

    def __call__(self, sample: Sample) -> None:
        scores = np.asarray(model_output(self.step, sample, self.config.output), np.float32)
        if scores.ndim == 1:
            scores = scores[None]
        if scores.ndim != 2:
            raise ProcessorError(self.step, f"expects scores [N, classes], got shape {list(scores.shape)}")
        if self.labels is not None and len(self.labels) != scores.shape[1]:
            raise ProcessorError(self.step, f"the label file has {len(self.labels)} labels but the model "
                                 f"scores {scores.shape[1]} classes")
        probs = softmax(scores) if self.config.softmax else scores
        best = top_k(probs, self.config.k)
        sample.classes = [[Label(int(i), self._name(int(i)), float(row[i])) for i in idx]
                          for row, idx in zip(probs, best)]
        if len(sample.regions) == len(sample.classes):
            for region, classes in zip(sample.regions, sample.classes):
                region.label = classes[0].label

    def _name(self, index: int) -> str:
        return self.labels[index] if self.labels is not None else str(index)
