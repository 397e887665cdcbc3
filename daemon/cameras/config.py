"""`[[cameras]]`: the cameras the daemon reads itself (docs/cameras.md#configuration).

Parsed into `CameraConfig`s by `parse_cameras`, which daemon/config.py calls once: its errors name the
field path (`cameras[name="gate-3"].fps`) and the reason, and a misspelled field gets the nearest known
one, as the rest of the file's do.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infermux.cameras.gate import GateConfig, parse_gate

TRANSPORTS = ("tcp", "udp")
DECODERS = ("auto", "software", "gstreamer")
NETWORK_SCHEMES = ("rtsp://", "rtsps://", "http://", "https://")
DEVICE = re.compile(r"/dev/video[0-9]{1,3}")
MAX_FPS = 240.0
MAX_SIDE = 16384  # a `size` side, at most: as a pipeline's warm_frames
DEFAULT_MAX_PIXELS = 3840 * 2160  # a 4K stream; larger ones are refused unless max_pixels says otherwise
MAX_NAME_BYTES = 128  # a camera's name is its stream key (shown in metrics and events): short, printable
MAX_URL = 4096


class CameraFieldError(Exception):
    """A `[[cameras]]` problem: the field path and the reason (config.py adds the file)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class CameraConfig:
    """One `[[cameras]]` entry."""

    name: str  # its stream key, in events, metrics and `ctl cameras`
    url: str  # rtsp(s)://, http(s):// MJPEG, /dev/videoN, or a video file (relative: to the configuration's folder)
    pipeline: str  # the [[pipelines]] entry its frames go to
    transport: str = "tcp"  # rtsp: "tcp" (interleaved, survives loss) or "udp" (lower latency on a clean link)
    loop: bool = True  # a file: start again at its end (false: `camera_ended`)
    fps: float = 15.0  # frames taken per second; the newest decoded frame wins
    size: tuple[int, int] | None = None  # [width, height] frames are scaled to before the gate and the pipeline
    decoder: str = "auto"  # "software" (FFmpeg through PyAV), "gstreamer" (nvv4l2decoder on a Jetson), "auto"
    enabled: bool = True
    max_pixels: int = DEFAULT_MAX_PIXELS  # a stream advertising more pixels per frame is refused
    gate: GateConfig | None = None  # [cameras.gate]: only frames with motion are sent

    @property
    def kind(self) -> str:
        """"rtsp", "http", "device" or "file"."""
        if self.url.startswith(("rtsp://", "rtsps://")):
            return "rtsp"
        if self.url.startswith(("http://", "https://")):
            return "http"
        return "device" if DEVICE.fullmatch(self.url) else "file"

    def as_json(self) -> dict[str, Any]:
        """For the camera's process (its command line) and `ctl cameras`."""
        out = dataclasses.asdict(self)
        out["size"] = list(self.size) if self.size else None
        return out


def parse_cameras(raw: Any, pipelines: set[str], file: Path) -> tuple[CameraConfig, ...]:
    """Every `[[cameras]]` entry of configuration `file`; names are unique and each names a pipeline of
    `pipelines`. Raises CameraFieldError (the gate's own errors: config.ConfigError, naming the file)."""
    if not isinstance(raw, list):
        raise CameraFieldError("cameras", f"must be an array of tables ([[cameras]]), got {type(raw).__name__}")
    cameras: list[CameraConfig] = []
    for i, table in enumerate(raw):
        name = table.get("name") if isinstance(table, dict) else None
        where = f"cameras[name={json.dumps(name)}]" if isinstance(name, str) and name else f"cameras[{i}]"
        camera = _parse_camera(where, table, pipelines, file)
        if any(c.name == camera.name for c in cameras):
            raise CameraFieldError(f"cameras[{i}].name", f"camera {camera.name!r} is already defined; each "
                                   "camera's name is its stream key and must be unique")
        cameras.append(camera)
    return tuple(cameras)


