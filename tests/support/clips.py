"""Generated camera clips for the motion gate, with the truth of where objects are.

A clip is 640×360 RGB frames at 15 fps of a fixed textured scene (dark,
like a street at dusk: objects stand out in grey as they would in the
working image) seen through a sensor: every frame gets fresh Gaussian noise
(`noise`, grey levels) and the whole scene a slow lighting drift (a gain
`1 + drift · sin(2πt / drift_s)`). `static` is the scene alone; `moving`
adds the objects of one of tests/support/tracking.py's sequences, scaled from
its 320×240 to the clip's size, and `present[i]` says whether frame i shows
an object (the sequence's ground truth: one at least a quarter visible).
Everything comes from fixed seeds, so a clip is the same on every run.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from support import tracking

WIDTH, HEIGHT, FPS = 640, 360, 15.0


NOISE_FIELDS = 16  # frames of sensor noise, drawn once and taken in a shuffled cycle: each frame's is new to the last


@functools.lru_cache(maxsize=2)
def _noise_fields(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((NOISE_FIELDS, HEIGHT, WIDTH, 3), dtype=np.float32)


def noise_field(seed: int, i: int) -> np.ndarray:
    """Frame i's sensor noise (standard normal per pixel and channel): frames close in time never share one."""
    return _noise_fields(seed)[(i * 7 + i // NOISE_FIELDS) % NOISE_FIELDS]


def scene(seed: int = 7) -> np.ndarray:
    """The still scene, float32 RGB (HEIGHT, WIDTH, 3): a dark gradient, a few buildings and a
    bright window or two, smoothed so no edge is sharper than a lens would give."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, HEIGHT, dtype=np.float32)[:, None]
    x = np.linspace(0, 1, WIDTH, dtype=np.float32)[None, :]
    base = 55 + 30 * y + 10 * x
    image = np.repeat(base[:, :, None], 3, axis=2).astype(np.float32)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, WIDTH - 60)), int(rng.integers(0, HEIGHT - 60))
        w, h = int(rng.integers(30, 160)), int(rng.integers(30, 140))
        image[y0:y0 + h, x0:x0 + w] = rng.uniform(40, 110, 3)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, WIDTH - 20)), int(rng.integers(0, HEIGHT - 20))
        image[y0:y0 + 12, x0:x0 + 18] = rng.uniform(150, 200)
    import cv2  # the clips' blur only; tests/support imports without OpenCV

    return cv2.GaussianBlur(image, (5, 5), 1.2)


@functools.lru_cache(maxsize=1)
def _scene() -> np.ndarray:
    image = scene()
    image.flags.writeable = False  # shared by every clip
    return image


@dataclass
class Clip:
    """`length` frames at FPS: `frame(i)` draws frame i, `present[i]` says whether it shows an object."""

    name: str
    length: int
    present: list[bool]
    sequence: tracking.Sequence | None = None
    noise: float = 4.0
    drift: float = 0.15
    drift_s: float = 40.0
    seed: int = 11

    def __post_init__(self) -> None:
        self._scene = _scene()
        self._buffer = np.empty_like(self._scene)

    def time(self, i: int) -> float:
        """When frame i is taken, in seconds from the clip's start."""
        return i / FPS

    def frame(self, i: int) -> np.ndarray:
        """Frame i as RGB uint8 (HEIGHT, WIDTH, 3)."""
        import cv2

        image = self._buffer  # one float frame a clip, not a fresh one per frame: this is the clips' cost
        np.multiply(self._scene, np.float32(1 + self.drift * math.sin(2 * math.pi * self.time(i) / self.drift_s)),
                    out=image)
        if self.sequence is not None:
            self._draw(image, i)
        cv2.scaleAdd(noise_field(self.seed, i), self.noise, image, dst=image)
        return np.clip(image, 0, 255, out=image).astype(np.uint8)

    def frames(self) -> Iterator[tuple[float, np.ndarray]]:
        """(time, frame) for each frame in turn."""
        for i in range(self.length):
            yield self.time(i), self.frame(i)

    def _draw(self, image: np.ndarray, i: int) -> None:
        """The sequence's frame i pasted over the scene wherever one of its objects is (their full boxes,
        so each keeps its black outline; the sequence's frame already has them in depth order)."""
        import cv2

        assert self.sequence is not None
        drawn = cv2.resize(self.sequence.frame(i), (WIDTH, HEIGHT), interpolation=cv2.INTER_NEAREST)
        sx, sy = WIDTH / tracking.W, HEIGHT / tracking.H
        for box, _, _ in self.sequence.truth[i].values():
            x0, y0 = max(0, int(box[0] * sx)), max(0, int(box[1] * sy))
            x1, y1 = min(WIDTH, math.ceil(box[2] * sx)), min(HEIGHT, math.ceil(box[3] * sy))
            image[y0:y1, x0:x1] = drawn[y0:y1, x0:x1]

    def boxes(self, i: int) -> list[tuple[float, float, float, float]]:
        """The visible part of each object in frame i, in the clip's pixels."""
        if self.sequence is None:
            return []
        sx, sy = WIDTH / tracking.W, HEIGHT / tracking.H
        return [(v[0] * sx, v[1] * sy, v[2] * sx, v[3] * sy) for _, v, _ in self.sequence.truth[i].values()]


def static(length: int = 300, **options: float) -> Clip:
    """The scene alone for `length` frames (20 s at 15 fps by default): noise and drift, nothing moving."""
    return Clip("static", length, [False] * length, **options)  # type: ignore[arg-type]


def moving(sequence: tracking.Sequence, **options: float) -> Clip:
    """The scene with `sequence`'s objects moving over it, for as many frames as the sequence has."""
    present = [bool(frame) for frame in sequence.truth]
    return Clip(f"moving-{sequence.name}", sequence.length, present, sequence, **options)  # type: ignore[arg-type]


def parked() -> tracking.Sequence:
    """One object alone: it drives in, stands still for 3 s, drives on (a frame difference loses it while it
    stands; the target must not)."""
    car = tracking.Thing(1, 0, 120, 48, 30, 4.0, 0.0, tracking.COLOURS[0], 0, stops=((30, 75),))
    return tracking.Sequence("parked", [car], 110, seed=5)


def sequences() -> list[tracking.Sequence]:
    """The moving clips' sequences: the tracking ones (crossings, a pillar, a crowd, stop and go) and `parked`."""
    return [*tracking.sequences(), parked()]


def movers() -> list[Clip]:
    """A moving clip of each of `sequences()`."""
    return [moving(sequence) for sequence in sequences()]
