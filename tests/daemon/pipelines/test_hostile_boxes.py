"""What a detector's boxes and a JPEG's scans may cost, bounded before the work (docs/pipelines.md#bounds).

A real daemon serves tests/support/models.py's box echo, a "detector" whose
boxes are its frame's pixels: a raw gray frame of a few bytes, scaled by
`normalize`, is a box of 40,000 x 40,000 pixels, or one whose corners are
NaN (an infinity minus an infinity). `crop` must refuse the first from the
box, before it allocates the crop; the pipeline must drop the second with a
count, through `track` into `crop`, and answer the rest of the frame. A
progressive JPEG of thousands of empty scans is refused from its markers
before it is decoded, and a frame whose decoding would outlast its request's
deadline is answered 504 without being decoded. Meanwhile a plain model
client is answered as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import zmq

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models  # noqa: E402
from support.harness import DAEMON_HEAD, Daemon, dealer  # noqa: E402
from support.hostile_files import progressive_jpeg_with_scans  # noqa: E402
from support.procfs import peak_rss_mib, reset_peak  # noqa: E402

from infermux.client import Client  # noqa: E402
from infermux.pipelines.wire import send_frame  # noqa: E402

# Each pixel of the frame times `scale` is one number of a box: cx, cy, w, h, score per box in turn.
MODELS = """
[[models]]
name = "echo"
engine = "{echo}"

[[models]]
name = "addone"
engine = "addone/1/model.onnx"
"""
PIPELINES = "".join((
    models.box_echo_pipeline("boxes", "200.0"),
    models.box_echo_pipeline("infinite", "1e38", track=True),
    models.box_echo_pipeline("regions", "1.0", head="max_batch_bytes = 10000\n", crop="rectify = false",
                             tail='[[pipelines.steps]]\nprocessor = "resize"\nfor_each = "regions"\n'
                                  'options = { size = [64, 64] }\n'),
)) + """
[[pipelines]]
name = "frames"
[[pipelines.steps]]
processor = "decode"

[[pipelines]]
name = "scans"
[[pipelines.steps]]
processor = "decode"
options = { max_scans = 1000 }
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    work = tmp_path_factory.mktemp("boxes")
    echo = models.box_echo(work / "echo/1/model.onnx")
    d = Daemon(work, DAEMON_HEAD.format(engines=engines) + MODELS.format(echo=echo) + PIPELINES).start()
    yield d
    assert d.stop() == 0, d.log()[-3000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]


@pytest.fixture
def sock(daemon: Daemon) -> Iterator[zmq.Socket]:
    with dealer(daemon.endpoint) as s:
        yield s


def boxes_frame(*boxes: tuple[int, int, int, int, int]) -> np.ndarray:
    """A one-row gray frame the echo model reads as `boxes` (cx, cy, w, h, score, each a byte)."""
    return np.array(boxes, np.uint8).T.reshape(1, -1)


def pipeline_view(daemon: Daemon, name: str) -> dict:
    with daemon.admin() as admin:
        return next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == name)


def answered_by_the_model(daemon: Daemon) -> bool:
    with Client(daemon.endpoint, timeout_s=10) as client:
        return client.infer("addone", {"x": np.zeros((1, 4), np.float32)}).status == 200


