"""Processors against hand-computed results, and against rapidocr where it is the reference.

Pure unit tests: no daemon. rapidocr-onnxruntime is only a reference here,
never imported by the product.
"""

from __future__ import annotations

import threading
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from infermux.plugins.processors import BUILTIN, Processor, available, create  # noqa: E402
from infermux.plugins.processors.base import ProcessorConfigError, ProcessorError, Sample, Transform  # noqa: E402
from infermux.plugins.processors.ctc import ctc_greedy  # noqa: E402
from infermux.plugins.processors.dbnet import DbnetConfig, regions_from_map  # noqa: E402
from infermux.plugins.processors.detect import nms  # noqa: E402


def bt601(y: float, u: float, v: float) -> tuple[float, float, float]:
    """Limited-range BT.601 YUV -> RGB, the conversion camera NV12/I420 frames use."""
    c, d, e = float(y) - 16, float(u) - 128, float(v) - 128
    r = 1.164 * c + 1.596 * e
    g = 1.164 * c - 0.392 * d - 0.813 * e
    b = 1.164 * c + 2.017 * d
    return tuple(float(np.clip(x, 0, 255)) for x in (r, g, b))  # type: ignore[return-value]


# A 4x2 frame: left 2x2 block Y=16/235 with neutral chroma, right block a colour.
Y = np.array([[16, 235, 81, 81], [126, 200, 81, 81]], np.uint8)
U, V = np.array([[128, 90]], np.uint8), np.array([[128, 240]], np.uint8)


