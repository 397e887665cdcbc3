"""The settings of events and sinks: a pipeline's `events` table and the global `[[sinks]]`.

Read by config.py, which turns a `Problem` into its ConfigError naming the
file; kept apart so that events and sinks (docs/events.md) are declared in
one place, next to their bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from infermux.plugins import sinks as sink_plugins


class Problem(Exception):
    """A setting that is wrong: `where` (a dotted path under the file) and why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


@dataclass(frozen=True)
class LifecycleConfig:
    """A pipeline's `events` table: when a tracked object's `new`, `update` and `end` events are
    made (daemon/pipelines/lifecycle.py). A pipeline with it needs a `track` step."""

    min_frames: int = 3  # frames an object is seen scoring at least min_score before its `new`
    min_score: float = 0.5
    end_after_s: float = 2.0  # an object unseen this long has ended
    update_every_s: float = 1.0  # at most one `update` per object this often; changes in between wait
    min_score_gain: float = 0.05  # a best score that rose by less is not a change worth an `update`
    max_objects: int = 4096  # objects followed at once over every stream of the pipeline; newcomers past it wait


@dataclass(frozen=True)
class SinkConfig:
    """One `[[sinks]]` entry: a sink of kind `kind` (jsonl, zmq, mqtt, webhook or a plugin's) with its
    `options`, and its durable spool's bounds (daemon/sinks/spool.py)."""

    name: str
    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)
    pipelines: tuple[str, ...] = ()  # the pipelines whose events it takes; empty: every one
    max_events: int = 100_000  # events waiting in the spool at most; past it the oldest are dropped
    max_mb: float = 64.0  # ... and at most this many MiB of them
    batch: int = 100  # events handed to the sink at once
    retry_s: float = 0.5  # the first wait after a failed delivery; it doubles up to max_retry_s
    max_retry_s: float = 30.0


LIFECYCLE_BOUNDS: dict[str, tuple[float, float]] = {
    "min_frames": (1, 10_000), "min_score": (0.0, 1.0), "end_after_s": (0.05, 86_400),
    "update_every_s": (0.0, 86_400), "min_score_gain": (0.0, 1.0), "max_objects": (1, 1_000_000)}
SINK_BOUNDS: dict[str, tuple[float, float]] = {
    "max_events": (1, 100_000_000), "max_mb": (0.01, 1 << 20), "batch": (1, 10_000), "retry_s": (0.01, 3600),
    "max_retry_s": (0.01, 86_400)}
MAX_SINKS = 64
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # a sink's name is its spool's folder


def _number(where: str, key: str, value: Any, integer: bool, bounds: tuple[float, float]) -> float:
    want = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, want):
        raise Problem(f"{where}.{key}", f"must be {'an integer' if integer else 'a number'}, got {value!r}")
    low, high = bounds
    if not low <= value <= high:
        raise Problem(f"{where}.{key}", f"must be between {low:g} and {high:g}, got {value!r}")
    return value


def _known(where: str, table: Mapping[str, Any], cls: type) -> None:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise Problem(f"{where}.{unknown[0]}", f"unknown field; known fields: {', '.join(sorted(names))}")


def parse_lifecycle(where: str, table: Any) -> LifecycleConfig:
    """A pipeline's `events` table, checked: each number within its bounds (LIFECYCLE_BOUNDS)."""
    if not isinstance(table, dict):
        raise Problem(where, f"must be a table, got {type(table).__name__}")
    _known(where, table, LifecycleConfig)
    for key, value in table.items():
        _number(where, key, value, key in ("min_frames", "max_objects"), LIFECYCLE_BOUNDS[key])
    return LifecycleConfig(**table)


def parse_sinks(raw: Any, pipelines: set[str]) -> tuple[SinkConfig, ...]:
    """Every `[[sinks]]` entry: unique names, a known kind whose options it accepts, spool bounds."""
    if not isinstance(raw, list):
        raise Problem("sinks", f"must be an array of tables ([[sinks]]), got {type(raw).__name__}")
    if len(raw) > MAX_SINKS:
        raise Problem("sinks", f"at most {MAX_SINKS} sinks, got {len(raw)}")
    out: list[SinkConfig] = []
    for i, table in enumerate(raw):
        sink = _parse_sink(f"sinks[{i}]", table, pipelines)
        if any(s.name == sink.name for s in out):
            raise Problem(f"sinks[{i}].name", f"{sink.name!r} is already another sink's name")
        out.append(sink)
    return tuple(out)


def _parse_sink(where: str, table: Any, pipelines: set[str]) -> SinkConfig:
    if not isinstance(table, dict):
        raise Problem(where, f"must be a table, got {type(table).__name__}")
    _known(where, table, SinkConfig)
    for key in ("name", "kind"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise Problem(f"{where}.{key}", f"is required: a non-empty string, got {table.get(key)!r}")
    if not NAME.fullmatch(table["name"]):
        raise Problem(f"{where}.name", f"{table['name']!r}: letters, digits, '_', '.', '-', at most 64, "
                      "not starting with '.' or '-' (it names the spool's folder)")
    options = table.get("options", {})
    if not isinstance(options, dict):
        raise Problem(f"{where}.options", f"must be a table, got {type(options).__name__}")
    try:
        sink_plugins.check(table["kind"], options)
    except sink_plugins.SinkConfigError as exc:
        raise Problem(f"{where}.options" if "option" in exc.reason else f"{where}.kind", exc.reason) from None
    for key, bounds in SINK_BOUNDS.items():
        if key in table:
            _number(where, key, table[key], key in ("max_events", "batch"), bounds)
    chosen = table.get("pipelines", [])
    if not isinstance(chosen, list) or not all(isinstance(p, str) for p in chosen):
        raise Problem(f"{where}.pipelines", f"must be a list of pipeline names, got {chosen!r}")
    unknown = sorted(set(chosen) - pipelines)
    if unknown:
        raise Problem(f"{where}.pipelines", f"{unknown[0]!r} is not a pipeline of this file")
    return SinkConfig(**{**table, "options": dict(options), "pipelines": tuple(chosen)})
