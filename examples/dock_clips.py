#!/usr/bin/env python3
"""Four generated camera clips of a loading dock, for docs/events.md's "Try it" walk-through.

    python examples/dock_clips.py [FOLDER]      # default: examples/clips/, next to this script

Each clip (`dock-1.mp4` ... `dock-4.mp4`, 640×360, 15 fps, 16 s, looped by the camera) shows two
parcels with printed labels, each set down on a conveyor at the left and carried right: both pass
the scanner's beam in the middle of the frame; the first comes to a stop on the outbound bay at the
right, the second behind it, short of the bay. They wait there until the clip loops, when both are
gone at once. PP-OCR's text detector finds the labels, so the daemon's `track` step follows each
label and the events say when it was first seen, crossed the scanner, entered the bay and left the
picture. The parcels' timing differs per camera (a fixed seed each), so the events of the four
cameras interleave. Needs PyAV and OpenCV: `pip install -e '.[cameras]'`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WIDTH, HEIGHT, FPS, SECONDS = 640, 360, 15, 16
CAMERAS = 4
BELT_Y = 150  # the top of a parcel on the belt, in pixels
PARCEL_W, PARCEL_H = 170, 110
START_X = 20  # where a parcel is set down on the belt (its left edge)
STOP_X = 460  # where a parcel stops on the outbound bay (its left edge)
BAY_X = 480  # the bay's left edge: etc/infermux/examples/dock.toml's zone is x 0.75-1, y 0.4-0.8


@dataclass(frozen=True)
class Parcel:
    """A parcel: when it is set down at the left (seconds into the clip), how fast it moves, what it says."""

    start_s: float
    speed: float  # pixels a second
    text: str
    queue_slot: int = 0  # 0: stops at STOP_X, on the bay; 1: behind the first, past the scanner

    def left(self, t: float) -> float | None:
        """Its left edge at time t; None before it is set down."""
        if t < self.start_s:
            return None
        return min(START_X + self.speed * (t - self.start_s), STOP_X - (PARCEL_W + 10) * self.queue_slot)


def parcels(camera: int) -> list[Parcel]:
    """The camera's two parcels: a fixed seed per camera, so the clips are the same on every run."""
    rng = np.random.default_rng(1000 + camera)
    first = float(rng.uniform(0.2, 1.5))
    numbers = rng.integers(1000, 9999, 2)
    speed = float(rng.uniform(55, 70))
    return [Parcel(first, speed, f"PARCEL {numbers[0]}"),
            Parcel(first + float(rng.uniform(4.5, 5.5)), speed, f"PARCEL {numbers[1]}", 1)]


def background() -> np.ndarray:
    """The dock: a grey floor, the dark belt, the scanner's beam and the bay's yellow marking, as BGR uint8."""
    import cv2

    image = np.full((HEIGHT, WIDTH, 3), (92, 96, 98), np.uint8)
    image[BELT_Y + PARCEL_H - 20:BELT_Y + PARCEL_H + 10] = (40, 40, 44)  # the belt under the parcels
    cv2.rectangle(image, (BAY_X, int(0.4 * HEIGHT)), (WIDTH - 3, int(0.8 * HEIGHT)), (40, 190, 230), 3)
    image[:, WIDTH // 2 - 2:WIDTH // 2 + 2] = (30, 30, 200)  # the scanner's red beam
    return image


def draw_parcel(image: np.ndarray, left: float, text: str) -> None:
    """A brown box with a white label printed with the parcel's text."""
    import cv2

    x = int(round(left))
    cv2.rectangle(image, (x, BELT_Y), (x + PARCEL_W, BELT_Y + PARCEL_H), (60, 105, 150), -1)
    cv2.rectangle(image, (x + 8, BELT_Y + 35), (x + PARCEL_W - 8, BELT_Y + 75), (245, 245, 245), -1)
    cv2.putText(image, text, (x + 14, BELT_Y + 64), cv2.FONT_HERSHEY_SIMPLEX, 0.65, (20, 20, 20), 2,
                cv2.LINE_AA)


def frame(camera: int, i: int, floor: np.ndarray) -> np.ndarray:
    """Frame i of a camera's clip, as RGB."""
    image = floor.copy()
    for parcel in parcels(camera):
        left = parcel.left(i / FPS)
        if left is not None:
            draw_parcel(image, left, parcel.text)
    return np.ascontiguousarray(image[:, :, ::-1])


def write_clip(path: Path, camera: int) -> None:
    """One camera's clip: H.264 where this FFmpeg has an encoder for it, else MPEG-4 part 2."""
    import av

    h264 = "libx264" in av.codecs_available
    floor = background()
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264" if h264 else "mpeg4", rate=FPS,
                                options={"crf": "18"} if h264 else {"qscale": "3"})
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for i in range(FPS * SECONDS):
            picture = av.VideoFrame.from_ndarray(frame(camera, i, floor), format="rgb24")
            for packet in stream.encode(picture):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path(__file__).resolve().parent / "clips"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for camera in range(1, CAMERAS + 1):
            path = folder / f"dock-{camera}.mp4"
            write_clip(path, camera)
            print(f"wrote {path} ({path.stat().st_size // 1024} KiB, {SECONDS} s at {FPS} fps)", flush=True)
    except ImportError as e:
        print(f"dock_clips: {e.name} is missing: pip install -e '.[cameras]'", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"dock_clips: cannot write the clips into {folder}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
