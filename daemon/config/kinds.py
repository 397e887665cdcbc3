"""The kinds of value a setting takes (declare.Kind): each checks a TOML value and reads it into what
the configuration's dataclasses hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infermux import signing
from infermux.config.declare import Kind, at_least, check_type, resolve
from infermux.config.errors import ConfigError


def _typed(*types: type) -> Any:
    def read(file: Path, where: str, value: Any) -> Any:
        check_type(file, where, value, types)
        return value
    return read


def _number(file: Path, where: str, value: Any) -> float:
    check_type(file, where, value, (int, float))
    return float(value)


def _name(file: Path, where: str, value: Any) -> str:
    check_type(file, where, value, str)
    if not value:
        raise ConfigError(file, where, "must not be empty")
    return str(value)


def _path(file: Path, where: str, value: Any) -> Path:
    check_type(file, where, value, str)
    return resolve(file, value)


def _existing(what: str) -> Any:
    def read(file: Path, where: str, value: Any) -> Path:
        path = _path(file, where, value)
        if not (path.is_file() if what == "file" else path.is_dir()):
            raise ConfigError(file, where, f"{path} is not a readable {what} (make keys with `infermux keygen`)")
        return path
    return read


def _endpoint(file: Path, where: str, value: Any) -> str:
    check_type(file, where, value, str)
    if value and not value.startswith(("ipc://", "tcp://")):
        raise ConfigError(file, where, f"endpoint {value!r} must start with ipc:// or tcp://")
    return str(value)


def _endpoints(file: Path, where: str, value: Any) -> tuple[str, ...]:
    listen = [value] if isinstance(value, str) else value
    check_type(file, where, listen, list)
    if not listen:
        raise ConfigError(file, where, "needs at least one endpoint")
    for i, endpoint in enumerate(listen):
        check_type(file, f"{where}[{i}]", endpoint, str)
        if not endpoint:
            raise ConfigError(file, f"{where}[{i}]", "endpoint '' must start with ipc:// or tcp://")
        _endpoint(file, f"{where}[{i}]", endpoint)
    return tuple(listen)


def parse_budget(file: Path | str, value: Any, total: int) -> int:
    """Bytes allowed by a `memory_budget` of "80%", "6GiB", "512MB" or a byte count."""
    where = "daemon.memory_budget"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if not isinstance(value, str):
        raise ConfigError(file, where, f"must be a percentage or a size like '6GiB', got {value!r}")
    text = value.strip()
    units = {"%": None, "gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "gb": 10**9, "mb": 10**6, "kb": 10**3}
    for suffix, scale in units.items():
        if text.lower().endswith(suffix):
            number = text[: -len(suffix)].strip()
            try:
                amount = float(number)
            except ValueError:
                break
            if amount <= 0 or (scale is None and amount > 100):
                break
            return int(total * amount / 100) if scale is None else int(amount * scale)
    raise ConfigError(file, where, f"{value!r} is not a percentage (1-100%) or a size like '6GiB'")


def _budget(file: Path, where: str, value: Any) -> Any:
    parse_budget(file, value, total=1)
    return value


def _signing_keys(file: Path, where: str, value: Any) -> tuple[Path, ...]:
    """Each trusted publisher's key must be read now: a reload with a broken one changes nothing."""
    check_type(file, where, value, list)
    paths = []
    for i, key in enumerate(value):
        check_type(file, f"{where}[{i}]", key, str)
        path = resolve(file, key)
        why = signing.key_problem(path, private=False)
        if why:
            raise ConfigError(file, f"{where}[{i}]", f"will not trust {why}")
        try:
            signing.load_public(path)
        except (ValueError, ImportError) as exc:
            raise ConfigError(file, f"{where}[{i}]", str(exc)) from None
        except OSError as exc:
            raise ConfigError(file, f"{where}[{i}]", f"cannot read {path}: {exc.strerror} (a publisher's "
                              "PREFIX.pub, made by `infermux sign --keygen PREFIX`)") from None
        paths.append(path)
    return tuple(paths)


def _sizes(file: Path, where: str, value: Any) -> tuple[int, ...]:
    check_type(file, where, value, list)
    for i, size in enumerate(value):
        at_least(file, f"{where}[{i}]", size)
    return tuple(sorted(value))


def _names(file: Path, where: str, value: Any) -> tuple[str, ...]:
    check_type(file, where, value, list)
    return tuple(_name(file, f"{where}[{i}]", v) for i, v in enumerate(value))


def _version(file: Path, where: str, value: Any) -> str:
    check_type(file, where, value, (str, int))
    return str(value)


def _versions(file: Path, where: str, value: Any) -> tuple[str, ...]:
    check_type(file, where, value, list)
    return tuple(_version(file, f"{where}[{i}]", v) for i, v in enumerate(value))


