"""`select`: keep the regions that are sure enough (rapidocr drops texts read below 0.5).

A frame-level step after a fan-out: regions whose detection `score` is below
`min_score`, or whose recognised text scores below `min_text_score`, are
dropped, and their crops with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from infermux.plugins.processors.base import Sample, parse_config


@dataclass(frozen=True)
class SelectConfig:
    """`min_score`: least detection score; `min_text_score`: least text score (regions without a
    text are kept); `drop_empty`: drop regions whose text is the empty string."""

    min_score: float = 0.0
    min_text_score: float = 0.0
    drop_empty: bool = False


class Select:
    """Filters `sample.regions` (and `sample.crops`, kept in step with them)."""

    kind = "select"

    def __init__(self, options: Mapping[str, Any], step: str = "select") -> None:
        self.step = step
        self.config = parse_config(step, SelectConfig, options)

    def __call__(self, sample: Sample) -> None:
        c = self.config
        keep = [i for i, r in enumerate(sample.regions)
                if r.score >= c.min_score
                and (r.text_score is None or r.text_score >= c.min_text_score)
                and not (c.drop_empty and r.text == "")]
        if len(sample.crops) == len(sample.regions):
            sample.crops = [sample.crops[i] for i in keep]
        sample.regions = [sample.regions[i] for i in keep]
