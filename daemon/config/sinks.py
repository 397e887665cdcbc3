"""`[[sinks]]` entries: their keys read as declared (config/settings.py), then the rules a declaration
cannot hold: a sink kind that is installed, whose own options it accepts (the kind checks them, as a
processor's are checked by creating it), unique names, and `pipelines` naming pipelines of the file."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from infermux.config.declare import check_type, child, read_table
from infermux.config.errors import ConfigError
from infermux.config.settings import SinkConfig
from infermux.plugins import sinks as sink_plugins

MAX_SINKS = 64  # each is a thread and a spool's folder


def parse_sinks(file: Path, raw: Any, pipelines: set[str]) -> tuple[SinkConfig, ...]:
    """Every `[[sinks]]` entry; names are unique and `pipelines` names pipelines of `pipelines`."""
    check_type(file, "sinks", raw, list)
    if len(raw) > MAX_SINKS:
        raise ConfigError(file, "sinks", f"at most {MAX_SINKS} sinks, got {len(raw)}")
    out: list[SinkConfig] = []
    for i, table in enumerate(raw):
        sink = parse_sink(file, f"sinks[{i}]", table, pipelines)
        if any(s.name == sink.name for s in out):
            raise ConfigError(file, f"sinks[{i}].name", f"{sink.name!r} is already another sink's name (each "
                              "sink's name is its spool's folder)")
        out.append(sink)
    return tuple(out)


def parse_sink(file: Path, where: str, table: Any, pipelines: set[str]) -> SinkConfig:
    """One `[[sinks]]` entry (`where` names it in errors)."""
    raw = read_table(file, where, table, SinkConfig)
    options = raw.get("options", {})
    try:
        sink_plugins.check(raw["kind"], options)
    except sink_plugins.SinkConfigError as exc:
        raise ConfigError(file, _option_path(where, exc), exc.reason) from None
    for j, name in enumerate(raw.get("pipelines", ())):
        if name not in pipelines:
            near = difflib.get_close_matches(name, sorted(pipelines), n=1, cutoff=0.75)
            hint = f"did you mean `{near[0]}`? " if near else ""
            raise ConfigError(file, f"{child(where, 'pipelines')}[{j}]", f"unknown pipeline {name!r}; {hint}"
                              f"pipelines: {', '.join(sorted(pipelines)) or 'none (add a [[pipelines]] entry)'}")
    return SinkConfig(**{**raw, "options": dict(options)})


def _option_path(where: str, exc: sink_plugins.SinkConfigError) -> str:
    """Where a kind's refusal points: the option it names, the options, or the kind itself (not installed,
    its library missing)."""
    if exc.option:
        return child(child(where, "options"), exc.option)
    return child(where, "options") if "option" in exc.reason else child(where, "kind")