def _frames(file: Path, where: str, value: Any) -> tuple[tuple[int, int], ...]:
    """`warm_frames = [[1280, 720], ...]`: up to MAX_WARM_FRAMES sizes, each side 1..MAX_WARM_SIDE."""
    check_type(file, where, value, list)
    if len(value) > MAX_WARM_FRAMES:
        raise ConfigError(file, where, f"lists {len(value)} frame sizes; at most {MAX_WARM_FRAMES} (each is one "
                          "more inference per model while it loads)")
    return tuple(_frame(file, f"{where}[{i}]", size) for i, size in enumerate(value))


def _frame(file: Path, where: str, size: Any) -> tuple[int, int]:
    """One frame size, `[width, height]`, each side 1..MAX_WARM_SIDE."""
    if not (isinstance(size, list) and len(size) == 2 and all(type(v) is int and 1 <= v <= MAX_WARM_SIDE
                                                              for v in size)):
        raise ConfigError(file, where, f"must be [width, height], two integers from 1 to {MAX_WARM_SIDE}, "
                          f"got {_short(size)}")
    return (size[0], size[1])


def _masks(file: Path, where: str, value: Any) -> tuple[tuple[tuple[float, float], ...], ...]:
    """A motion gate's `masks`: up to MAX_MASKS polygons of 3..MAX_POINTS points, each [x, y] in fractions
    of the frame's width and height."""
    if not isinstance(value, list) or len(value) > MAX_MASKS:
        raise ConfigError(file, where, f"must be a list of at most {MAX_MASKS} polygons, got {_short(value)}")
    return tuple(_polygon(file, f"{where}[{i}]", polygon) for i, polygon in enumerate(value))


def _polygon(file: Path, where: str, value: Any, least: int = 3) -> tuple[tuple[float, float], ...]:
    if not isinstance(value, list) or not least <= len(value) <= MAX_POINTS:
        raise ConfigError(file, where, f"must be a polygon: a list of 3 to {MAX_POINTS} points [x, y], "
                          f"got {_short(value)}")
    points = []
    for i, point in enumerate(value):
        ok = (isinstance(point, list) and len(point) == 2
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in point))
        if not ok:
            raise ConfigError(file, f"{where}[{i}]", "must be a point [x, y] of fractions of the frame's width "
                              f"and height, each from 0 to 1, got {_short(point)}")
        points.append((float(point[0]), float(point[1])))
    return tuple(points)


def _segment(file: Path, where: str, value: Any) -> tuple[tuple[float, float], ...]:
    """A line's two points [x, y] in fractions of the frame, apart (a line of no length has no sides)."""
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigError(file, where, f"must be two points [[x, y], [x, y]], got {_short(value)}")
    points = _polygon(file, where, value, least=2)
    if points[0] == points[1]:
        raise ConfigError(file, where, f"its two points are the same, {_short(value)}: a line needs two apart")
    return points


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


MAX_WARM_FRAMES = 8  # warm_frames entries a pipeline may list: each is one more inference per model at load
MAX_WARM_SIDE = 16384  # a warm frame's side (and a camera's `size` side), at most
MAX_MASKS = 32  # a motion gate's mask polygons, at most
MAX_POINTS = 64  # ... and each one's points

INT = Kind("integer", _typed(int))
NUMBER = Kind("number", _number)
BOOL = Kind("boolean", _typed(bool))
STR = Kind("string", _typed(str))
NAME = Kind("non-empty string", _name)
NAMES = Kind("list of non-empty strings", _names)
PATH = Kind("path", _path)
KEY_FILE = Kind("path of a file", _existing("file"))
KEY_DIR = Kind("path of a directory", _existing("directory"))
ENDPOINT = Kind("endpoint (`ipc://` or `tcp://`; \"\": none)", _endpoint)
ENDPOINTS = Kind("endpoint or list of endpoints", _endpoints)
BUDGET = Kind("percentage or size (\"80%\", \"6GiB\", bytes)", _budget)
PUBLIC_KEYS = Kind("list of paths (Ed25519 public keys, PEM)", _signing_keys)
SIZES = Kind("list of integers", _sizes)
VERSION = Kind("string or integer", _version)
VERSIONS = Kind("list of strings or integers", _versions)
FRAMES = Kind(f"list of [width, height] (at most {MAX_WARM_FRAMES}, sides 1 to {MAX_WARM_SIDE})", _frames)
SIZE = Kind(f"[width, height] (sides 1 to {MAX_WARM_SIDE})", _frame)
MASKS = Kind(f"list of polygons (at most {MAX_MASKS}, each 3 to {MAX_POINTS} points [x, y], fractions 0 to 1)",
             _masks)
POLYGON = Kind(f"polygon: 3 to {MAX_POINTS} points [x, y], fractions of the frame 0 to 1",
               lambda file, where, value: _polygon(file, where, value))
SEGMENT = Kind("two points [x, y], fractions of the frame 0 to 1, apart", _segment)
TABLE = Kind("table", _typed(dict))
TABLES = Kind("list of tables", _typed(list))
