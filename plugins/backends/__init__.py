"""Backend discovery: built-ins plus the entry-point group `infermux.backends`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

from infermux.plugins import discovery
from infermux.plugins.base import Backend, BackendError
from infermux.plugins.requirements import missing_dependency

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


def refusal(name: str) -> str | None:
    """Why a `model.toml` in engine_dir may not name backend `name` (only installed ones), or None."""
    return discovery.installed_only("infermux.backends", BUILTIN, name, "backend")


def get(name: str) -> Backend:
    """The backend called `name` (or given as "module:Class"), imported once."""
    if name not in _cache:
        specs = discovery.specs("infermux.backends", BUILTIN, name)
        if name not in specs:
            raise BackendError(f"unknown backend {name!r}; installed: {', '.join(sorted(specs))}")
        try:
            _cache[name] = _load_object(specs[name])
        except ImportError as exc:
            missing = missing_dependency(exc, f"backend {name!r}")
            raise BackendError(str(missing) if missing else f"backend {name!r} is not usable here: {exc}") from exc
    return _cache[name]


SUFFIXES = {".onnx": "onnxruntime", ".plan": "tensorrt", ".engine": "tensorrt"}


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
