"""A dynamic-shape model is warmed at the shapes its pipelines send it, on a real daemon: the shape a
`resize` makes of each of the pipeline's `warm_frames`, so that a camera's first frame does not pay
for a shape the model has not run yet (tests/benchmarks/RESULTS.md, "Warm-up at the pipeline's shapes")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infermux.client import Client, Frame
from support import models

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")


def config(engine: Path, warm_frames: str, placement: str = "") -> str:
    # brightness_map takes float32 [1, 3, H, W], any H and W: what the resize makes of a frame.
    return (f'[[models]]\nname = "bright"\nengine = "{engine}"\n{placement}'
            f'[[pipelines]]\nname = "cams"\n{warm_frames}'
            '[[pipelines.steps]]\nprocessor = "decode"\n'
            '[[pipelines.steps]]\nprocessor = "resize"\n'
            'options = {{ mode = "multiple", multiple = 32, limit_side = 256, limit = "min", max_side = 1024 }}\n'
            '[[pipelines.steps]]\nprocessor = "normalize"\n'
            '[[pipelines.steps]]\nmodel = "bright"\n'
            '[[pipelines.steps]]\nprocessor = "dbnet"\n')


@pytest.mark.parametrize("placement", ["", 'placement = "cold"\npreload = true\n'], ids=["hot", "cold"])
def test_a_model_is_warmed_at_the_shapes_the_pipelines_resize_makes_of_its_warm_frames(make_daemon, tmp_path: Path,
                                                                                      placement: str) -> None:
    engine = models.brightness_map(tmp_path / "bright/1/model.onnx")
    # 320x240: the short side scaled up to 256, the long side with it, to multiples of 32: 352 x 256.
    # 4000x100 would be 10240 wide: past max_side, refused, so not warmed (and the daemon still serves).
    # Cold, the worker process warms it: the daemon sends the shapes with the version to load.
    d = make_daemon(config(engine, "warm_frames = [[320, 240], [4000, 100]]\n", placement))
    d.wait_for("model bright warmed at float32 [1, 3, 256, 352] for pipeline 'cams' step 'bright' at 320x240", 30)
    assert "10240" not in d.log()
    with Client(d.endpoint) as client:
        reply = client.infer("cams", Frame.of(np.zeros((240, 320, 3), np.uint8)))
    assert reply.status == 200 and reply.header["regions"] == [], reply.header


def test_without_warm_frames_a_frame_sized_shape_is_not_guessed(make_daemon, tmp_path: Path) -> None:
    engine = models.brightness_map(tmp_path / "bright/1/model.onnx")
    d = make_daemon(config(engine, ""))
    with Client(d.endpoint) as client:
        assert client.infer("cams", Frame.of(np.zeros((240, 320, 3), np.uint8))).status == 200
    assert "model bright warmed at" not in d.log()