@pytest.mark.parametrize("side", [40000, 8000])
def test_a_box_far_larger_than_its_frame_is_refused_before_it_is_cropped(
        daemon: Daemon, sock: zmq.Socket, side: int) -> None:
    assert daemon.proc is not None
    frame = boxes_frame((side // 400, side // 400, side // 200, side // 200, 1))  # x 200: the box's pixels
    reset_peak(daemon.proc.pid)
    before = peak_rss_mib(daemon.proc.pid)
    reply = send_frame(sock, "boxes", frame, "gray", width=5, height=1, timeout_ms=20_000)
    assert reply.status == 413, reply.header
    assert f"step 'crop': region 0's box would crop to {side}x{side} from a 5x1 frame" in reply.header["error"]
    assert "(max_scale)" in reply.header["error"]
    # Cropped, the 8000 x 8000 box alone was 183 MiB; the 40,000 one had the daemon killed for memory.
    assert peak_rss_mib(daemon.proc.pid) - before < 32, f"peak RSS grew {peak_rss_mib(daemon.proc.pid) - before} MiB"
    assert answered_by_the_model(daemon)


def test_a_box_within_its_frame_is_cropped(sock: zmq.Socket) -> None:
    frame = boxes_frame((0, 0, 0, 0, 1))  # a box of 0 x 0 at the origin, scored 200: a 1 x 1 crop
    reply = send_frame(sock, "boxes", frame, "gray", width=5, height=1)
    assert reply.status == 200, reply.header
    assert [r["box"] for r in reply.header["regions"]] == [[[0.0, 0.0]] * 4]


def test_what_a_per_region_step_makes_for_all_of_a_frames_regions_is_bounded(sock: zmq.Socket) -> None:
    # Three small boxes, each stretched to 64 x 64 (4,096 bytes): the third is over max_batch_bytes (10,000).
    frame = boxes_frame((10, 0, 4, 4, 1), (30, 0, 4, 4, 1), (50, 0, 4, 4, 1))
    reply = send_frame(sock, "regions", frame, "gray", width=15, height=1)
    assert reply.status == 413, reply.header
    assert "step 'resize': made 12288 bytes for the frame's regions so far" in reply.header["error"]
    assert "(max_batch_bytes)" in reply.header["error"]
    two = send_frame(sock, "regions", boxes_frame((10, 0, 4, 4, 1), (30, 0, 4, 4, 1)), "gray", width=10, height=1)
    assert two.status == 200 and len(two.header["regions"]) == 2, two.header


def test_a_nan_box_is_dropped_and_counted_and_the_frame_is_answered(daemon: Daemon, sock: zmq.Socket) -> None:
    dropped = pipeline_view(daemon, "infinite")["dropped_regions"]
    # Box 0: cx and w are 255 x 1e38, infinity in float32, so its left edge is inf - inf (NaN).
    # Box 1: all zeros but its score, a box at the origin.
    frame = boxes_frame((255, 0, 255, 0, 1), (0, 0, 0, 0, 1))
    reply = send_frame(sock, "infinite", frame, "gray", width=10, height=1, key="cam-nan")
    assert reply.status == 200, reply.header
    assert reply.header["dropped_regions"] == 1
    assert [r["box"] for r in reply.header["regions"]] == [[[0.0, 0.0]] * 4]
    assert pipeline_view(daemon, "infinite")["dropped_regions"] == dropped + 1
    again = send_frame(sock, "infinite", frame, "gray", width=10, height=1, key="cam-nan")  # the track goes on
    assert again.status == 200 and again.header["dropped_regions"] == 1, again.header
    assert "Traceback" not in daemon.log()


def test_a_jpeg_of_thousands_of_scans_is_refused_from_its_markers_and_then_from_memory(
        daemon: Daemon, sock: zmq.Socket) -> None:
    data = progressive_jpeg_with_scans(2048, 2000)
    assert len(data) < 40_000
    recalled = pipeline_view(daemon, "frames")["refused_from_memory"]
    first = send_frame(sock, "frames", data, "jpeg", timeout_ms=60_000)  # decoded, it took 6 s on the 2-core box
    assert first.status == 413, first.header
    assert "the JPEG has more than 100 scans (max_scans)" in first.header["error"]
    again = send_frame(sock, "frames", data, "jpeg", timeout_ms=60_000)
    assert again.status == 413 and "is not computed again" in again.header["error"], again.header
    assert pipeline_view(daemon, "frames")["refused_from_memory"] == recalled + 1
    assert answered_by_the_model(daemon)


def test_a_frame_whose_decoding_would_outlast_its_deadline_is_not_decoded(daemon: Daemon, sock: zmq.Socket) -> None:
    # 996 scans, under this step's max_scans: at least 1,350 ms by its estimate.
    data = progressive_jpeg_with_scans(8192, 990)
    before = pipeline_view(daemon, "scans")
    replies = [send_frame(sock, "scans", data, "jpeg", timeout_ms=1000) for _ in range(2)]
    for reply in replies:
        assert reply.status == 504, reply.header
        assert "8192x8192 frame of 996 scan(s) would take at least 1350 ms; the frame's deadline is" \
            in reply.header["error"], reply.header["error"]
    after = pipeline_view(daemon, "scans")
    assert after["refused_from_memory"] == before["refused_from_memory"]  # the request's time, not the frame
    assert after["steps"]["decode"]["by_status"].get("504", 0) == before["steps"]["decode"]["by_status"].get("504", 0) + 2
