"""Zones and lines: where a tracked object is, the moves it makes (`enter`, `exit`, `cross`), and the
live counts per camera, zone or line, and label.

An object stands where the bottom centre of its box is (geometry.anchor). It enters a zone once that
point has been inside for `inertia` frames in a row, and exits once it has been outside as long: a box
whose point sits on an edge makes no events. A line has a dead band `margin` wide on each side: a point
in it keeps the side the object had, so an object standing on the line, or jittering across it by less
than the margin, crosses nothing. A crossing is a change of side along a path that passes between the
line's ends; going round an end changes the side without a `cross`.

Lifecycle (lifecycle.py) follows each object with a `Presence` and turns its moves into events; the
`ZoneBook`, one for every pipeline of the daemon, holds each camera's zones and lines by stream key
(replaced by a reload) and the counts, which outlive a pipeline's rebuild; the lines' crossings outlive a
restart too (crossings.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable, TypeVar

from infermux.config import CameraConfig
from infermux.pipelines.geometry import Point, inside, passes, side

MAX_LABELS = 32  # distinct labels counted per camera; later ones count as OTHER (bounded metric series)
MAX_LABEL_CHARS = 64
OTHER = "other"
NO_LABEL = "none"  # an object of a pipeline that labels nothing
MAX_PENDING = 16  # crossings an object makes before its `new`, kept to be sent after it


@dataclass(frozen=True)
class Zone:
    """A zone as followed: its name, its corners (fractions of the frame), its inertia in frames."""

    name: str
    points: tuple[Point, ...]
    inertia: int
    bounds: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)  # x0, y0, x1, y1: a point outside is out

    def holds(self, point: Point) -> bool:
        """Whether `point` is inside: a look at the bounds first, which most points of a frame fail."""
        x0, y0, x1, y1 = self.bounds
        return x0 <= point[0] <= x1 and y0 <= point[1] <= y1 and inside(point, self.points)


@dataclass(frozen=True)
class Line:
    """A line as followed: its ends, the sign of `side` that is `in` (+1: right), its dead band."""

    name: str
    a: Point
    b: Point
    inward: float
    margin: float


@dataclass(frozen=True)
class Areas:
    """One camera's zones and lines."""

    zones: tuple[Zone, ...]
    lines: tuple[Line, ...]
    zone_names: frozenset[str] = frozenset()
    line_names: frozenset[str] = frozenset()

    @staticmethod
    def of(camera: CameraConfig) -> "Areas":
        zones = tuple(Zone(z.name, z.points, z.inertia, _bounds(z.points)) for z in camera.zones)
        lines = tuple(Line(ln.name, ln.points[0], ln.points[1], 1.0 if ln.in_side == "right" else -1.0, ln.margin)
                      for ln in camera.lines)
        return Areas(zones, lines, frozenset(z.name for z in zones), frozenset(ln.name for ln in lines))


@dataclass(frozen=True)
class Move:
    """What an object did: `enter` or `exit` a zone, or `cross` a line `in` or `out`."""

    type: str
    name: str
    direction: str = ""


@dataclass
class Presence:
    """Where one object is: the zones it is in, how many frames in a row its point disagreed with each
    zone's verdict, and per line the side it is on (+1 right, -1 left) and the point that decided it."""

    zones: set[str] = field(default_factory=set)
    streaks: dict[str, int] = field(default_factory=dict)
    sides: dict[str, tuple[float, Point]] = field(default_factory=dict)


def follow(areas: Areas, presence: Presence, point: Point) -> list[Move]:
    """The moves of an object now standing at `point`; `presence` is brought up to date. A zone no
    longer configured (a reload) is exited at once."""
    moves: list[Move] = []
    if not presence.zones <= areas.zone_names:
        moves = [Move("exit", gone) for gone in sorted(presence.zones - areas.zone_names)]
        presence.zones &= areas.zone_names
    for zone in areas.zones:
        _zone(zone, presence, zone.holds(point), moves)
    for name in [n for n in presence.sides if n not in areas.line_names]:
        del presence.sides[name]
    for line in areas.lines:
        _line(line, presence, point, moves)
    return moves


def _bounds(points: tuple[Point, ...]) -> tuple[float, float, float, float]:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return min(xs), min(ys), max(xs), max(ys)


def _zone(zone: Zone, presence: Presence, now_in: bool, moves: list[Move]) -> None:
    if now_in == (zone.name in presence.zones):
        presence.streaks.pop(zone.name, None)
        return
    streak = presence.streaks.get(zone.name, 0) + 1
    if streak < zone.inertia:
        presence.streaks[zone.name] = streak
        return
    presence.streaks.pop(zone.name, None)
    if now_in:
        presence.zones.add(zone.name)
    else:
        presence.zones.discard(zone.name)
    moves.append(Move("enter" if now_in else "exit", zone.name))


def _line(line: Line, presence: Presence, point: Point, moves: list[Move]) -> None:
    distance = side(point, line.a, line.b)
    if abs(distance) <= line.margin:  # on the line: it keeps the side it had
        return
    sign = 1.0 if distance > 0 else -1.0
    before = presence.sides.get(line.name)
    presence.sides[line.name] = (sign, point)
    if before is not None and before[0] != sign and passes(before[1], point, line.a, line.b):
        moves.append(Move("cross", line.name, "in" if sign == line.inward else "out"))