def expected_rgb() -> np.ndarray:
    out = np.zeros((2, 4, 3))
    for row in range(2):
        for col in range(4):
            out[row, col] = bt601(Y[row, col], U[0, col // 2], V[0, col // 2])
    return out


def nv12(stride: int) -> bytes:
    def pad(rows: np.ndarray) -> bytes:
        return b"".join(bytes(r) + b"\0" * (stride - len(r)) for r in rows)
    uv = np.stack([U[0], V[0]], axis=1).reshape(1, 4)
    return pad(Y) + pad(uv)


def i420(stride: int) -> bytes:
    def pad(rows: np.ndarray, width: int) -> bytes:
        return b"".join(bytes(r) + b"\0" * (width - len(r)) for r in rows)
    return pad(Y, stride) + pad(U, stride // 2) + pad(V, stride // 2)


def decoded(data: bytes | np.ndarray, fmt: str, to: str = "rgb", **geometry: int) -> np.ndarray:
    sample = Sample(data=np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data, format=fmt,
                    **geometry)  # type: ignore[arg-type]
    create("decode", {"to": to})(sample)
    assert sample.image is not None
    return sample.image


@pytest.mark.parametrize("stride", [4, 8])
def test_nv12_to_rgb_matches_bt601_by_hand(stride: int) -> None:
    image = decoded(nv12(stride), "nv12", width=4, height=2, stride=stride)
    assert image.shape == (2, 4, 3) and image.dtype == np.uint8
    assert np.abs(image.astype(float) - expected_rgb()).max() <= 2
    assert image[0, 0].tolist() == [0, 0, 0] and image[0, 1].tolist() == [255, 255, 255]


@pytest.mark.parametrize("stride", [4, 8])
def test_i420_decodes_to_the_same_pixels_as_nv12(stride: int) -> None:
    via_i420 = decoded(i420(stride), "i420", to="bgr", width=4, height=2, stride=stride)
    via_nv12 = decoded(nv12(4), "nv12", to="bgr", width=4, height=2, stride=4)
    assert np.array_equal(via_i420, via_nv12)


def test_packed_frames_honour_stride_and_channel_order() -> None:
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    padded = np.zeros((2, 12), np.uint8)
    padded[:, :9] = rgb.reshape(2, 9)
    assert np.array_equal(decoded(padded.reshape(-1), "rgb", width=3, height=2, stride=12), rgb)
    assert np.array_equal(decoded(padded.reshape(-1), "rgb", to="bgr", width=3, height=2, stride=12),
                          rgb[:, :, ::-1])
    gray = decoded(np.array([0, 255], np.uint8), "gray", width=2, height=1)
    assert gray.shape == (1, 2, 3) and gray[0, 1].tolist() == [255, 255, 255]


@pytest.mark.parametrize("fmt, size, geometry, words", [
    ("nv12", 11, dict(width=4, height=2, stride=4), "12 bytes"),
    ("nv12", 12, dict(width=4, height=2, stride=2), "stride 2 is less"),
    ("nv12", 12, dict(width=3, height=2, stride=4), "even width"),
    ("i420", 15, dict(width=4, height=2, stride=5), "even stride"),
    ("bgr", 20, dict(width=3, height=2), "18 bytes"),
    ("rgb", 18, dict(width=0, height=2), "positive integer"),
    ("yuyv", 16, dict(width=4, height=2), "unknown format"),
])
def test_a_frame_that_does_not_match_its_geometry_is_a_typed_error(fmt: str, size: int,
                                                                   geometry: dict[str, int], words: str) -> None:
    with pytest.raises(ProcessorError) as info:
        decoded(bytes(size), fmt, **geometry)
    assert info.value.step == "decode" and words in info.value.reason


def test_jpeg_round_trip_and_png_exact() -> None:
    yy, xx = np.mgrid[0:48, 0:64]
    rgb = np.stack([xx * 4, yy * 5, (xx + yy) * 2], axis=2).astype(np.uint8)
    bgr = np.ascontiguousarray(rgb[:, :, ::-1])
    ok, jpeg = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    back = decoded(jpeg.reshape(-1), "jpeg")
    assert back.shape == rgb.shape and np.abs(back.astype(int) - rgb).mean() < 3
    ok, png = cv2.imencode(".png", bgr)
    assert np.array_equal(decoded(png.reshape(-1), "png"), rgb)
    assert np.array_equal(decoded(png.reshape(-1), "png", to="bgr"), bgr)


@pytest.mark.parametrize("data", [b"", b"\xff\xd8\xff\xe0 not really a jpeg", bytes(1000)])
def test_an_undecodable_image_is_a_typed_error(data: bytes) -> None:
    with pytest.raises(ProcessorError, match="cannot decode the image") as info:
        decoded(data, "jpeg")
    assert info.value.step == "decode"


def test_a_frame_over_max_pixels_is_refused() -> None:
    sample = Sample(data=np.zeros(64 * 64 * 3, np.uint8), format="rgb", width=64, height=64)
    with pytest.raises(ProcessorError, match="over the 1000 pixels"):
        create("decode", {"max_pixels": 1000})(sample)


def test_letterbox_geometry_by_hand() -> None:
    image = np.zeros((720, 1280, 3), np.uint8)
    image[350:370, 630:650] = 255  # a white square centred on (640, 360)
    sample = Sample(image=image)
    create("resize", {"mode": "letterbox", "size": [640, 640], "pad_value": 114})(sample)
    out = sample.tensor
    assert out is not None and out.shape == (640, 640, 3)
    assert sample.transform == Transform(0.5, 0.5, 0.0, 140.0)
    assert (out[:140] == 114).all() and (out[500:] == 114).all() and (out[140:500] != 114).all()
    assert out[320, 320].tolist() == [255, 255, 255]
    assert sample.transform.to_original(np.array([[320, 320], [0, 140]])).tolist() == [[640, 360], [0, 0]]


def test_resize_to_multiples_and_to_a_height() -> None:
    sample = Sample(image=np.zeros((500, 1000, 3), np.uint8))
    create("resize", {"mode": "multiple", "multiple": 32, "limit_side": 736, "limit": "min"})(sample)
    assert sample.tensor is not None and sample.tensor.shape == (736, 1472, 3)
    sample = Sample(image=np.zeros((30, 100, 3), np.uint8))
    create("resize", {"mode": "height", "height": 48, "max_width": 320, "pad_value": 0})(sample)
    assert sample.tensor is not None and sample.tensor.shape == (48, 320, 3)
    assert (sample.tensor[:, 160:] == 0).all() and sample.transform.scale_x == 160 / 100


def test_normalize_by_hand_in_chw_and_hwc() -> None:
    image = np.array([[[0, 255, 51]]], np.uint8)  # one pixel
    sample = Sample(image=image)
    create("normalize", {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]})(sample)
    assert sample.tensor is not None and sample.tensor.shape == (1, 3, 1, 1) and sample.tensor.dtype == np.float32
    assert np.allclose(sample.tensor.reshape(-1), [-1.0, 1.0, -0.6], atol=1e-6)
    hwc = Sample(image=image)
    create("normalize", {"scale": 1.0, "mean": [0, 100, 0], "std": [1, 2, 1], "chw": False, "batch": False})(hwc)
    assert hwc.tensor is not None and hwc.tensor.tolist() == [[[0.0, 77.5, 51.0]]]


def test_layout_and_cast() -> None:
    image = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    sample = Sample(image=image)
    create("layout")(sample)
    assert sample.tensor is not None and np.array_equal(sample.tensor[0], image.transpose(2, 0, 1))
    assert sample.tensor.flags.c_contiguous
    create("cast", {"dtype": "float16"})(sample)
    assert sample.tensor.dtype == np.float16


def test_nms_on_known_boxes() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [21, 21, 30, 30]], np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.95], np.float32)
    # IoU(0, 1) = 81 / 119 = 0.68; IoU(2, 3) = 81 / 100 = 0.81.
    assert nms(boxes, scores, 0.5).tolist() == [3, 0]
    assert nms(boxes, scores, 0.7).tolist() == [3, 0, 1]
    assert nms(boxes, scores, 0.9).tolist() == [3, 0, 1, 2]
    assert nms(boxes, scores, 0.5, limit=1).tolist() == [3]


