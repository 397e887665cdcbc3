"""Configuration (docs/architecture.md#configuration): TOML in, typed and validated dataclasses out.

Every key is declared once, in config/settings.py (its docstring says how to add one); the reference
in docs/configuration.md is generated from those declarations (config/reference.py). Every error names
the file, the field path (`models[name="a"].contexts`: a model entry by its name, and its version where
the name is shared) and the reason; a misspelled field gets the nearest known one. The daemon refuses
to start on it and keeps the old configuration on reload.

The modules: `declare` (how a setting is declared, and the reader of a table), `kinds` (the values a
setting takes), `settings` (the declarations), `daemon`, `models`, `pipelines`, `cameras` and
`sinks` (each section's rules between keys), `reference` (the generated docs). This module reads a whole file and names the package's
public parts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from infermux.config.cameras import parse_cameras
from infermux.config.daemon import SOCKET_FIELDS, load_sockets, parse_daemon, regions_path, resolve_endpoint, runtime_dir
from infermux.config.declare import CAMERA, LIVE, RELOAD, RESTART, SINK, Setting, check_type, read_table, settings_of
from infermux.config.errors import ConfigError, LibraryMissing
from infermux.config.kinds import MAX_WARM_FRAMES, MAX_WARM_SIDE, parse_budget
from infermux.config.models import (check_models, contexts_problem, fallback_of, fallback_problem, model_labels,
                                    parse_model, parse_model_settings, policy_key)
from infermux.config.pipelines import parse_pipelines
from infermux.config.settings import (COLD, FOR_EACH, HOT, MAX_CONTEXTS, MAX_FALLBACK_DEPTH, MAX_NICE, MAX_WEIGHT,
                                      MPS_MODES, OLD_PLACEMENT_NAMES, PATH_OPTIONS, PLACEMENTS, QUEUE_POLICIES,
                                      REINFER, ROLLOUT_COMPARES, SECTIONS, STRATEGIES, STREAM_KEYS, VERSION_POLICIES,
                                      CameraConfig, Config, DaemonConfig, GateConfig, LifecycleConfig, ModelConfig,
                                      PipelineConfig, RolloutConfig, RoutingConfig, SinkConfig, SnapshotConfig,
                                      StepConfig)
from infermux.config.sinks import parse_sinks

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "CAMERA", "COLD", "FOR_EACH", "HOT", "LIVE", "MAX_CONTEXTS", "MAX_FALLBACK_DEPTH", "MAX_NICE", "MAX_WARM_FRAMES",
    "MAX_WARM_SIDE", "MAX_WEIGHT", "MPS_MODES", "OLD_PLACEMENT_NAMES", "PATH_OPTIONS", "PLACEMENTS",
    "QUEUE_POLICIES", "REINFER", "RELOAD", "RESTART", "ROLLOUT_COMPARES", "SECTIONS", "SINK", "SOCKET_FIELDS",
    "STRATEGIES", "STREAM_KEYS", "VERSION_POLICIES", "CameraConfig", "Config", "ConfigError", "DaemonConfig",
    "GateConfig", "LibraryMissing", "LifecycleConfig", "ModelConfig", "PipelineConfig", "RolloutConfig",
    "RoutingConfig", "Setting", "SinkConfig", "SnapshotConfig", "StepConfig", "contexts_problem", "fallback_of",
    "fallback_problem", "load", "load_sockets", "model_labels", "parse", "parse_budget", "parse_model_settings",
    "policy_key", "regions_path", "resolve_endpoint", "runtime_dir", "settings_of",
]


def parse(text: str, file: Path) -> Config:
    """Validate TOML `text` as if read from `file` (relative paths resolve against its folder)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, "", f"not valid TOML: {exc}") from None
    top = {s.name for s in SECTIONS if "." not in s.name}
    for key in data:
        if key not in top:
            raise ConfigError(file, key, f"unknown table; expected {', '.join(sorted(top))}")
    daemon = parse_daemon(file, data.get("daemon", {}))
    routing = RoutingConfig(**read_table(file, "routing", data.get("routing", {}), RoutingConfig))
    raw_models = data.get("models", [])
    check_type(file, "models", raw_models, list)
    labels = model_labels([(m.get("name"), m.get("version")) if isinstance(m, dict) else (None, None)
                           for m in raw_models])
    models = [parse_model(file, label, m, daemon.engine_dir) for label, m in zip(labels, raw_models)]
    check_models(file, models, routing, daemon)
    pipelines = parse_pipelines(file, data.get("pipelines", []), models, daemon.engine_dir)
    cameras = parse_cameras(file, data.get("cameras", []), pipelines)
    sinks = parse_sinks(file, data.get("sinks", []), {p.name for p in pipelines})
    snapshots = SnapshotConfig(**read_table(file, "snapshots", data.get("snapshots", {}), SnapshotConfig))
    return Config(path=file, daemon=daemon, routing=routing, models=tuple(models), pipelines=pipelines,
                  cameras=cameras, sinks=sinks, snapshots=snapshots)


def load(path: str | os.PathLike[str]) -> Config:
    """Read and validate a configuration file."""
    file = Path(path).expanduser().resolve()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(file, "", "is not UTF-8 text") from None
    return parse(text, file)
