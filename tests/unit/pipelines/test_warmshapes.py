"""The shapes a pipeline's model steps send their models, derived from its steps (daemon/pipelines/warmshapes.py),
and the warm-up's use of them (models/hot.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux import config as cfg
from infermux.models.hot import WarmShape, shaped_inputs
from infermux.plugins.base import TensorSpec

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from infermux.pipelines import warmshapes  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def ocr(tmp_path: Path, warm_frames: str) -> cfg.Config:
    """The shipped OCR example, with `warm_frames` set (its engines need not exist to be read)."""
    text = (REPO / "etc/infermux/examples/ocr.toml").read_text()
    text = text.replace('engine_dir = "../../../engines/ppocr"', f'engine_dir = "{tmp_path}"')
    for name in ("keys.txt", "cls_labels.txt"):
        (tmp_path / name).write_text("a\n")
    text = text.replace("\nwarm_frames = [[1280, 720]]\n", "\n", 1)  # the shipped sizes, replaced by the test's
    text = text.replace('name = "ocr"\n', f'name = "ocr"\n{warm_frames}', 1)
    path = tmp_path / "ocr.toml"
    path.write_text(text)
    return cfg.load(path)


def shapes(config: cfg.Config, model: str) -> list[tuple[int, ...]]:
    return [s.shape for s in warmshapes.for_model(config, model)]


def test_the_ocr_detector_is_warmed_at_what_its_resize_makes_of_each_warm_frame(tmp_path: Path) -> None:
    config = ocr(tmp_path, "warm_frames = [[1280, 720], [640, 480], [1920, 1080]]\n")
    # short side up to 736 (limit = "min"), both sides to multiples of 32; 1080p is kept as it is, rounded
    assert shapes(config, "ppocr_det") == [(1, 3, 736, 1312), (1, 3, 736, 992), (1, 3, 1088, 1920)]
    # the direction classifier's crops: 48 high, at most 192 wide, each padded to 192 (pad_multiple)
    assert shapes(config, "ppocr_cls") == [(1, 3, 48, 192)]
    # the recogniser's crops are as wide as their text: no shape is known, none is guessed
    assert shapes(config, "ppocr_rec") == []


def test_without_warm_frames_only_the_shapes_the_steps_fix_are_warmed(tmp_path: Path) -> None:
    config = ocr(tmp_path, "")
    assert shapes(config, "ppocr_det") == [] and shapes(config, "ppocr_cls") == [(1, 3, 48, 192)]


def test_a_warm_frame_the_pipeline_refuses_is_not_warmed(tmp_path: Path) -> None:
    config = ocr(tmp_path, "warm_frames = [[4000, 100], [1280, 720]]\n")  # 4000x100: past max_side 2048
    assert shapes(config, "ppocr_det") == [(1, 3, 736, 1312)]


def test_a_letterbox_gray_frame_in_hwc_without_a_batch_axis(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f'[daemon]\nengine_dir = "{tmp_path}"\n[[models]]\nname = "m"\nengine = "m.onnx"\n'
                    '[[pipelines]]\nname = "p"\n'
                    '[[pipelines.steps]]\nprocessor = "decode"\noptions = { to = "gray" }\n'
                    '[[pipelines.steps]]\nprocessor = "resize"\noptions = { mode = "letterbox", size = [320, 256] }\n'
                    '[[pipelines.steps]]\nprocessor = "layout"\noptions = { chw = false, batch = false }\n'
                    '[[pipelines.steps]]\nprocessor = "cast"\noptions = { dtype = "uint8" }\n'
                    '[[pipelines.steps]]\nmodel = "m"\ninput = "pixels"\n')
    (found,) = warmshapes.for_model(cfg.load(path), "m")
    assert (found.input, found.shape, found.dtype) == ("pixels", (256, 320, 1), "uint8")


def test_a_shape_is_warmed_only_where_the_engine_takes_it() -> None:
    spec = TensorSpec("x", "float32", (1, 3, -1, -1))
    inputs = shaped_inputs([spec], WarmShape("", (1, 3, 64, 96), "float32"))
    assert inputs is not None and inputs["x"].shape == (1, 3, 64, 96) and not inputs["x"].any()
    assert shaped_inputs([spec], WarmShape("", (1, 1, 64, 96), "float32")) is None  # 3 channels, fixed
    assert shaped_inputs([spec], WarmShape("", (1, 3, 64, 96), "uint8")) is None
    assert shaped_inputs([spec], WarmShape("other", (1, 3, 64, 96), "float32")) is None
    assert shaped_inputs([spec, TensorSpec("y", "float32", (1,))], WarmShape("", (1, 3, 8, 8), "float32")) is None