def test_yolo_v8_boxes_map_back_through_the_letterbox(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("person\ncar\n")
    # [1, 4 + 2 classes, 3 boxes]: two overlapping cars and one person below the score threshold.
    out = np.array([[[320, 322, 100], [320, 321, 100], [100, 100, 20], [50, 50, 20],
                     [0.1, 0.1, 0.2], [0.9, 0.8, 0.1]]], np.float32)
    sample = Sample(transform=Transform(0.5, 0.5, 0.0, 140.0), outputs={"output0": out})
    create("yolo", {"labels": str(tmp_path / "labels.txt")})(sample)
    assert len(sample.regions) == 1
    region = sample.regions[0]
    assert region.label == "car" and region.score == pytest.approx(0.9)
    assert region.box.tolist() == [[540, 310], [740, 310], [740, 410], [540, 410]]


def test_yolo_v5_multiplies_objectness() -> None:
    out = np.array([[[10, 10, 4, 4, 0.5, 0.9], [40, 40, 4, 4, 0.2, 0.9]]], np.float32)
    sample = Sample(outputs={"out": out})
    create("yolo", {"layout": "v5", "score": 0.3})(sample)
    assert [(r.label, round(r.score, 3)) for r in sample.regions] == [("0", 0.45)]


def one_hot(indices: list[int], classes: int, p: float = 0.9) -> np.ndarray:
    probs = np.full((1, len(indices), classes), (1 - p) / (classes - 1), np.float32)
    probs[0, np.arange(len(indices)), indices] = p
    return probs


def test_ctc_greedy_on_a_known_sequence() -> None:
    chars = ["<blank>", "a", "b", "c", " "]
    # a a _ a b b _ ' ' _ c -> "aab c"
    probs = one_hot([1, 1, 0, 1, 2, 2, 0, 4, 0, 3], 5)
    probs[0, 0, 1] = 0.5
    text, score = ctc_greedy(probs, chars)[0]
    assert text == "aab c"
    assert score == pytest.approx((0.5 + 0.9 * 4) / 5)  # kept steps 0, 3, 4, 7, 9
    assert ctc_greedy(one_hot([0, 0], 5), chars) == [("", 0.0)]


def test_ctc_processor_fills_region_texts(tmp_path: Path) -> None:
    (tmp_path / "dict.txt").write_text("a\nb\nc\n")
    sample = Sample(outputs={"rec": np.concatenate([one_hot([1, 0, 2], 5), one_hot([3, 3, 0], 5)])})
    sample.regions = [_region(), _region()]
    create("ctc", {"dictionary": str(tmp_path / "dict.txt")})(sample)
    assert [r.text for r in sample.regions] == ["ab", "c"]
    with pytest.raises(ProcessorError, match=r"expects \[N, T, 5\]"):
        create("ctc", {"dictionary": str(tmp_path / "dict.txt")})(Sample(outputs={"rec": np.zeros((1, 3, 4))}))


def _region():  # type: ignore[no-untyped-def]
    from infermux.plugins.processors.base import Region
    return Region(np.zeros((4, 2), np.float32), 1.0)


def test_classify_softmax_top_k_with_labels(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\nbird\n")
    sample = Sample(outputs={"logits": np.array([[1.0, 3.0, 2.0]], np.float32)})
    create("classify", {"k": 2, "labels": str(tmp_path / "labels.txt")})(sample)
    e = np.exp([1.0, 3.0, 2.0])
    [[first, second]] = sample.classes
    assert (first.label, second.label) == ("dog", "bird")
    assert first.score == pytest.approx(e[1] / e.sum()) and second.score == pytest.approx(e[2] / e.sum())
    with pytest.raises(ProcessorError, match="3 labels but the model scores 4"):
        create("classify", {"labels": str(tmp_path / "labels.txt")})(Sample(outputs={"x": np.zeros((1, 4))}))


def synthetic_map() -> np.ndarray:
    prob = np.zeros((100, 100), np.float32)
    prob[20:40, 10:50] = 0.9   # a text kernel: pixels x 10..49, y 20..39
    prob[70:72, 70:72] = 0.9   # too small (min_size 3)
    prob[60:80, 10:40] = 0.4   # above thresh, below box_thresh
    return prob


def test_dbnet_regions_from_a_synthetic_map_by_hand() -> None:
    found = regions_from_map(synthetic_map(), DbnetConfig(dilate=False))
    assert len(found) == 1
    box, score = found[0]
    # The contour's rectangle has corners (10, 20) .. (49, 39), 39 x 19; unclip moves each edge out
    # by 39*19*1.6/116 = 10.22 and rounds: x -0.22 -> 0, 59.22 -> 59; y 9.78 -> 10, 49.22 -> 49.
    assert np.allclose(box, [[0, 10], [59, 10], [59, 49], [0, 49]], atol=1e-4)
    assert score == pytest.approx(0.9)


def test_dbnet_processor_maps_regions_to_the_original_frame() -> None:
    sample = Sample(image=np.zeros((100, 200, 3), np.uint8), transform=Transform(0.5, 1.0),
                    outputs={"map": synthetic_map()[None, None]})
    create("dbnet", {"dilate": False})(sample)
    [region] = sample.regions
    assert region.box.tolist() == [[0, 10], [118, 10], [118, 49], [0, 49]]  # x doubled, then clipped
    assert region.to_json()["box"] == [[0, 10], [118, 10], [118, 49], [0, 49]]
    assert region.label is None  # no label unless the step is told one


def test_dbnet_labels_every_region_it_is_told_to() -> None:
    sample = Sample(image=np.zeros((100, 200, 3), np.uint8), outputs={"map": synthetic_map()[None, None]})
    create("dbnet", {"dilate": False, "label": "text"})(sample)
    assert [r.label for r in sample.regions] == ["text"] and sample.regions[0].to_json()["label"] == "text"


def test_crop_rectifies_a_region_and_turns_tall_ones() -> None:
    yy, xx = np.mgrid[0:60, 0:80]
    image = np.stack([xx, yy, xx + yy], axis=2).astype(np.uint8)
    sample = Sample(image=image)
    sample.regions = [_region(), _region()]
    sample.regions[0].box = np.array([[10, 10], [50, 10], [50, 30], [10, 30]], np.float32)
    sample.regions[1].box = np.array([[5, 5], [15, 5], [15, 45], [5, 45]], np.float32)
    create("crop", {"interpolation": "linear"})(sample)
    wide, tall = sample.crops
    assert wide.shape == (20, 40, 3) and np.abs(wide.astype(int) - image[10:30, 10:50]).max() <= 1
    assert tall.shape == (10, 40, 3)  # 40 tall x 10 wide: turned to read left to right
    flat = Sample(image=image, regions=[sample.regions[0]])
    create("crop", {"rectify": False})(flat)
    assert np.array_equal(flat.crops[0], image[10:30, 10:50])


@pytest.mark.parametrize("kind, options, words", [
    ("resize", {"siz": [1, 2]}, "unknown option 'siz'"),
    ("resize", {"mode": "letterbox"}, "option 'size'"),
    ("resize", {"mode": "stretch", "size": [640]}, "option 'size' must be a list of 2"),
    ("normalize", {"std": [1, 0, 1]}, "option 'std'"),
    ("normalize", {"mean": "0.5"}, "option 'mean' must be a list of numbers"),
    ("decode", {"to": "yuv"}, "option 'to'"),
    ("dbnet", {"thresh": 2}, "option 'thresh' must be between 0 and 1"),
    ("dbnet", {"label": ""}, "option 'label' must be 1 to 64 characters"),
    ("dbnet", {"label": 3}, "option 'label'"),
    ("ctc", {}, "option 'dictionary' is required"),
    ("ctc", {"dictionary": "/nonexistent/dict.txt"}, "option 'dictionary': cannot read"),
    ("yolo", {"layout": "v3"}, "option 'layout'"),
    ("cast", {"dtype": "complex64"}, "option 'dtype'"),
    ("nonesuch", {}, "unknown processor"),
])
def test_bad_options_are_refused_naming_the_field(kind: str, options: dict, words: str) -> None:
    with pytest.raises(ProcessorConfigError, match=words.replace("[", r"\[")):
        create(kind, options)


def test_every_builtin_is_a_processor_and_an_installed_entry_point() -> None:
    installed = {ep.name: ep.value for ep in entry_points(group="infermux.processors")}
    assert installed == BUILTIN, "pyproject.toml's entry points and BUILTIN must list the same processors"
    assert set(BUILTIN) <= set(available())
    options = {"ctc": {"dictionary": __file__}, "resize": {"size": [8, 8]}}
    for kind in BUILTIN:
        processor = create(kind, options.get(kind, {}), step=f"my-{kind}")
        assert isinstance(processor, Processor) and processor.kind == kind and processor.step == f"my-{kind}"


def test_a_module_class_name_loads_a_processor_without_an_entry_point() -> None:
    processor = create("infermux.plugins.processors.tensor:Cast", {"dtype": "uint8"}, step="c")
    assert processor.kind == "cast"


def test_steps_are_thread_safe_shared_between_threads() -> None:
    steps = [create("decode"), create("resize", {"mode": "letterbox", "size": [64, 64]}),
             create("normalize", {"mean": [0.5], "std": [0.5]})]
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (48 + i, 80, 3), np.uint8) for i in range(8)]

    def run(frame: np.ndarray) -> np.ndarray:
        sample = Sample(data=frame.reshape(-1), format="rgb", width=80, height=frame.shape[0])
        for step in steps:
            step(sample)
        assert sample.tensor is not None
        return sample.tensor

    serial = [run(f) for f in frames]
    results: list[list[np.ndarray]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def worker(slot: int) -> None:
        start.wait()
        results[slot] = [run(f) for f in frames * 5]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        assert all(np.array_equal(a, serial[i % 8]) for i, a in enumerate(got))


# --- rapidocr-onnxruntime as the reference (tests only) -------------------------------------------

def rapidocr_module(name: str):  # type: ignore[no-untyped-def]
    pytest.importorskip("rapidocr_onnxruntime", reason="rapidocr-onnxruntime (the reference) is not installed: "
                        "pip install --no-deps rapidocr-onnxruntime pyclipper shapely pyyaml pillow six tqdm")
    import importlib
    return importlib.import_module(f"rapidocr_onnxruntime.{name}")


def reference_map(seed: int) -> np.ndarray:
    """A DB-net-like map: blurred filled quadrilaterals (some rotated) on low noise."""
    rng = np.random.default_rng(seed)
    prob = rng.uniform(0, 0.1, (320, 480)).astype(np.float32)
    for _ in range(6):
        centre = rng.uniform([40, 30], [440, 290])
        size = rng.uniform([20, 8], [120, 30])
        angle = float(rng.choice([0.0, rng.uniform(-30, 30)]))
        box = cv2.boxPoints(((float(centre[0]), float(centre[1])), (float(size[0]), float(size[1])), angle))
        cv2.fillPoly(prob, [box.astype(np.int32)], float(rng.uniform(0.6, 0.95)))
    return cv2.GaussianBlur(prob, (3, 3), 0)


@pytest.mark.parametrize("seed", range(12))
def test_dbnet_matches_rapidocr_on_the_same_map(seed: int) -> None:
    utils = rapidocr_module("ch_ppocr_det.utils")
    prob = reference_map(seed)
    ref_boxes, ref_scores = utils.DBPostProcess(thresh=0.3, box_thresh=0.5, unclip_ratio=1.6,
                                                use_dilation=True)(prob[None, None], (640, 960))
    sample = Sample(image=np.zeros((640, 960, 3), np.uint8), transform=Transform(0.5, 0.5),
                    outputs={"map": prob[None, None]})
    create("dbnet")(sample)
    ours = sorted(sample.regions, key=lambda r: tuple(r.box[0]))
    ref = sorted(zip(ref_boxes, ref_scores), key=lambda b: tuple(b[0][0]))
    assert len(ours) == len(ref)
    for region, (box, score) in zip(ours, ref):
        # pyclipper's integer arcs can move a rotated box's corner by a map pixel (2 frame pixels).
        assert np.abs(region.box - box).max() <= 2, (region.box.tolist(), box.tolist())
        assert region.score == pytest.approx(score, abs=1e-6)


def test_ctc_matches_rapidocr_on_the_same_output(tmp_path: Path) -> None:
    utils = rapidocr_module("ch_ppocr_rec.utils")
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789")
    (tmp_path / "dict.txt").write_text("\n".join(chars) + "\n")
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(8, 40, len(chars) + 2)).astype(np.float32)
    logits[:, ::2, 0] += 3  # blanks between characters, as a recogniser emits them
    probs = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    reference = utils.CTCLabelDecode(character_path=str(tmp_path / "dict.txt"))(probs)
    sample = Sample(outputs={"rec": probs})
    create("ctc", {"dictionary": str(tmp_path / "dict.txt")})(sample)
    assert [t for t, _ in sample.texts] == [t for t, _ in reference]
    assert np.allclose([s for _, s in sample.texts], [s for _, s in reference], atol=1e-6)


