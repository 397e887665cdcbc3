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
this detector and not OpenCV's MOG2. Its settings (`GateConfig`, `[cameras.gate]`) are declared with
the rest of the configuration's (config/settings.py), and read by its parser (config/cameras.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from infermux.config.cameras import parse_gate
from infermux.config.kinds import MAX_MASKS, MAX_POINTS
from infermux.config.settings import GateConfig, Polygon

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["MAX_MASKS", "MAX_POINTS", "REASONS", "Box", "GateConfig", "GateDecision", "MotionGate", "Polygon",
           "parse_gate"]

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in the image's pixels
REASONS = ("first", "motion", "keepalive", "still")


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
        self._counting: npt.NDArray[np.uint8] | None = None  # 255 where a working pixel counts; None: all do
        self._counted = 0  # unmasked working pixels
        self._last_frame = 0.0
        self._last_sent = -math.inf
        self._kernel = np.ones((3, 3), np.uint8)

    def decide(self, image: np.ndarray, now: float) -> GateDecision:
        """Whether `image` (H×W×3 uint8 RGB, taken at `now`, seconds on any steady clock) goes on."""
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"the gate takes an H×W×3 uint8 RGB image, got {image.dtype} {list(image.shape)}")
        grey = self._grey(image)
        if self._background is None or image.shape != self._shape:
            self._start(image.shape, grey)
            return self._sent("first", now, [(0, 0, image.shape[1], image.shape[0])])
        dt = max(0.0, now - self._last_frame)
        self._last_frame = now
        changed = self._changed(grey)
        self._adapt(grey, changed, dt)
        if self._counted and self._cv2.countNonZero(changed) >= self.config.threshold * self._counted:
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
            self._cv2.fillPoly(ignored, [points], 255)
        self._counting = np.bitwise_not(ignored) if self.config.masks else None
        self._counted = int(ignored.size - np.count_nonzero(ignored))

    def _changed(self, grey: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
        """255 where a counted pixel changed, else 0 (OpenCV's calls, each one pass: numpy's expressions make more)."""
        cv2 = self._cv2
        diff = cv2.subtract(grey, self._background)
        shift = cv2.mean(diff, mask=self._counting)[0] if self._counted else 0.0  # the scene lighter or darker
        changed = cv2.compare(cv2.absdiff(diff, shift), float(self.config.delta), cv2.CMP_GT)
        return changed if self._counting is None else cv2.bitwise_and(changed, self._counting)

    def _adapt(self, grey: npt.NDArray[np.float32], changed: npt.NDArray[np.uint8], dt: float) -> None:
        cv2 = self._cv2
        still = 1.0 - math.exp(-dt / self.config.background_s)
        moving = 1.0 - math.exp(-dt / self.config.absorb_s)
        cv2.accumulateWeighted(grey, self._background, still, mask=cv2.bitwise_not(changed))
        cv2.accumulateWeighted(grey, self._background, moving, mask=changed)

    def _boxes(self, changed: npt.NDArray[np.uint8], shape: tuple[int, ...]) -> list[Box]:
        cv2 = self._cv2
        grown = cv2.dilate(changed, self._kernel)  # joins the pieces of one object
        # Outer contours' bounds: cheaper than OpenCV's connected components on a frame this small
        # (docs/decisions.md, "Motion gate: a running background, not MOG2").
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
