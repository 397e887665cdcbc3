"""The test cameras themselves: a real RTSP server (GStreamer's, its own process), a port that answers
garbage, and an HTTP MJPEG server — read by ffprobe and PyAV as a camera reader would read them.

The RTSP server's packages come through support.system_packages (installed under CI=true, else a skip
naming the command); ffprobe too.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from support import mjpeg, rtsp, system_packages
from support.polling import eventually

av = pytest.importorskip("av")
pytestmark = pytest.mark.slow
FPS = 15


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, rtsp.Clip]:
    rtsp.require_server()
    folder = tmp_path_factory.mktemp("clips")
    return {"640x360": rtsp.make_clip(folder, 640, 360, FPS, seconds=2),
            "1280x720": rtsp.make_clip(folder, 1280, 720, FPS, seconds=1)}


def read_frames(url: str, n: int, format: str | None = None, **options: str) -> list[av.VideoFrame]:
    """The first `n` decoded frames of `url`, as a camera reader takes them (PyAV, a bounded wait)."""
    with av.open(url, format=format, options=options, timeout=10) as container:
        frames = []
        for frame in container.decode(video=0):
            frames.append(frame)
            if len(frames) == n:
                return frames
    raise AssertionError(f"{url} ended after {len(frames)} frames")


def test_ffprobe_reads_frames_of_the_clips_size_from_the_rtsp_server(clips):
    system_packages.require(rtsp.FFMPEG_PACKAGES)
    with rtsp.serve(clips["640x360"]) as server:
        out = subprocess.run(["ffprobe", "-v", "error", "-rtsp_transport", "tcp", "-select_streams", "v",
                              "-count_frames", "-read_intervals", "%+#20", "-show_entries",
                              "stream=codec_name,width,height,nb_read_frames", "-of", "csv=p=0", server.url],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "h264,640,360,20"


def test_the_rtsp_server_sends_the_clip_in_real_time_and_loops_it(clips):
    clip = clips["1280x720"]
    with rtsp.serve(clip) as server:
        frames = read_frames(server.url, clip.frames * 2 + 5, rtsp_transport="tcp")
    assert {(f.width, f.height) for f in frames} == {(1280, 720)}
    # Timestamped when pushed: the spacing of presentation times is the server's pacing, not the reader's.
    # (The first frame may have none: RTP's timestamps map to time once the first sender report came.)
    spacing = np.diff([float(f.pts * f.time_base) for f in frames if f.pts is not None])
    assert np.median(spacing) == pytest.approx(1 / FPS, rel=0.2), spacing
    # Whole pictures of the scene the test made (no slice lost), and past the clip's end the same again.
    made = list(rtsp.scene(clip.width, clip.height, clip.frames, clip.fps))
    for i in (0, clip.frames // 2, clip.frames, clip.frames * 2 - 1):
        got, other = frames[i].to_ndarray(format="bgr24"), made[(i + clip.frames // 2) % clip.frames]
        assert _diff(got, made[i % clip.frames]) < min(8.0, _diff(got, other)), i


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b).mean())


def test_a_stopped_server_refuses_and_comes_back_on_the_same_port(clips):
    with rtsp.serve(clips["640x360"]) as server:
        port = server.port
        assert len(read_frames(server.url, 5)) == 5
        server.stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        server.start()
        assert server.port == port
        assert [f.width for f in read_frames(server.url, 5, rtsp_transport="tcp")] == [640] * 5


def test_the_server_ends_when_its_starter_is_gone(clips):
    server = rtsp.RtspServer(clips["640x360"])
    server.start()
    process = server.process
    assert process is not None and process.stdin is not None
    process.stdin.close()  # as when the test's process dies: the pipe's other end closes
    try:
        eventually(lambda: process.poll() is not None, "the server to exit on its own", timeout_s=20)
    finally:
        server.stop()


def test_a_port_that_answers_garbage_fails_a_reader_without_a_frame():
    with rtsp.garbage() as port:
        with pytest.raises(av.InvalidDataError):
            read_frames(f"rtsp://127.0.0.1:{port}/cam", 1, rtsp_transport="tcp")


def test_the_mjpeg_server_streams_jpeg_frames_at_its_size(tmp_path: Path):
    with mjpeg.serve(320, 180, fps=FPS, seconds=1) as server:
        frames = read_frames(server.url, 20, format="mpjpeg")
        with pytest.raises(av.HTTPNotFoundError):
            read_frames(server.url.replace("video.mjpg", "other"), 1)
    assert {(f.width, f.height) for f in frames} == {(320, 180)}
    assert frames[0].format.name.startswith("yuvj")