def test_nothing_found_is_an_empty_list_not_an_error() -> None:
    yolo = Sample(outputs={"out": np.zeros((1, 6, 10), np.float32)})
    create("yolo")(yolo)
    dbnet = Sample(outputs={"map": np.zeros((1, 1, 32, 32), np.float32)})
    create("dbnet")(dbnet)
    crops = Sample(image=np.zeros((8, 8, 3), np.uint8))
    create("crop")(crops)
    assert yolo.regions == [] and dbnet.regions == [] and crops.crops == []


def test_an_image_declaring_too_many_pixels_is_refused_before_decoding() -> None:
    from infermux.plugins.processors.base import FrameTooLarge
    from infermux.plugins.processors.frames import header_size
    image = np.zeros((40, 60, 3), np.uint8)
    for ext in (".png", ".jpg"):
        encoded = cv2.imencode(ext, image)[1].reshape(-1)
        assert header_size(encoded.tobytes()) == (60, 40)
        with pytest.raises(FrameTooLarge, match="frame 60x40 is over the 2000 pixels"):
            create("decode", {"max_pixels": 2000})(Sample(data=encoded, format=ext[1:]))
    # A PNG header claiming 100000 x 100000 with nothing behind it: refused by its header.
    bomb = bytearray(cv2.imencode(".png", image)[1].tobytes())
    bomb[16:24] = (100_000).to_bytes(4, "big") * 2
    with pytest.raises(FrameTooLarge):
        create("decode")(Sample(data=np.frombuffer(bytes(bomb), np.uint8), format="png"))


