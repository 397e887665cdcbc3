"""A processor plugin that holds each frame until the file named by its `path` option exists
(tests/daemon/pipelines/test_pipelines.py: a frame in flight across a reload, with no sleep deciding the order).
A test stand-in; named as "gate_processor:Gate"."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from gates import opened

from infermux.plugins.processors.base import ProcessorError, Sample


class Gate:
    kind = "gate"

    def __init__(self, options: Mapping[str, Any], step: str = "gate") -> None:
        self.step = step
        self.path = Path(str(options.get("path", "")))
        self.entered = self.path.with_suffix(".entered")  # the test waits for this: a frame is inside

    def __call__(self, sample: Sample) -> None:
        self.entered.touch()
        if not opened(self.path, limit_s=60):
            raise ProcessorError(self.step, f"{self.path} never appeared")
