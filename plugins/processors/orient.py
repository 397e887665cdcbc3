"""`orient`: turn a crop upside down where a direction classifier says it is (PP-OCR's `cls` stage).

Runs after `classify` on a crop (a pipeline's `for_each = "regions"` step):
where the best class is `label` with a score above `min_score`, the crop is
rotated 180°. The working tensor is cleared either way, so the next step
(the recogniser's resize) starts again from the crop, and the region's label,
which was only the direction, is cleared too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from infermux.plugins.processors.base import ProcessorError, Sample, parse_config


@dataclass(frozen=True)
class OrientConfig:
    """`label`: the class that means "upside down"; `min_score`: how sure the classifier must be
    (rapidocr: "180" above 0.9)."""

    label: str = "180"
    min_score: float = 0.9


class Orient:
    """Rotates `sample.image` by 180° where `sample.classes` says so; clears `tensor` and the labels."""

    kind = "orient"

    def __init__(self, options: Mapping[str, Any], step: str = "orient") -> None:
        self.step = step
        self.config = parse_config(step, OrientConfig, options)

    def __call__(self, sample: Sample) -> None:
        if sample.image is None or not sample.classes:
            raise ProcessorError(self.step, "needs a crop and a classify step before it")
        best = sample.classes[0][0]
        if best.label == self.config.label and best.score > self.config.min_score:
            sample.image = np.ascontiguousarray(sample.image[::-1, ::-1])
        sample.tensor = None
        for region in sample.regions:
            region.label = None
