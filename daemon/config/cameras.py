"""`[[cameras]]` entries and their `[cameras.gate]`: their keys read as declared (config/settings.py),
then the rules a declaration cannot hold: a name fit to be a stream key and unique, a URL a camera's
process can open, `transport` and `loop` only for the kind of URL they apply to, a pipeline that
exists, a gate's `absorb_s` no faster than its `background_s`, zones and lines uniquely named, at most
MAX_ZONES of each, zones that enclose an area, and only where the pipeline makes object events."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Sequence

from infermux.config.declare import CAMERA, check_type, child, read_table, settings_of
from infermux.config.errors import ConfigError
from infermux.config.settings import (DEVICE, MAX_ZONES, CameraConfig, GateConfig, LineConfig, PipelineConfig,
                                      ZoneConfig, url_kind)

NETWORK_SCHEMES = ("rtsp://", "rtsps://", "http://", "https://")
MAX_NAME_BYTES = 128  # a camera's name is its stream key (shown in metrics and events): short, printable
MAX_URL = 4096


def parse_cameras(file: Path, raw: Any, configured: Sequence[PipelineConfig]) -> tuple[CameraConfig, ...]:
    """Every `[[cameras]]` entry; names are unique and each names a pipeline of `configured`."""
    check_type(file, "cameras", raw, list)
    pipelines = {p.name: p for p in configured}
    cameras: list[CameraConfig] = []
    for i, table in enumerate(raw):
        name = table.get("name") if isinstance(table, dict) else None
        where = f"cameras[name={json.dumps(name)}]" if isinstance(name, str) and name else f"cameras[{i}]"
        camera = parse_camera(file, where, table, pipelines)
        if any(c.name == camera.name for c in cameras):
            raise ConfigError(file, f"cameras[{i}].name", f"camera {camera.name!r} is already defined; each "
                              "camera's name is its stream key and must be unique")
        cameras.append(camera)
    return tuple(cameras)


def parse_camera(file: Path, where: str, table: Any, pipelines: dict[str, PipelineConfig]) -> CameraConfig:
    """One `[[cameras]]` entry (`where` names it in errors)."""
    raw = read_table(file, where, table, CameraConfig)
    _check_name(file, child(where, "name"), raw["name"])
    raw["url"] = _url(file, child(where, "url"), raw["url"])
    _check_kind_keys(file, where, raw)
    if raw["pipeline"] not in pipelines:
        near = difflib.get_close_matches(raw["pipeline"], sorted(pipelines), n=1, cutoff=0.75)
        hint = f"did you mean `{near[0]}`? " if near else ""
        raise ConfigError(file, child(where, "pipeline"), f"unknown pipeline {raw['pipeline']!r}; {hint}pipelines: "
                          f"{', '.join(sorted(pipelines)) or 'none (add a [[pipelines]] entry)'}")
    if "gate" in raw:
        raw["gate"] = _gate(file, child(where, "gate"), raw["gate"])
    _areas(file, where, raw, pipelines[raw["pipeline"]])
    return CameraConfig(**raw)


def _areas(file: Path, where: str, raw: dict[str, Any], pipeline: PipelineConfig) -> None:
    """`zones` and `lines` as their dataclasses, in place: bounded, uniquely named, zones with an area,
    and only on a camera whose pipeline makes object events (they are events of tracked objects)."""
    names: set[str] = set()
    for key, section in (("zones", ZoneConfig), ("lines", LineConfig)):
        entries = raw.get(key, [])
        if len(entries) > MAX_ZONES:
            raise ConfigError(file, child(where, key), f"lists {len(entries)}; at most {MAX_ZONES} (each is a "
                              "metric series per label)")
        for i, entry in enumerate(entries):
            if entry["name"] in names:
                raise ConfigError(file, f"{child(where, key)}[{i}].name", f"{entry['name']!r} is already a zone or "
                                  "line of this camera; each needs a name of its own")
            names.add(entry["name"])
            if section is ZoneConfig and _area(entry["points"]) < MIN_AREA:
                raise ConfigError(file, f"{child(where, key)}[{i}].points", "encloses no area (its points are on "
                                  "one line, or repeated); a zone needs three corners apart")
        raw[key] = tuple(section(**entry) for entry in entries)
    if names and pipeline.events is None:
        field = "zones" if raw["zones"] else "lines"
        raise ConfigError(file, child(where, field), f"pipeline {pipeline.name!r} makes no object events: zones "
                          "and lines need its `events` table and a `track` step (events.md)")


MIN_AREA = 1e-6  # of a zone, in fractions of the frame: a millionth is a pixel of a 1280x720 frame


def _area(points: Sequence[tuple[float, float]]) -> float:
    """A polygon's area by the shoelace formula (a self-crossing one's parts may cancel)."""
    twice = sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1) in zip(points, (*points[1:], points[0])))
    return abs(twice) / 2


def parse_gate(table: Any, where: str, file: Path | str = "configuration") -> GateConfig:
    """A `[cameras.gate]` table on its own (a camera's process reads its gate so); ConfigError(file,
    `where.field`, reason) if it is not one."""
    if not isinstance(table, dict):
        raise ConfigError(file, where, f"must be a table, got {type(table).__name__}")
    return _gate(Path(file), where, read_table(Path(file), where, table, GateConfig))


def _gate(file: Path | str, where: str, raw: dict[str, Any]) -> GateConfig:
    config = GateConfig(**raw)
    if config.absorb_s < config.background_s:
        raise ConfigError(file, child(where, "absorb_s"), f"must be >= background_s ({config.background_s}), got "
                          f"{config.absorb_s}: a changed pixel joins the background no faster than a still one")
    return config


# Keys that mean something for one kind of URL only: written for another, they are a mistake.
KIND_KEYS = {"transport": ("rtsp", "an rtsp:// or rtsps:// url"), "loop": ("file", "a video file")}


def _check_kind_keys(file: Path, where: str, raw: dict[str, Any]) -> None:
    kind = url_kind(raw["url"])
    for key, (wanted, text) in KIND_KEYS.items():
        if key in raw and kind != wanted:
            raise ConfigError(file, child(where, key), f"only applies to {text}, not a {kind} camera's; remove it")


def _check_name(file: Path, where: str, name: str) -> None:
    if not name.isprintable() or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ConfigError(file, where, f"{ascii(name)[:60]} must be printable text of at most {MAX_NAME_BYTES} "
                          "bytes (it is the camera's stream key, shown in events and metrics)")


def _url(file: Path, where: str, url: str) -> str:
    """The URL as the camera's process opens it: a relative file path resolved against the file's folder."""
    if len(url) > MAX_URL or not url.isprintable():
        raise ConfigError(file, where, f"must be printable text of at most {MAX_URL} characters")
    if url.startswith(NETWORK_SCHEMES) or DEVICE.fullmatch(url):
        return url
    if "://" in url:
        raise ConfigError(file, where, f"{url.split('://')[0][:20]}:// is not a camera's scheme; use rtsp://, "
                          "rtsps://, http(s):// (MJPEG), /dev/videoN or a video file's path")
    if url.startswith("/dev/"):
        raise ConfigError(file, where, f"{url[:60]!r}: a device is /dev/videoN (a V4L2 camera)")
    path = Path(url).expanduser()
    return str(path if path.is_absolute() else (file.parent / path).resolve())


RESTARTING_FIELDS = tuple(key for key, s in settings_of(CameraConfig).items() if s.applies == CAMERA)


def restart_needed(old: CameraConfig, new: CameraConfig) -> list[str]:
    """The settings whose change restarts a camera's process (declared `applies=CAMERA`); the others
    (`enabled`) apply to the running camera."""
    return [key for key in RESTARTING_FIELDS if getattr(old, key) != getattr(new, key)]


def restarted(old: Sequence[CameraConfig], new: Sequence[CameraConfig]) -> list[str]:
    """The cameras of both lists that a reload from `old` to `new` restarts."""
    before = {c.name: c for c in old}
    return [c.name for c in new if c.name in before and restart_needed(before[c.name], c)]
