"""Pipelines end to end: the shipped OCR pipeline on a real daemon against rapidocr.

One daemon for the module serves etc/infermux/examples/ocr.toml with the
models engines/fetch_ppocr.py takes out of the rapidocr-onnxruntime wheel,
plus a copy of the pipeline whose recogniser is cold (a worker process) and
a pipeline with a processor that raises. rapidocr-onnxruntime is the
reference here only; the product never imports it.

The frames are small (320 x 240), so both sides run the detector with its
short side at 320 instead of 736 (`limit_side` here, `det_limit_side_len`
for rapidocr): the same models and steps, a quarter of the pixels, so that
50 frames fit the time a test may take.
"""

from __future__ import annotations

import subprocess
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import zmq

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")
pytest.importorskip("PIL", reason="the frames are rendered with Pillow")
rapidocr = pytest.importorskip("rapidocr_onnxruntime", reason="rapidocr-onnxruntime (the reference) is not "
                               "installed: pip install -e '.[test]'")

from support import models  # noqa: E402
from support.harness import REPO, Daemon, example, free_port  # noqa: E402
from support.metrics import scrape  # noqa: E402

from infermux.config import ConfigError, parse  # noqa: E402
from infermux.pipelines.wire import send_frame  # noqa: E402
from infermux.protocol import Reply  # noqa: E402

FRAMES = 50
COLD = """
[[models]]
name = "ppocr_rec_cold"
engine = "rec.onnx"
placement = "cold"
max_batch = 64
batch_delay_us = 1000
timeout_ms = 10000
"""
BROKEN = """
[[pipelines]]
name = "broken"
[[pipelines.steps]]
processor = "decode"
[[pipelines.steps]]
name = "buggy"
processor = "raising_processor:Raising"
"""


camera_ocr = example("camera_ocr")


