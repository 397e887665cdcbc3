"""Backend discovery: built-ins plus the entry-point group `infermux.backends`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

from infermux.plugins import discovery
from infermux.plugins.base import Backend, BackendError

log = logging.getLogger("infermux.plugins")

# Built-ins are listed here as well as in pyproject's entry points so that a
# source checkout without `pip install` still finds them.
BUILTIN = {
    "onnxruntime": "infermux.plugins.backends.onnxruntime:OnnxRuntimeBackend",
    "tensorrt": "infermux.plugins.backends.tensorrt:TensorRTBackend",
}

_cache: dict[str, Backend] = {}


def _load_object(spec: str) -> Backend:
    return cast(Backend, cast(type, discovery.resolve(spec))())


def available() -> dict[str, str]:
    """Backend name -> 'module:Class' for every backend that can be tried."""
    return discovery.specs("infermux.backends", BUILTIN)


def get(name: str) -> Backend:
    """The backend called `name` (or given as "module:Class"), imported once."""
    if name not in _cache:
        specs = discovery.specs("infermux.backends", BUILTIN, name)
        if name not in specs:
            raise BackendError(f"unknown backend {name!r}; installed: {', '.join(sorted(specs))}")
        try:
            _cache[name] = _load_object(specs[name])
        except ImportError as exc:
            raise BackendError(f"backend {name!r} is not usable here: {exc}") from exc
    return _cache[name]


SUFFIXES = {".onnx": "onnxruntime", ".plan": "tensorrt", ".engine": "tensorrt"}


def session_per_context(path: Path, name: str = "") -> bool:
    """Whether the backend that serves `path` (or the one called `name`) holds a copy of the model
    per execution context: onnxruntime keeps one session, with its own weights, per context; a
    TensorRT engine is shared by its contexts. What memory estimates and footprints multiply by."""
    return path.suffix.lower() == ".onnx" and name in ("", "onnxruntime")


def for_path(path: Path, name: str | None = None) -> Backend:
    """The backend named `name`, or the one that serves this file suffix."""
    if name:
        return get(name)
    suffix = path.suffix.lower()
    if suffix in SUFFIXES:
        return get(SUFFIXES[suffix])
    for candidate in available():
        try:
            backend = get(candidate)
        except BackendError:
            continue
        if suffix in backend.suffixes:
            return backend
    raise BackendError(f"no backend serves {suffix or 'files without a suffix'!r} ({path}); "
                       f"set `backend = ...` in the model's config")
