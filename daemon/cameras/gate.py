"""A camera's motion gate (docs/motion-gate.md): which decoded frames go on to the target.

A frame is shrunk to a grey image `width` pixels wide and compared with a
background that follows the scene: a working pixel whose grey level is more
than `delta` away from the background's, after the frame's mean shift is
taken out (the whole scene getting brighter or darker is lighting, not
motion), has changed. Masked pixels (`masks`: polygons in fractions of the
frame, a clock, trees) never count. The frame has motion when changed
pixels are at least `threshold` of the unmasked ones; then it is sent with
the boxes of the changed areas. Without motion a frame is still sent every
`every_s` (a keep-alive, so the target's view of the scene never gets old).

The background follows unchanged pixels with the time constant
`background_s` (sensor noise averages out, slow lighting drift is followed)
and changed ones with the slower `absorb_s`: an object that stops keeps the
frames going for a while, then becomes part of the scene. Time constants,
not rates per frame, so a camera's fps does not change what they mean.
docs/decisions.md ("Motion gate: a running background, not MOG2") says why
this detector and not OpenCV's MOG2.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from infermux.config import ConfigError

if TYPE_CHECKING:
    import numpy.typing as npt

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in the image's pixels
Polygon = tuple[tuple[float, float], ...]  # points (x, y), fractions of the frame's width and height

MAX_MASKS = 32
MAX_POINTS = 64  # per mask polygon
REASONS = ("first", "motion", "keepalive", "still")


@dataclass(frozen=True)
class GateConfig:
    """A camera's `[cameras.gate]` table: each field's bounds are in `BOUNDS`, its meaning in docs/cameras.md."""

    threshold: float = 0.002  # fraction of the unmasked working pixels that must change
    delta: int = 15  # grey levels (0-255) a working pixel must differ from the background by
    every_s: float = 10.0  # a keep-alive frame this often without motion; 0: never
    width: int = 160  # the working grey image's width in pixels (its height keeps the frame's aspect)
    background_s: float = 1.0  # time constant the background follows unchanged pixels with
    absorb_s: float = 5.0  # ... and changed ones: a stopped object (or the ghost of one that left) joins it
    max_boxes: int = 16  # past it, the smaller boxes are merged into one
    masks: tuple[Polygon, ...] = field(default=())


# field -> (type, smallest, largest): a setting outside them is refused with the bounds named.
BOUNDS: dict[str, tuple[type, float, float]] = {
    "threshold": (float, 0.0001, 1.0),
    "delta": (int, 1, 255),
    "every_s": (float, 0.0, 86400.0),
    "width": (int, 16, 1280),
    "background_s": (float, 0.01, 3600.0),
    "absorb_s": (float, 0.01, 86400.0),
    "max_boxes": (int, 1, 256),
}


def parse_gate(table: Mapping[str, Any], where: str, file: str = "configuration") -> GateConfig:
    """`table` (a camera's `[cameras.gate]`) as a GateConfig; ConfigError(file, `where.field`, reason) if it is
    not one: an unknown field (with the nearest known one), a wrong type, a value out of its bounds, a bad mask."""
    if not isinstance(table, Mapping):
        raise ConfigError(file, where, f"must be a table, got {type(table).__name__}")
    names = [f.name for f in fields(GateConfig)]
    unknown = sorted(set(table) - set(names))
    if unknown:
        near = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.75)
        hint = f"did you mean `{near[0]}`? " if near else ""
        raise ConfigError(file, f"{where}.{unknown[0]}", f"unknown field; {hint}known fields: {', '.join(sorted(names))}")
    values: dict[str, Any] = {name: _bounded(file, f"{where}.{name}", name, table[name])
                              for name in BOUNDS if name in table}
    if "masks" in table:
        values["masks"] = _masks(file, f"{where}.masks", table["masks"])
    config = GateConfig(**values)
    if config.absorb_s < config.background_s:
        raise ConfigError(file, f"{where}.absorb_s", f"must be >= background_s ({config.background_s}), "
                          f"got {config.absorb_s}: a changed pixel joins the background no faster than a still one")
    return config


def _bounded(file: str, where: str, name: str, value: Any) -> float | int:
    kind, low, high = BOUNDS[name]
    wants = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, wants):
        raise ConfigError(file, where, f"must be {'a number' if kind is float else 'an integer'}, "
                          f"got {type(value).__name__} {value!r}")
    if not (low <= value <= high) or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(file, where, f"must be between {low:g} and {high:g}, got {value!r}")
    return kind(value)


def _masks(file: str, where: str, value: Any) -> tuple[Polygon, ...]:
    if not isinstance(value, list) or len(value) > MAX_MASKS:
        raise ConfigError(file, where, f"must be a list of at most {MAX_MASKS} polygons, got {_short(value)}")
    return tuple(_polygon(file, f"{where}[{i}]", polygon) for i, polygon in enumerate(value))


def _polygon(file: str, where: str, value: Any) -> Polygon:
    if not isinstance(value, list) or not 3 <= len(value) <= MAX_POINTS:
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class GateDecision:
    """Whether a frame goes on (`send`), why (one of REASONS), and where it changed: boxes x0, y0, x1, y1 in
    the frame's pixels (for "first" and "keepalive", the whole frame; for "still", none)."""

    send: bool
    reason: str
    boxes: list[Box]


class MotionGate:
    """One camera's gate: `decide(image, now)` for each decoded frame in turn (one thread)."""

    def __init__(self, config: GateConfig) -> None:
        import cv2  # OpenCV only where a camera has a gate: the configuration parses without it

        self.config = config
        self._cv2 = cv2
        self._background: npt.NDArray[np.float32] | None = None
        self._shape: tuple[int, ...] = ()
        self._ignored: npt.NDArray[np.bool_] | None = None  # masked working pixels
        self._counted = 0  # unmasked working pixels
        self._last_frame = 0.0
        self._last_sent = -math.inf
        self._kernel = np.ones((3, 3), np.uint8)

    def decide(self, image: np.ndarray, now: float) -> GateDecision:
        """Whether `image` (H×W×3 uint8 RGB, taken at `now`, seconds on any steady clock) goes on."""
        grey = self._grey(image)
        if self._background is None or image.shape != self._shape:
            self._start(image.shape, grey)
            return self._sent("first", now, [(0, 0, image.shape[1], image.shape[0])])
        dt = max(0.0, now - self._last_frame)
        self._last_frame = now
        changed = self._changed(grey)
        self._adapt(grey, changed, dt)
        if self._counted and int(np.count_nonzero(changed)) >= self.config.threshold * self._counted:
            return self._sent("motion", now, self._boxes(changed, image.shape))
        if self.config.every_s and now - self._last_sent >= self.config.every_s:
            return self._sent("keepalive", now, [(0, 0, image.shape[1], image.shape[0])])
        return GateDecision(False, "still", [])

    def _grey(self, image: np.ndarray) -> npt.NDArray[np.float32]:
        cv2 = self._cv2
        h, w = image.shape[:2]
        width = min(self.config.width, w)
        size = (width, max(1, round(h * width / w)))
        grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        # Halving, then the last step: OpenCV's INTER_AREA has a fast path for exactly half, several times
        # cheaper than one large step. Each step averages blocks, which takes most sensor noise out.
        while grey.shape[1] >= 2 * size[0] and grey.shape[0] >= 2 * size[1]:
            grey = cv2.resize(grey, (grey.shape[1] // 2, grey.shape[0] // 2), interpolation=cv2.INTER_AREA)
        if (grey.shape[1], grey.shape[0]) != size:
            grey = cv2.resize(grey, size, interpolation=cv2.INTER_AREA)
        return grey.astype(np.float32)

    def _start(self, shape: tuple[int, ...], grey: npt.NDArray[np.float32]) -> None:
        self._shape, self._background = shape, grey.copy()
        ignored = np.zeros(grey.shape, np.uint8)
        h, w = grey.shape
        for polygon in self.config.masks:
            points = np.array([[round(x * w), round(y * h)] for x, y in polygon], np.int32)
            self._cv2.fillPoly(ignored, [points], 1)
        self._ignored = ignored.astype(bool)
        self._counted = int(ignored.size - np.count_nonzero(ignored))

    def _changed(self, grey: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        assert self._background is not None and self._ignored is not None
        diff = grey - self._background
        counted = ~self._ignored
        shift = float(diff[counted].mean()) if self._counted else 0.0  # the whole scene lighter or darker
        return (np.abs(diff - shift) > self.config.delta) & counted

    def _adapt(self, grey: npt.NDArray[np.float32], changed: npt.NDArray[np.bool_], dt: float) -> None:
        assert self._background is not None
        still = 1.0 - math.exp(-dt / self.config.background_s)
        moving = 1.0 - math.exp(-dt / self.config.absorb_s)
        rate = np.where(changed, np.float32(moving), np.float32(still))
        self._background += rate * (grey - self._background)

    def _boxes(self, changed: npt.NDArray[np.bool_], shape: tuple[int, ...]) -> list[Box]:
        cv2 = self._cv2
        grown = cv2.dilate(changed.astype(np.uint8), self._kernel)  # joins the pieces of one object
        # Outer contours' bounds: OpenCV's connected components cost several times more on a frame this small.
        contours, _ = cv2.findContours(grown, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        parts = [tuple(int(v) for v in cv2.boundingRect(c)) for c in contours]
        # A lone changed pixel (3×3 once grown) is noise where anything larger changed too.
        solid = [p for p in parts if p[2] * p[3] > 9] or parts
        solid.sort(key=lambda p: -p[2] * p[3])
        keep, rest = solid[:self.config.max_boxes - 1], solid[self.config.max_boxes - 1:]
        if len(rest) > 1:
            x0, y0 = min(p[0] for p in rest), min(p[1] for p in rest)
            x1, y1 = max(p[0] + p[2] for p in rest), max(p[1] + p[3] for p in rest)
            rest = [(x0, y0, x1 - x0, y1 - y0)]
        h, w = changed.shape
        sx, sy = shape[1] / w, shape[0] / h
        return [(int(x * sx), int(y * sy), min(shape[1], math.ceil((x + bw) * sx)),
                 min(shape[0], math.ceil((y + bh) * sy))) for x, y, bw, bh in keep + rest]

    def _sent(self, reason: str, now: float, boxes: list[Box]) -> GateDecision:
        self._last_sent = now
        if reason == "first":
            self._last_frame = now
        return GateDecision(True, reason, boxes)
