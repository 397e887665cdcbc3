"""What one frame may cost the OCR example, bounded before the work (docs/pipelines.md#bounds).

The shipped etc/infermux/examples/ocr.toml, served as it is (only its
engine_dir moved), against frames drawn with Pillow the way an attacker
would: 1,000 tiny "AB" tokens (each a text region), a long line of tiny
text that every crop of its frame is padded to, a blank 8192 x 8192 PNG,
a frame whose short side the detector scales up. Each is refused with 413
naming the bound, before the recogniser runs; the daemon's peak RSS
(VmHWM, /proc) is read around each. A frame whose deadline passes inside
a step is not carried into the next one. The same refused frame sent
again is refused from memory, without running a step.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterator

import pytest
import zmq

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")
pytest.importorskip("PIL", reason="the frames are drawn with Pillow")
from PIL import Image  # noqa: E402

from support import models  # noqa: E402
from support.harness import REPO, Daemon, dealer, free_port  # noqa: E402
from support.metrics import scrape  # noqa: E402
from support.hostile_files import blank_png, drawn  # noqa: E402
from support.procfs import peak_rss_mib, reset_peak, rss_mib  # noqa: E402

from infermux.pipelines.wire import send_frame  # noqa: E402

SLEEPY = """
[[pipelines]]
name = "sleepy"
timeout_ms = 200
[[pipelines.steps]]
processor = "decode"
[[pipelines.steps]]
name = "slow"
processor = "sleep_processor:Sleep"
options = { seconds = 0.6 }
[[pipelines.steps]]
name = "after"
processor = "resize"
options = { size = [8, 8] }
"""


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.ppocr(tmp_path_factory.mktemp("ppocr"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    text = (REPO / "etc/infermux/examples/ocr.toml").read_text()
    port = free_port()
    text = text.replace('engine_dir = "../../../engines/ppocr"', f'engine_dir = "{engines}"\nmetrics_port = {port}')
    d = Daemon(tmp_path_factory.mktemp("bounds"), text + SLEEPY).start(timeout=120)
    d.metrics_port = port  # type: ignore[attr-defined]
    yield d
    assert d.stop() == 0, d.log()[-3000:]


@pytest.fixture
def sock(daemon: Daemon) -> Iterator[zmq.Socket]:
    with dealer(daemon.endpoint) as s:
        yield s


def _runs(daemon: Daemon, step: str) -> int:
    with daemon.admin() as admin:
        ocr = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "ocr")
    return sum(ocr["steps"][step]["by_status"].values())


@pytest.mark.parametrize("frame, step, words", [
    (lambda: drawn(25, 40), "dbnet", ["regions in the frame; the pipeline takes at most 300 (max_regions)"]),
    (lambda: drawn(3, 4, line=150), "rec", ["wide;", "at most 4096 (max_crop_width)"]),
    (lambda: drawn(10, 25, line=60), "rec", ["251 tensor(s) would be", "the limit is 134217728 (max_batch_bytes)"]),
], ids=["1000-tokens", "a-long-thin-line", "many-crops-padded-wide"])
def test_a_frame_over_a_pipeline_bound_is_refused_before_the_recogniser_runs(
        daemon: Daemon, sock: zmq.Socket, frame, step: str, words: list[str]) -> None:
    assert daemon.proc is not None
    pid = daemon.proc.pid
    rec_before = _runs(daemon, "rec")
    reset_peak(pid)
    before = rss_mib(pid)
    # The frame's deadline is far off: on a busy box the detector alone may take the example's 10 s.
    reply = send_frame(sock, "ocr", frame(), "png", timeout_s=120, timeout_ms=110_000)
    assert reply.status == 413, reply.header
    assert f"step '{step}'" in reply.header["error"] and all(w in reply.header["error"] for w in words), \
        reply.header["error"]
    # Unbounded, 1,000 tokens took the recogniser 23 s and the daemon to 2.9 GB (2.7 GB above this).
    assert peak_rss_mib(pid) - before < 1024, f"peak {peak_rss_mib(pid):.0f} MiB, {before:.0f} before"
    assert _runs(daemon, "rec") == rec_before + (step == "rec")  # refused at its door, not computed


def test_a_blank_8192_square_png_is_refused_by_its_header(daemon: Daemon, sock: zmq.Socket) -> None:
    data = blank_png(8192, 8192)
    assert len(data) < 300_000
    assert daemon.proc is not None
    reset_peak(daemon.proc.pid)
    before = rss_mib(daemon.proc.pid)
    reply = send_frame(sock, "ocr", data, "png", timeout_s=60)
    assert reply.status == 413 and "frame 8192x8192 is over the 4194304 pixels" in reply.header["error"]
    assert peak_rss_mib(daemon.proc.pid) - before < 64


def test_a_frame_the_detector_would_scale_past_max_side_is_refused(sock: zmq.Socket) -> None:
    # Its short side (600) is scaled up to 736, so its long side to 2453: over the example's 2048.
    reply = send_frame(sock, "ocr", blank_png(2000, 600), "png", timeout_s=60)
    assert reply.status == 413, reply.header
    assert "step 'det_resize'" in reply.header["error"] and "(max_side)" in reply.header["error"]
    assert "2000x600 frame would be resized to 2464x736" in reply.header["error"]
    assert "scaled up to 736" in reply.header["error"] and "smaller frame" not in reply.header["error"]


def test_a_frame_within_the_bounds_is_read(sock: zmq.Socket) -> None:
    reply = send_frame(sock, "ocr", drawn(3, 4), "png", timeout_s=60, timeout_ms=55_000)
    assert reply.status == 200, reply.header
    assert len(reply.header["regions"]) == 12 and {r["text"] for r in reply.header["regions"]} == {"AB"}


def _refused_from_memory(daemon: Daemon) -> int:
    with daemon.admin() as admin:
        return next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "ocr")["refused_from_memory"]


def test_the_same_refused_frame_again_is_refused_from_memory_and_a_changed_one_is_computed(
        daemon: Daemon, sock: zmq.Socket) -> None:
    frame = drawn(24, 40)  # 960 tokens, over max_regions once the detector has run
    same_pixels = io.BytesIO()
    Image.open(io.BytesIO(frame)).save(same_pixels, "PNG", compress_level=1)  # other bytes, the same image
    assert same_pixels.getvalue() != frame
    det, recalled = _runs(daemon, "det"), _refused_from_memory(daemon)

    first = send_frame(sock, "ocr", frame, "png", timeout_s=120, timeout_ms=110_000)
    again = send_frame(sock, "ocr", frame, "png", timeout_s=120, timeout_ms=110_000)
    assert first.status == again.status == 413, (first.header, again.header)
    assert again.header["error"].startswith(first.header["error"])
    assert "is not computed again for another" in again.header["error"]
    assert _runs(daemon, "det") == det + 1  # the detector ran for the first only
    assert _refused_from_memory(daemon) == recalled + 1
    metrics = scrape(daemon.metrics_port)  # type: ignore[attr-defined]
    assert metrics['infermux_pipeline_refused_from_memory_total{pipeline="ocr"}'] == recalled + 1

    other = send_frame(sock, "ocr", same_pixels.getvalue(), "png", timeout_s=120, timeout_ms=110_000)
    assert other.status == 413 and "(max_regions)" in other.header["error"], other.header
    assert "refused" not in other.header["error"].partition("(max_regions)")[2]  # computed, not recalled
    assert _runs(daemon, "det") == det + 2


def test_a_frame_past_its_deadline_is_not_carried_into_the_next_step(daemon: Daemon, sock: zmq.Socket) -> None:
    frame = io.BytesIO()
    Image.new("RGB", (16, 16)).save(frame, "PNG")
    reply = send_frame(sock, "sleepy", frame.getvalue(), "png", timeout_s=30)
    assert reply.status == 504, reply.header
    assert "step 'after': the frame's deadline passed" in reply.header["error"]
    with daemon.admin() as admin:
        sleepy = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "sleepy")
    assert sleepy["steps"]["slow"]["by_status"] == {"200": 1}
    assert sum(sleepy["steps"]["after"]["by_status"].values()) == 0  # never started