# Every camera's crossings: camera -> line -> "in"/"out" -> label -> crossings (kept by crossings.py).
Crossed = dict[str, dict[str, dict[str, dict[str, int]]]]


@dataclass
class Counts:
    """One camera's counts: objects in each zone now, and each line's crossings so far, per label."""

    present: dict[str, dict[str, int]] = field(default_factory=dict)  # zone -> label -> objects
    crossed: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # line -> in/out -> label -> n
    labels: set[str] = field(default_factory=set)


class ZoneBook:
    """Every camera's zones and lines by stream key, and their counts. Safe from any thread."""

    def __init__(self, cameras: Iterable[CameraConfig] = ()) -> None:
        self._lock = threading.Lock()
        self._areas: dict[str, Areas] = {}
        self._counts: dict[str, Counts] = {}
        self._changed = False  # crossings counted (or dropped) since `changes` last looked
        self.apply(cameras)

    def apply(self, cameras: Iterable[CameraConfig]) -> None:
        """Follow the cameras' zones and lines now (start, reload). The counts of a zone or line no
        longer configured go; objects in a removed zone exit it on their next frame."""
        areas = {c.name: Areas.of(c) for c in cameras if c.zones or c.lines}
        with self._lock:
            self._areas = areas
            for key in [k for k in self._counts if k not in areas]:
                self._changed = self._changed or bool(self._counts.pop(key).crossed)
            for key, found in areas.items():
                counts = self._counts.setdefault(key, Counts())
                _prune(counts.present, {z.name for z in found.zones})
                self._changed = _prune(counts.crossed, {ln.name for ln in found.lines}) or self._changed

    def restore(self, crossed: Crossed) -> None:
        """Take up the crossings a daemon before this one counted (crossings.py), for the cameras and lines
        configured now; a label past MAX_LABELS of a camera adds to OTHER."""
        with self._lock:
            for key, lines in crossed.items():
                areas = self._areas.get(key)
                for line, directions in lines.items():
                    if areas is None or line not in areas.line_names:
                        continue
                    counts = self._counts.setdefault(key, Counts())
                    for direction, labels in directions.items():
                        per = counts.crossed.setdefault(line, {}).setdefault(direction, {})
                        for label, n in labels.items():
                            name = _label(counts, label)
                            per[name] = per.get(name, 0) + n

    def changes(self) -> Crossed | None:
        """Every camera's crossings, where they changed since the last call (None where not)."""
        with self._lock:
            if not self._changed:
                return None
            self._changed = False
            return {key: {line: {d: dict(labels) for d, labels in directions.items()}
                          for line, directions in counts.crossed.items()}
                    for key, counts in self._counts.items() if counts.crossed}

    def of(self, key: str) -> Areas | None:
        """Stream `key`'s zones and lines, None where it has none."""
        return self._areas.get(key)

    def entered(self, key: str, zone: str, label: str | None) -> tuple[str, int]:
        """An object of `label` entered: the label it is counted under, and the zone's count of it now."""
        return self._add(key, zone, label, 1)

    def exited(self, key: str, zone: str, counted: str) -> int:
        """An object counted under `counted` left the zone: its count now."""
        return self._add(key, zone, counted, -1)[1]

    def _add(self, key: str, zone: str, label: str | None, step: int) -> tuple[str, int]:
        with self._lock:
            counts = self._counts.get(key)
            if step < 0 and (counts is None or zone not in counts.present):
                return label or NO_LABEL, 0  # a zone (or camera) a reload removed: its counts went with it
            counts = self._counts.setdefault(key, Counts())
            name = _label(counts, label)
            per = counts.present.setdefault(zone, {})
            per[name] = max(0, per.get(name, 0) + step)
            return name, per[name]

    def crossed(self, key: str, line: str, direction: str, label: str | None) -> tuple[str, int]:
        """An object of `label` crossed `line`: the label it is counted under, and that line's crossings
        in `direction` of it so far."""
        with self._lock:
            counts = self._counts.setdefault(key, Counts())
            per = counts.crossed.setdefault(line, {}).setdefault(direction, {})
            name = _label(counts, label)
            per[name] = per.get(name, 0) + 1
            self._changed = True
            return name, per[name]

    def view(self, key: str) -> dict[str, object]:
        """For `ctl cameras`, the console and /metrics: every zone's objects and every line's crossings,
        per label (a zone or line configured but not yet used is there, empty)."""
        with self._lock:
            areas, counts = self._areas.get(key), self._counts.get(key, Counts())
            if areas is None:
                return {}
            zones = {z.name: dict(sorted(counts.present.get(z.name, {}).items())) for z in areas.zones}
            lines = {ln.name: {d: dict(sorted(counts.crossed.get(ln.name, {}).get(d, {}).items()))
                               for d in ("in", "out")} for ln in areas.lines}
            return {"zones": zones, "lines": lines}


def _label(counts: Counts, label: str | None) -> str:
    """The label an object is counted under: its own (cut short), or OTHER past MAX_LABELS of them."""
    name = NO_LABEL if label is None else label[:MAX_LABEL_CHARS]
    if name not in counts.labels:
        if len(counts.labels) >= MAX_LABELS:
            return OTHER
        counts.labels.add(name)
    return name


T = TypeVar("T")


def _prune(table: dict[str, T], names: set[str]) -> bool:
    """Drop the entries not named; whether there were any."""
    gone = [n for n in table if n not in names]
    for name in gone:
        del table[name]
    return bool(gone)