def _parse_camera(where: str, table: Any, pipelines: set[str], file: Path) -> CameraConfig:
    if not isinstance(table, dict):
        raise CameraFieldError(where, f"must be a table, got {type(table).__name__}")
    raw = _known(where, table, CameraConfig)
    for key in ("name", "url", "pipeline"):
        if key not in raw:
            raise CameraFieldError(f"{where}.{key}", "is required")
        _type(f"{where}.{key}", raw[key], str)
        if not raw[key]:
            raise CameraFieldError(f"{where}.{key}", "must not be empty")
    _check_name(f"{where}.name", raw["name"])
    raw["url"] = _url(f"{where}.url", raw["url"], file.parent)
    _check_pipeline(f"{where}.pipeline", raw["pipeline"], pipelines)
    _choice(f"{where}.transport", raw.get("transport", "tcp"), TRANSPORTS)
    _choice(f"{where}.decoder", raw.get("decoder", "auto"), DECODERS)
    for key in ("loop", "enabled"):
        if key in raw:
            _type(f"{where}.{key}", raw[key], bool)
    if "fps" in raw:
        _type(f"{where}.fps", raw["fps"], (int, float))
        raw["fps"] = float(raw["fps"])
        if not 0 < raw["fps"] <= MAX_FPS:
            raise CameraFieldError(f"{where}.fps", f"must be more than 0 and at most {MAX_FPS:.0f}, got {raw['fps']}")
    if "max_pixels" in raw:
        _type(f"{where}.max_pixels", raw["max_pixels"], int)
        if raw["max_pixels"] < 1:
            raise CameraFieldError(f"{where}.max_pixels", f"must be >= 1, got {raw['max_pixels']}")
    if "size" in raw:
        raw["size"] = _size(f"{where}.size", raw["size"])
    if "gate" in raw:
        raw["gate"] = parse_gate(raw["gate"], f"{where}.gate", str(file))
    return CameraConfig(**raw)


def _check_pipeline(where: str, name: str, pipelines: set[str]) -> None:
    if name not in pipelines:
        near = difflib.get_close_matches(name, sorted(pipelines), n=1, cutoff=0.75)
        hint = f"did you mean `{near[0]}`? " if near else ""
        raise CameraFieldError(where, f"unknown pipeline {name!r}; {hint}pipelines: "
                               f"{', '.join(sorted(pipelines)) or 'none (add a [[pipelines]] entry)'}")


def _check_name(where: str, name: str) -> None:
    if not name.isprintable() or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise CameraFieldError(where, f"{ascii(name)[:60]} must be printable text of at most {MAX_NAME_BYTES} "
                               "bytes (it is the camera's stream key, shown in events and metrics)")


def _url(where: str, url: str, folder: Path) -> str:
    """The URL as the camera's process opens it: a relative file path resolved against `folder`."""
    if len(url) > MAX_URL or not url.isprintable():
        raise CameraFieldError(where, f"must be printable text of at most {MAX_URL} characters")
    if url.startswith(NETWORK_SCHEMES) or DEVICE.fullmatch(url):
        return url
    if "://" in url:
        raise CameraFieldError(where, f"{url.split('://')[0]}:// is not a camera's scheme; use rtsp://, rtsps://, "
                               "http(s):// (MJPEG), /dev/videoN or a video file's path")
    if url.startswith("/dev/"):
        raise CameraFieldError(where, f"{url!r}: a device is /dev/videoN (a V4L2 camera)")
    path = Path(url).expanduser()
    return str(path if path.is_absolute() else (folder / path).resolve())


def _size(where: str, value: Any) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int and 1 <= v <= MAX_SIDE
                                                                for v in value)):
        raise CameraFieldError(where, f"must be [width, height], two integers from 1 to {MAX_SIDE}, got {value!r}")
    return (value[0], value[1])


def _known(where: str, table: dict[str, Any], cls: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - names)
    if unknown:
        near = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.75)
        hint = f"did you mean `{near[0]}`? " if near else ""
        raise CameraFieldError(f"{where}.{unknown[0]}", f"unknown field; {hint}known fields: "
                               f"{', '.join(sorted(names))}")
    return dict(table)


def _type(where: str, value: Any, want: type | tuple[type, ...]) -> None:
    wants = want if isinstance(want, tuple) else (want,)
    if isinstance(value, bool) and bool not in wants or not isinstance(value, wants):
        names = " or ".join("number" if w is float else w.__name__ for w in wants)
        raise CameraFieldError(where, f"must be {names}, got {type(value).__name__} {str(value)[:40]!r}")


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise CameraFieldError(where, f"must be one of {', '.join(allowed)}, got {str(value)[:40]!r}")
