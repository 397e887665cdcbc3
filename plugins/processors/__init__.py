"""Processor discovery: built-ins plus the entry-point group `infermux.processors` (docs/pipelines.md).

Found and loaded the way backends are (infermux.plugins.backends): a name
maps to "module:Class", imported on first use; "module:Class" itself is
accepted as a name, for a processor not installed as a package.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, cast

# OpenCV reads its own pixel limit once, when cv2 is loaded (a static initialised in imgcodecs'
# loadsave.cpp; setting it later changes nothing), and checks it before allocating a decoded
# image. Every module here that imports cv2 is imported after this package, so this runs first:
# the limit becomes `decode`'s default max_pixels unless the daemon's environment sets one.
DEFAULT_MAX_PIXELS = 8192 * 8192
OPENCV_PIXELS = "OPENCV_IO_MAX_IMAGE_PIXELS"
os.environ.setdefault(OPENCV_PIXELS, str(DEFAULT_MAX_PIXELS))

from infermux.plugins import discovery  # noqa: E402
from infermux.plugins.requirements import missing_dependency  # noqa: E402

from infermux.plugins.processors.base import (Processor, ProcessorConfigError, ProcessorError,  # noqa: E402
                                              ProcessorFactory, Sample)

__all__ = ["Processor", "ProcessorConfigError", "ProcessorError", "ProcessorFactory", "Sample",
           "available", "create", "factory"]

# Listed here as well as in pyproject's entry points so that a source
# checkout without `pip install` still finds them.
BUILTIN = {
    "decode": "infermux.plugins.processors.frames:Decode",
    "resize": "infermux.plugins.processors.geometry:Resize",
    "normalize": "infermux.plugins.processors.tensor:Normalize",
    "layout": "infermux.plugins.processors.tensor:Layout",
    "cast": "infermux.plugins.processors.tensor:Cast",
    "classify": "infermux.plugins.processors.classify:Classify",
    "ctc": "infermux.plugins.processors.ctc:Ctc",
    "dbnet": "infermux.plugins.processors.dbnet:Dbnet",
    "yolo": "infermux.plugins.processors.detect:Yolo",
    "crop": "infermux.plugins.processors.crop:Crop",
    "roi": "infermux.plugins.processors.roi:Roi",
    "orient": "infermux.plugins.processors.orient:Orient",
    "select": "infermux.plugins.processors.select:Select",
    "track": "infermux.plugins.processors.track:Track",
}

_cache: dict[str, ProcessorFactory] = {}


def available() -> dict[str, str]:
    """Processor kind -> 'module:Class' for every processor that can be tried."""
    return discovery.specs("infermux.processors", BUILTIN)


def factory(kind: str) -> ProcessorFactory:
    """The class (factory) of processor `kind` (or "module:Class"), imported once."""
    if kind not in _cache:
        specs = discovery.specs("infermux.processors", BUILTIN, kind)
        if kind not in specs:
            raise ProcessorConfigError(kind, f"unknown processor; installed: {', '.join(sorted(specs))}")
        try:
            _cache[kind] = cast(ProcessorFactory, discovery.resolve(specs[kind]))
        except (ImportError, AttributeError) as exc:
            missing = missing_dependency(exc, f"processor {kind!r}") if isinstance(exc, ImportError) else None
            if missing is not None:
                raise missing from exc  # the file is fine: a library is not installed
            raise ProcessorConfigError(kind, f"processor is not usable here: {exc}") from exc
    return _cache[kind]


def create(kind: str, options: Mapping[str, Any] | None = None, step: str | None = None) -> Processor:
    """A processor of `kind` built from `options`; `step` names it in errors (default: the kind)."""
    return factory(kind)(options or {}, step or kind)
