"""The motion gate's interface, as a pass-through: every frame is sent.

A stand-in with the agreed interface (`GateConfig`, `MotionGate.decide`), so that cameras run before
the motion detector itself lands in this file; its decisions are "first" for the first frame and
"motion" after, with no boxes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GateConfig:
    """A camera's `[cameras.gate]` table."""

    every_s: float = 10.0  # a frame is sent at least this often without motion (a keep-alive)
    threshold: float = 0.02  # the share of the frame that must change
    masks: tuple[tuple[tuple[int, int], ...], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class GateDecision:
    """Whether a frame goes to the pipeline, why, and the boxes where it moved (x, y, w, h)."""

    send: bool
    reason: str  # "motion" | "keepalive" | "still" | "first"
    boxes: list[tuple[int, int, int, int]] = field(default_factory=list)


class MotionGate:
    """Decides, frame by frame, which frames reach the pipeline."""

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self._seen = False

    def decide(self, image: np.ndarray, now: float) -> GateDecision:
        """The decision for `image` (H x W x 3 uint8 RGB) taken at `now`."""
        first, self._seen = not self._seen, True
        return GateDecision(True, "first" if first else "motion", [])