def ocr_config(engines: Path, metrics_port: int) -> str:
    """ocr.toml served from `engines`, the detector at 320, with the cold copy and the broken pipeline."""
    text = (REPO / "etc/infermux/examples/ocr.toml").read_text()
    text = text.replace('engine_dir = "../../../engines/ppocr"',
                        f'engine_dir = "{engines}"\nmetrics_port = {metrics_port}')
    text = text.replace("limit_side = 736", "limit_side = 320")
    models, pipeline = text.split("[[pipelines]]", 1)
    cold = pipeline.replace('name = "ocr"', 'name = "ocr_cold"').replace('model = "ppocr_rec"',
                                                                         'model = "ppocr_rec_cold"')
    tracked = (REPO / "etc/infermux/examples/tracked_ocr.toml").read_text().split("[[pipelines]]", 1)[1]
    tracked = tracked.replace("limit_side = 736", "limit_side = 320")
    return f"{models}{COLD}[[pipelines]]{pipeline}\n[[pipelines]]{cold}\n[[pipelines]]{tracked}\n{BROKEN}"


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models, fetched by the example's own script (from the installed wheel)."""
    return models.ppocr(tmp_path_factory.mktemp("ppocr"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    port = free_port()
    d = Daemon(tmp_path_factory.mktemp("ocr"), ocr_config(engines, port)).start(timeout=120)
    d.metrics_port = port  # type: ignore[attr-defined]
    yield d
    d.stop()


@pytest.fixture
def sock(daemon: Daemon) -> Iterator[zmq.Socket]:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(daemon.endpoint)
    yield s
    s.close()


def png(image: np.ndarray) -> bytes:
    return cv2.imencode(".png", image)[1].tobytes()


def ocr(daemon: Daemon, images: list[np.ndarray], model: str = "ocr", cameras: int = 4) -> list[Reply]:
    """Each image sent as PNG by one of `cameras` sockets sending one frame at a time."""
    def camera(index: int) -> list[tuple[int, Reply]]:
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(daemon.endpoint)
        try:
            return [(i, send_frame(s, model, png(images[i]), "png", timeout_s=120))
                    for i in range(index, len(images), cameras)]
        finally:
            s.close()
    with ThreadPoolExecutor(cameras) as pool:
        done = dict(pair for part in pool.map(camera, range(cameras)) for pair in part)
    return [done[i] for i in range(len(images))]


def compare(reply: Reply, reference: Any, tolerance: float = 3.0) -> tuple[list[str], list[str]]:
    """How the pipeline's regions differ from rapidocr's result: (real differences: a text, a box beyond
    `tolerance` px, a region missing; texts that differ only in spaces)."""
    ours = [(np.array(r["box"]), r["text"]) for r in reply.header["regions"]]
    theirs = [(np.array(box), text) for box, text, _ in (reference or [])]
    problems = [] if len(ours) == len(theirs) else [f"{len(ours)} regions, rapidocr {len(theirs)}"]
    spaces = []
    for box, text in theirs:
        if not ours:
            break
        near = min(ours, key=lambda o: float(np.abs(o[0] - box).max()))
        distance = float(np.abs(near[0] - box).max())
        if distance > tolerance or near[1].replace(" ", "") != text.replace(" ", ""):
            problems.append(f"{text!r} at {box.tolist()}: ours {near[1]!r}, {distance:.1f} px away")
        elif near[1] != text:
            spaces.append(f"{text!r}: ours {near[1]!r}")
    return problems, spaces


@pytest.mark.slow
def test_ocr_pipeline_reads_what_rapidocr_reads_on_generated_frames(daemon: Daemon) -> None:
    """Text for text and box for box, but for spaces: rapidocr pads each batch of up to 6 lines to
    its widest (at least 320 px), the pipeline a frame's lines to the widest, up to a multiple of
    32 px; the other padding (and the batch a line is merged into) can change where the recogniser
    reads a space: "INFERMUX camera" as "INFERMUXcamera"."""
    images = [camera_ocr.synthetic(seed) for seed in range(FRAMES)]
    replies = ocr(daemon, images)
    engine = rapidocr.RapidOCR(det_limit_side_len=320)
    problems, spaces, lines = {}, [], 0
    for seed, (image, reply) in enumerate(zip(images, replies)):
        assert reply.status == 200, reply.header
        found, spaced = compare(reply, engine(image)[0])
        if found:
            problems[seed] = found
        spaces += spaced
        lines += len(reply.header["regions"])
    print(f"{lines} text lines on {FRAMES} frames; differing from rapidocr only in spaces: {spaces}")
    assert lines >= FRAMES  # every frame has text
    assert not problems, problems
    assert len(spaces) <= lines // 20, spaces


def conveyor(seed: int, frames: int) -> list[np.ndarray]:
    """A frame's text lines moving up past the camera, 3 px a frame, always whole in view."""
    page = camera_ocr.synthetic(seed)
    canvas = cv2.copyMakeBorder(page, 30, 30, 0, 0, cv2.BORDER_REPLICATE)
    return [np.ascontiguousarray(canvas[42 - 3 * k:282 - 3 * k]) for k in range(frames)]


def test_tracked_ocr_reads_each_line_once_and_keeps_its_text_while_it_moves(sock: zmq.Socket) -> None:
    """etc/infermux/examples/tracked_ocr.toml: a line is read on its track's first frame (as the
    untracked pipeline reads it) and keeps that reading (cached) and its id on the next 8, which
    neither reach the 15 frames of `reinfer_every` nor change a box by the 30 % of `reinfer_growth`."""
    frames = conveyor(21, 9)
    replies = [send_frame(sock, "tracked_ocr", png(f), "png", key="conveyor", timeout_s=60) for f in frames]
    assert {r.status for r in replies} == {200}, [r.header for r in replies if r.status != 200]
    first = replies[0].header["regions"]
    assert first and all(r["cached"] is False for r in first)
    plain = send_frame(sock, "ocr", png(frames[0]), "png", timeout_s=60)
    assert sorted(r["text"] for r in first) == sorted(r["text"] for r in plain.header["regions"])
    texts = {r["track_id"]: r["text"] for r in first}
    for reply in replies[1:]:
        for region in reply.header["regions"]:
            assert region["track_id"] in texts, (region, texts)  # no line took a new id
            assert region["cached"] is True and region["text"] == texts[region["track_id"]], region


def test_a_cold_recogniser_serves_the_same_pipeline_after_a_503_with_retry_time(daemon: Daemon,
                                                                                 sock: zmq.Socket) -> None:
    image = camera_ocr.synthetic(7)
    first = send_frame(sock, "ocr_cold", png(image), "png", timeout_s=60)
    # A cold model loads on its first request: the frame is answered 503 at once, naming the step.
    assert first.status == 503, first.header
    assert "step 'rec'" in first.header["error"] and first.header["retry_after_ms"] > 0
    daemon.wait_for("loaded model=ppocr_rec_cold", timeout=60)
    hot, cold = send_frame(sock, "ocr", png(image), "png"), send_frame(sock, "ocr_cold", png(image), "png")
    assert cold.status == 200, cold.header
    assert [r["text"] for r in cold.header["regions"]] == [r["text"] for r in hot.header["regions"]]


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header says it is `width` x `height` (its data is a 1 x 1 image)."""
    data = bytearray(png(np.zeros((1, 1, 3), np.uint8)))
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize("data, fmt, geometry, status, words", [
    (b"not an image", "png", {}, 400, ["step 'decode'", "cannot decode"]),
    (bytes(100), "nv12", {"width": 16, "height": 16, "stride": 16}, 400, ["step 'decode'", "384"]),
    (png_declaring(20000, 20000), "png", {}, 413, ["step 'decode'", "20000x20000"]),
    (bytes(10), "webp", {}, 400, ["step 'decode'", "unknown format"]),
])
def test_bad_frames_are_refused_naming_the_step(sock: zmq.Socket, data: bytes, fmt: str, geometry: dict,
                                                status: int, words: list[str]) -> None:
    start = time.monotonic()
    reply = send_frame(sock, "ocr", data, fmt, **geometry)
    assert reply.status == status, reply.header
    assert all(w in reply.header["error"] for w in words), reply.header["error"]
    # Held back a moment: a client sending the same frame in a loop cannot keep the steps busy.
    assert time.monotonic() - start >= 0.1


def test_a_frame_without_a_format_or_asking_unknown_outputs_is_a_400(sock: zmq.Socket) -> None:
    from infermux.protocol import decode_reply, encode_request
    sock.send_multipart([b"", *encode_request("ocr", {"image": np.zeros(16, np.uint8)}, id="raw")])
    reply = decode_reply(sock.recv_multipart()[1:])
    assert reply.status == 400 and "\"format\"" in reply.header["error"]
    reply = send_frame(sock, "ocr", png(camera_ocr.synthetic(1)), "png", outputs=["decode.image"])
    assert reply.status == 400 and "model step" in reply.header["error"]


def test_a_frame_with_no_text_is_200_with_no_regions(sock: zmq.Socket) -> None:
    reply = send_frame(sock, "ocr", png(np.full((240, 320, 3), 200, np.uint8)), "png")
    assert reply.status == 200 and reply.header["regions"] == []


def test_a_model_steps_tensors_come_back_where_asked(sock: zmq.Socket) -> None:
    reply = send_frame(sock, "ocr", png(camera_ocr.synthetic(3)), "png", outputs=["det.sigmoid_0.tmp_0"])
    assert reply.status == 200
    assert reply.outputs["det.sigmoid_0.tmp_0"].shape[:2] == (1, 1)


def test_nv12_frames_read_like_the_png(sock: zmq.Socket) -> None:
    image = camera_ocr.synthetic(11)
    data, w, h = camera_ocr.to_nv12(image)
    raw = send_frame(sock, "ocr", data, "nv12", width=w, height=h, stride=w)
    assert raw.status == 200, raw.header
    assert raw.header["regions"], "no text found in the NV12 frame"


def test_a_processor_that_raises_is_a_500_for_that_request_only(daemon: Daemon, sock: zmq.Socket) -> None:
    reply = send_frame(sock, "broken", png(np.zeros((8, 8, 3), np.uint8)), "png")
    assert reply.status == 500 and "step 'buggy'" in reply.header["error"]
    assert "ZeroDivisionError" in reply.header["error"]
    assert send_frame(sock, "ocr", png(camera_ocr.synthetic(2)), "png").status == 200  # the daemon carries on
    with daemon.admin() as admin:
        views = {p["name"]: p for p in admin.call("pipelines")["pipelines"]}
    assert views["broken"]["frames"]["by_status"].get("500", 0) >= 1
    assert views["broken"]["steps"]["buggy"]["by_status"].get("500", 0) >= 1
    assert views["ocr"]["steps"]["rec"]["served"] >= 1 and views["ocr"]["steps"]["rec"]["p50_us"] > 0
    metrics = scrape(daemon.metrics_port)  # type: ignore[attr-defined]
    assert metrics['infermux_pipeline_frames_total{pipeline="broken",status="500"}'] >= 1
    assert metrics['infermux_pipeline_step_runs_total{pipeline="ocr",step="rec",status="200"}'] >= 1
    assert metrics['infermux_pipeline_step_duration_seconds_total{pipeline="ocr",step="rec"}'] > 0


def test_infer_sends_an_image_file_and_prints_the_texts(daemon: Daemon, tmp_path: Path) -> None:
    image = tmp_path / "frame.png"
    image.write_bytes(png(camera_ocr.synthetic(5)))
    out = subprocess.run([sys.executable, "-m", "infermux", "infer", "ocr", "--image", str(image),
                          "--endpoint", daemon.endpoint], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"regions"' in out.stdout and "score" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "infermux", "infer", "ocr", "--image", str(tmp_path / "x.gif"),
                          "--endpoint", daemon.endpoint], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.parametrize("steps, words", [
    ('[[pipelines.steps]]\nprocessor = "resize"\noptions = { mode = "sideways" }', ["steps[0]", "mode"]),
    ('[[pipelines.steps]]\nmodel = "nope"', ["steps[0].model", "unknown model 'nope'"]),
    ('[[pipelines.steps]]\nprocessor = "decode"\nmodel = "m"', ["either a `processor` or a `model`"]),
    ('[[pipelines.steps]]\nprocessor = "decode"\nfor_each = "pixels"', ["for_each", "regions"]),
])
def test_bad_pipeline_configs_name_the_pipeline_and_step(steps: str, words: list[str]) -> None:
    text = f'[[models]]\nname = "m"\nengine = "m.onnx"\n[[pipelines]]\nname = "p"\n{steps}\n'
    with pytest.raises(ConfigError) as error:
        parse(text, Path("/etc/infermux/x.toml"))
    assert all(w in str(error.value) for w in ["pipelines[0]", *words]), str(error.value)


def test_a_pipeline_may_not_take_a_models_name() -> None:
    text = '[[models]]\nname = "m"\nengine = "m.onnx"\n[[pipelines]]\nname = "m"\n[[pipelines.steps]]\nmodel = "m"\n'
    with pytest.raises(ConfigError, match="already a model's"):
        parse(text, Path("/etc/infermux/x.toml"))
