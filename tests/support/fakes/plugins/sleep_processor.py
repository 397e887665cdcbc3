"""A processor plugin that takes `seconds` per frame and changes nothing (tests/daemon/pipelines/test_pipeline_bounds.py:
a frame whose deadline passes inside a step). A test stand-in; named as "sleep_processor:Sleep"."""

from __future__ import annotations

import time
from typing import Any, Mapping

from infermux.plugins.processors.base import Sample


class Sleep:
    kind = "sleep"

    def __init__(self, options: Mapping[str, Any], step: str = "sleep") -> None:
        self.step = step
        self.seconds = float(options.get("seconds", 0.5))

    def __call__(self, sample: Sample) -> None:
        time.sleep(self.seconds)
