"""Video files and `[[cameras]]` entries for the tests of the daemon's own cameras."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from support.harness import Daemon


def write_clip(path: Path, width: int = 64, height: int = 48, frames: int = 30, fps: int = 15,
               moving: bool = True) -> Path:
    """A short H.264 clip (MPEG-4 part 2 where this FFmpeg has no H.264 encoder) of a bar moving across
    a dark frame (standing still: `moving` false), written with PyAV."""
    images = []
    for i in range(frames):
        image = np.full((height, width, 3), 20, np.uint8)
        image[:, (i * 3 if moving else 5) % width] = 255
        images.append(image)
    return write_frames(path, images, fps)


def write_frames(path: Path, frames: Iterable[np.ndarray], fps: int = 15) -> Path:
    """A clip of `frames` (RGB uint8, even sides), H.264 at its best quality (MPEG-4 part 2 where this
    FFmpeg has no H.264 encoder), written with PyAV: a generated scene a camera reads from a file."""
    import av

    h264 = "libx264" in av.codecs_available
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264" if h264 else "mpeg4", rate=fps,
                                options={"crf": "10"} if h264 else {"qscale": "2"})
        stream.pix_fmt = "yuv420p"
        for i, image in enumerate(frames):
            if i == 0:
                stream.height, stream.width = image.shape[:2]
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def camera(name: str, url: str, pipeline: str = "cams", **settings: object) -> str:
    """One `[[cameras]]` entry (braces doubled: the tests' configurations are str.format templates)."""
    lines = [f'name = "{name}"', f'url = "{url}"', f'pipeline = "{pipeline}"']
    for key, value in settings.items():
        text = str(value).lower() if isinstance(value, bool) else f'"{value}"' if isinstance(value, str) else value
        lines.append(f"{key} = {text}")
    return "[[cameras]]\n" + "\n".join(lines).replace("{", "{{").replace("}", "}}") + "\n"


def cameras(d: Daemon) -> dict[str, dict[str, Any]]:
    """Admin `cameras`, by camera name."""
    with d.admin() as admin:
        return {c["camera"]: c for c in admin.call("cameras")["cameras"]}


def camera_events(d: Daemon, kind: str, name: str) -> list[dict[str, Any]]:
    """The daemon's recent events of `kind` about camera `name`."""
    with d.admin() as admin:
        found = admin.call("events", limit=1000, kind=kind)["events"]
    return [e for e in found if e.get("camera") == name]
