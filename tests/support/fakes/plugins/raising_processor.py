"""A processor plugin that fails with an unexpected exception (tests/daemon/pipelines/test_pipelines.py: a 500 for that
request only). A stand-in for a buggy third-party processor; named as "raising_processor:Raising"."""

from __future__ import annotations

from typing import Any, Mapping

from infermux.plugins.processors.base import Sample


class Raising:
    kind = "raising"

    def __init__(self, options: Mapping[str, Any], step: str = "raising") -> None:
        self.step = step

    def __call__(self, sample: Sample) -> None:
        raise ZeroDivisionError("a bug in a processor")
