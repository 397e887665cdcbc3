"""A camera's frames to RGB (cameras/source.py RGBConverter): one swscale context kept across a stream's
frames, on one thread, gives what `frame.to_ndarray(format="rgb24")` gave (a context per frame, a thread a
core), on real clips: unscaled and scaled to a `size`, with padded rows, odd sizes and other pixel formats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

av = pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")

from support.camera_files import write_frames  # noqa: E402

from infermux.cameras.source import CameraEnded, RGBConverter, open_source  # noqa: E402
from infermux.config.settings import CameraConfig  # noqa: E402


def textured(width: int, height: int, frames: int = 3, seed: int = 0) -> list[np.ndarray]:
    """Frames with every colour and sharp detail: gradients across the frame under per-pixel noise."""
    rng = np.random.default_rng(seed)
    x = np.broadcast_to(np.linspace(0, 255, width)[None, :], (height, width))
    y = np.broadcast_to(np.linspace(0, 255, height)[:, None], (height, width))
    base = np.stack([x, y, (x + y) / 2], axis=2)
    return [np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8) for _ in range(frames)]


def decoded(path: Path) -> list[Any]:
    with av.open(str(path)) as container:
        return list(container.decode(video=0))


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == np.uint8
    assert np.array_equal(got, want), int(np.abs(got.astype(np.int16) - want.astype(np.int16)).max())


@pytest.mark.parametrize("width, height, padded", [(640, 360, False), (100, 60, True), (98, 50, True)])
def test_unscaled_frames_are_what_to_ndarray_gave(tmp_path: Path, width: int, height: int, padded: bool) -> None:
    """100 and 98 wide: planes whose rows are padded past the width (a stride); 98: an odd chroma width."""
    frames = decoded(write_frames(tmp_path / "clip.mp4", textured(width, height)))
    assert frames and (frames[0].planes[0].line_size > width) == padded
    convert = RGBConverter(None)
    for frame in frames:
        assert_same(convert(frame), frame.to_ndarray(format="rgb24"))


@pytest.mark.parametrize("size", [(321, 181), (320, 180), (640, 360), (1280, 720)])
def test_a_size_is_what_to_ndarray_scaled_to(tmp_path: Path, size: tuple[int, int]) -> None:
    """A `size`, odd sides and a larger one included, scaled and converted in one pass as before."""
    frames = decoded(write_frames(tmp_path / "clip.mp4", textured(640, 360)))
    convert = RGBConverter(size)
    for frame in frames:
        assert_same(convert(frame), frame.to_ndarray(format="rgb24", width=size[0], height=size[1]))


def test_other_pixel_formats_and_a_size_change_mid_stream(tmp_path: Path) -> None:
    """Full range 4:2:0 (MJPEG's), 4:2:2 and 4:4:4 frames, and frames whose size changes between two (a
    camera that changed its resolution): the kept context follows each."""
    small, large = (decoded(write_frames(tmp_path / f"{w}.mp4", textured(w, h, frames=1)))[0]
                    for w, h in ((64, 48), (160, 90)))
    convert = RGBConverter(None)
    for frame in (small, large, small.reformat(format="yuvj420p"), large.reformat(format="yuv422p"),
                  small.reformat(format="yuv444p"), large):
        assert_same(convert(frame), frame.to_ndarray(format="rgb24"))


def test_a_file_camera_hands_on_what_to_ndarray_gave(tmp_path: Path) -> None:
    path = write_frames(tmp_path / "clip.mp4", textured(160, 90, frames=4))
    want = [frame.to_ndarray(format="rgb24", width=81, height=45) for frame in decoded(path)]
    source = open_source(CameraConfig(name="cam", url=str(path), pipeline="p", decoder="software", loop=False,
                                      size=(81, 45)))
    got = []
    with pytest.raises(CameraEnded):
        for frame in source.frames():
            got.append(frame.image)
    assert len(got) == len(want)
    for image, reference in zip(got, want):
        assert_same(image, reference)