@pytest.mark.slow
def test_the_processors_benchmark_runs_every_case() -> None:
    import subprocess
    import sys
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_processors.py"
    out = subprocess.run([sys.executable, str(script), "--no-write", "--seconds", "0.01", "--rounds", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for kind in ("decode", "resize", "normalize", "layout", "chain", "dbnet", "yolo", "ctc", "classify", "crop"):
        assert f"| {kind} |" in out.stdout


def rendered_page(seed: int) -> np.ndarray:
    """A white BGR page with three lines of text at different sizes and places."""
    rng = np.random.default_rng(seed)
    page = np.full((360, 800, 3), 255, np.uint8)
    words = ["INFERMUX", "camera 42", "hello world", "Jetson Orin", "batch 16", "pipeline ok"]
    for i in range(3):
        cv2.putText(page, str(rng.choice(words)), (30 + 40 * i, 80 + 110 * i), cv2.FONT_HERSHEY_SIMPLEX,
                    1.6 + 0.3 * i, (0, 0, 0), 3)
    return page


@pytest.mark.slow
def test_the_ppocr_steps_match_rapidocr_with_its_own_models(tmp_path: Path) -> None:
    """decode -> resize -> normalize -> PP-OCR det -> dbnet -> crop -> resize -> normalize -> rec -> ctc,
    the models run by onnxruntime here, against rapidocr's own detector and recogniser."""
    package = rapidocr_module("main")
    ort = pytest.importorskip("onnxruntime")
    models = Path(package.__file__).parent / "models"
    engine = package.RapidOCR()
    det = ort.InferenceSession(str(models / "ch_PP-OCRv4_det_infer.onnx"), providers=["CPUExecutionProvider"])
    rec = ort.InferenceSession(str(models / "ch_PP-OCRv4_rec_infer.onnx"), providers=["CPUExecutionProvider"])
    (tmp_path / "dict.txt").write_text(rec.get_modelmeta().custom_metadata_map["character"] + "\n")
    pre = [create("decode", {"to": "bgr"}), create("resize", {"mode": "multiple", "limit_side": 736, "limit": "min"}),
           create("normalize", {"mean": [0.5], "std": [0.5]})]
    rec_pre = [create("resize", {"mode": "height", "height": 48}), create("normalize", {"mean": [0.5], "std": [0.5]})]
    dbnet, crop, ctc = create("dbnet"), create("crop"), create("ctc", {"dictionary": str(tmp_path / "dict.txt")})
    texts = 0
    for seed in range(4):
        page = rendered_page(seed)
        sample = Sample(data=cv2.imencode(".png", page)[1].reshape(-1), format="png")
        for step in pre:
            step(sample)
        sample.outputs = {"maps": det.run(None, {det.get_inputs()[0].name: sample.tensor})[0]}
        dbnet(sample)
        ours = sorted((r.box for r in sample.regions), key=lambda b: (b[0][1], b[0][0]))
        reference = sorted(engine.text_det(page)[0], key=lambda b: (b[0][1], b[0][0]))
        assert len(ours) == len(reference) >= 3
        assert max(np.abs(a - b).max() for a, b in zip(ours, reference)) <= 2
        crop(sample)
        for image in sample.crops:
            line = Sample(image=image)
            for step in rec_pre:
                step(line)
            line.outputs = {"probs": rec.run(None, {rec.get_inputs()[0].name: line.tensor})[0]}
            ctc(line)
            assert line.texts[0][0] == engine.text_rec(image)[0][0][0]
            texts += 1
    assert texts >= 12


def test_orient_turns_an_upside_down_crop_and_clears_the_direction() -> None:
    from infermux.plugins.processors.base import Label, Region
    crop = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    region = Region(np.zeros((4, 2), np.float32), 0.9, label="180")
    sample = Sample(image=crop, tensor=np.ones(3), regions=[region], classes=[[Label(1, "180", 0.95)]])
    create("orient")(sample)
    assert np.array_equal(sample.image, crop[::-1, ::-1]) and sample.tensor is None and region.label is None
    unsure = Sample(image=crop, classes=[[Label(1, "180", 0.85)]])
    create("orient")(unsure)
    assert np.array_equal(unsure.image, crop)  # 0.85 is not above rapidocr's 0.9


def test_select_drops_unsure_regions_with_their_crops() -> None:
    from infermux.plugins.processors.base import Region
    box = np.zeros((4, 2), np.float32)
    regions = [Region(box, 0.9, text="a", text_score=0.4), Region(box, 0.9, text="b", text_score=0.6),
               Region(box, 0.2, text="c", text_score=0.9)]
    sample = Sample(regions=regions, crops=[np.zeros(1), np.ones(1), np.full(1, 2)])
    create("select", {"min_text_score": 0.5, "min_score": 0.5})(sample)
    assert [r.text for r in sample.regions] == ["b"] and sample.crops[0][0] == 1


def test_resize_to_a_height_without_padding_leaves_the_width_for_the_batch() -> None:
    sample = Sample(image=np.zeros((24, 40, 3), np.uint8))
    create("resize", {"mode": "height", "height": 48, "max_width": 192, "pad": False})(sample)
    assert sample.tensor is not None and sample.tensor.shape == (48, 80, 3)


def test_the_630_byte_jpeg_with_a_fill_byte_is_small_and_its_header_read_through_it() -> None:
    from infermux.plugins.processors.frames import header_size
    from support.hostile_files import jpeg_with_big_app_segment, jpeg_with_fill_byte
    data = jpeg_with_fill_byte()
    assert len(data) < 700
    assert header_size(data) == (32768, 32000)
    assert header_size(jpeg_with_big_app_segment()) == (20000, 20000)  # its SOF lies past the first 64 KiB


def test_opencv_is_held_to_the_default_max_pixels_by_the_time_it_is_imported() -> None:
    """cv2 reads OPENCV_IO_MAX_IMAGE_PIXELS once, when it loads: the processors set it first, so a
    format whose size the header check cannot read is refused by OpenCV before it allocates."""
    import subprocess
    import sys
    code = ("import os; os.environ.pop('OPENCV_IO_MAX_IMAGE_PIXELS', None)\n"
            "import infermux.plugins.processors.frames as f, cv2, numpy as np, resource\n"
            "print(os.environ['OPENCV_IO_MAX_IMAGE_PIXELS'])\n"
            "data = np.frombuffer(f'P5\\n9000 9000\\n255\\n'.encode() + bytes(81_000_000), np.uint8)\n"
            "try:\n    image = cv2.imdecode(data, cv2.IMREAD_GRAYSCALE)\nexcept cv2.error:\n    image = None\n"
            "print(image is None, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    limit, refused = out.stdout.split("\n")[:2]
    assert int(limit) == 8192 * 8192
    assert refused.split()[0] == "True"  # 81 M pixels > 67 M: OpenCV itself refused the PGM


def test_max_side_belongs_to_the_multiple_mode() -> None:
    with pytest.raises(ProcessorConfigError, match="max_side"):
        create("resize", {"mode": "stretch", "size": [8, 8], "max_side": 64})
    resize = create("resize", {"mode": "multiple", "max_side": 64})
    with pytest.raises(Exception, match=r"resized to 96x32 .*\(max_side\); send a smaller frame"):
        resize(Sample(tensor=np.zeros((30, 100, 3), np.uint8)))
