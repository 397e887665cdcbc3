"""Frames that lie about their size, against a real daemon's `decode` step (docs/pipelines.md#decode).

The files are made here: a few hundred bytes of JPEG or PNG whose header
declares tens of thousands of pixels a side, laid out so that a parser
that reads only the first bytes, or the first chunk at a fixed offset,
misses the size. Each must be refused by its header, before OpenCV
allocates the frame: the daemon's peak RSS (VmHWM, /proc) stays flat.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import zmq

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support.harness import DAEMON_HEAD, Daemon, dealer  # noqa: E402
from support.hostile_files import (jpeg_with_big_app_segment, jpeg_with_fill_byte,  # noqa: E402
                                   png_with_a_chunk_before_ihdr, ppm_named_jpeg)
from support.procfs import peak_rss_mib, reset_peak  # noqa: E402

from infermux.pipelines.wire import send_frame  # noqa: E402

DECODE_ONLY = """
[[models]]
name = "fast512"
engine = "fast512/1/model.onnx"

[[pipelines]]
name = "frames"
[[pipelines.steps]]
processor = "decode"
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("frames"), (DAEMON_HEAD + DECODE_ONLY).format(engines=engines)).start()
    yield d
    assert d.stop() == 0, d.log()[-3000:]


@pytest.fixture
def sock(daemon: Daemon) -> Iterator[zmq.Socket]:
    with dealer(daemon.endpoint) as s:
        yield s


@pytest.mark.parametrize("data, fmt, status, words", [
    (jpeg_with_fill_byte(), "jpeg", 413, ["frame 32768x32000 is over the 67108864 pixels"]),
    (jpeg_with_big_app_segment(), "jpeg", 413, ["frame 20000x20000 is over"]),
    (jpeg_with_big_app_segment(9000, 9000), "jpeg", 413, ["frame 9000x9000 is over"]),
    (png_with_a_chunk_before_ihdr(), "png", 400, ["cannot decode", "first chunk is b'tEXt'"]),
    (ppm_named_jpeg(), "jpeg", 400, ["cannot decode", "neither a PNG nor a JPEG"]),
], ids=["jpeg-fill-byte", "jpeg-sof-past-64k", "jpeg-just-over", "png-chunk-before-ihdr", "ppm-as-jpeg"])
def test_a_frame_that_lies_about_its_size_is_refused_before_anything_is_allocated(
        daemon: Daemon, sock: zmq.Socket, data: bytes, fmt: str, status: int, words: list[str]) -> None:
    assert daemon.proc is not None
    pid = daemon.proc.pid
    reset_peak(pid)
    before = peak_rss_mib(pid)
    reply = send_frame(sock, "frames", data, fmt)
    assert reply.status == status, reply.header
    assert all(w in reply.header["error"] for w in words), reply.header["error"]
    # A decoded 9000 x 9000 frame alone is 232 MiB; the one with a fill byte was 6 GiB before.
    assert peak_rss_mib(pid) - before < 32, f"peak RSS grew {peak_rss_mib(pid) - before:.0f} MiB"


def test_a_real_frame_still_decodes(sock: zmq.Socket) -> None:
    frame = cv2.imencode(".jpg", np.full((48, 64, 3), 200, np.uint8))[1].tobytes()
    assert send_frame(sock, "frames", frame, "jpeg").status == 200
    frame = cv2.imencode(".png", np.full((48, 64, 3), 200, np.uint8))[1].tobytes()
    assert send_frame(sock, "frames", frame, "png").status == 200

