"""A real RTSP camera for tests: H.264 the test makes, served by GStreamer's RTSP server in its own process.

    clip = rtsp.make_clip(tmp_path, 640, 360, fps=15)         # a generated clip: moving shapes, noise, a counter
    with rtsp.serve(clip) as server:                          # /usr/bin/python3 tests/support/gst/rtsp_serve.py
        url = server.url                                      # rtsp://127.0.0.1:PORT/cam
        server.stop(); server.start()                         # an outage: the same port again
    with rtsp.garbage() as port: ...                          # a port that answers with bytes that are not RTSP
    with rtsp.silent() as port: ...                           # a port that connects and never answers

The server needs Debian's python3-gi and gst-rtsp-server with the plugins it uses (appsrc,
rtph264pay): `require_server()` installs them in CI and skips elsewhere, naming the command
(support.system_packages). Clips are encoded once per size, rate and length with PyAV's libx264, as a
camera encodes: no B-frames, one slice a frame, an IDR frame every second with its parameter sets, a
bitrate of about a quarter of a bit per pixel; `slices` makes the multi-slice frames of encoders that cut a
frame in several NAL units (FFmpeg's RTSP demuxer hands a reader each slice as a packet of its own).
"""

from __future__ import annotations

import contextlib
import platform
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import numpy as np

from support import system_packages

SERVE = Path(__file__).resolve().parent / "gst" / "rtsp_serve.py"
DECODE = Path(__file__).resolve().parent / "gst" / "decode.py"
DEBIAN_PYTHON = "/usr/bin/python3"
_LIB = f"/usr/lib/{platform.machine()}-linux-gnu"
# What the server needs (a file -> its Debian package).
SERVER_PACKAGES = {
    DEBIAN_PYTHON: "python3",
    "/usr/lib/python3/dist-packages/gi/__init__.py": "python3-gi",
    f"{_LIB}/girepository-1.0/GstRtspServer-1.0.typelib": "gir1.2-gst-rtsp-server-1.0",
    f"{_LIB}/gstreamer-1.0/libgstapp.so": "gstreamer1.0-plugins-base",
    f"{_LIB}/gstreamer-1.0/libgstrtp.so": "gstreamer1.0-plugins-good",
}
# What a GStreamer client decoding RTSP needs beyond the server's (tests/support/gst/decode.py).
CLIENT_PACKAGES = {
    f"{_LIB}/gstreamer-1.0/libgstrtsp.so": "gstreamer1.0-plugins-good",
    f"{_LIB}/gstreamer-1.0/libgstlibav.so": "gstreamer1.0-libav",
    f"{_LIB}/gstreamer-1.0/libgstvideoparsersbad.so": "gstreamer1.0-plugins-bad",
}
FFMPEG_PACKAGES = {"ffmpeg": "ffmpeg", "ffprobe": "ffmpeg"}
START_TIMEOUT_S = 30


def require_server() -> None:
    """Make the RTSP server runnable here: install its packages in CI, else skip the test."""
    system_packages.require(SERVER_PACKAGES)


@dataclass(frozen=True)
class Clip:
    """An encoded clip: its file (length-prefixed access units), frame size, rate and frame count."""

    path: Path
    width: int
    height: int
    fps: int
    frames: int


def scene(width: int, height: int, n: int, fps: int, seed: int = 0, moving: bool = True) -> Iterator[np.ndarray]:
    """`n` BGR frames of a camera-like scene: a textured background with sensor noise, shapes moving
    across it at different speeds, and the frame's time written in one corner; not `moving`: the same
    shapes standing still and no time (only the noise changes)."""
    import cv2

    rng = np.random.default_rng(seed)
    small = rng.integers(40, 200, size=(max(2, height // 24), max(2, width // 24), 3), dtype=np.uint8)
    background = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    shapes = [(rng.uniform(0, width), rng.uniform(0, height), rng.uniform(-4, 4) * width / 320,
               rng.uniform(-2, 2) * height / 180, int(rng.integers(8, 24) * width / 640),
               tuple(int(c) for c in rng.integers(0, 255, 3))) for _ in range(6)]
    # Sensor noise: a few fields drawn once, taken in turn (drawing one per frame costs more than the rest).
    noise = [rng.normal(0, 3, size=(height, width, 3)).astype(np.int16) for _ in range(min(n, 5))]
    for i in range(n):
        frame = background.copy()
        for x, y, dx, dy, r, colour in shapes:
            t = i if moving else 0
            cx, cy = int((x + dx * t) % width), int((y + dy * t) % height)
            cv2.circle(frame, (cx, cy), r, colour, -1) if r % 2 else cv2.rectangle(
                frame, (cx - r, cy - r), (cx + r, cy + r), colour, -1)
        if moving:
            cv2.putText(frame, f"{i / fps:6.2f}", (8, height - 12), cv2.FONT_HERSHEY_SIMPLEX, height / 360,
                        (255, 255, 255), 2)
        yield cv2.add(frame, noise[i % len(noise)], dtype=cv2.CV_8U)


def make_clip(folder: Path, width: int, height: int, fps: int = 15, seconds: float = 2.0, moving: bool = True,
              slices: int = 1) -> Clip:
    """Encode (once per size, rate, length, motion and slicing in `folder`) a looping clip of `scene` to
    H.264; `slices` > 1 cuts each frame into that many slices, each its own NAL unit (as encoders with
    slice threads do), and makes every frame a key frame, so that each is large enough for its slices to
    travel in RTP packets of their own."""
    import av

    frames = max(1, round(seconds * fps))
    sliced = f"-{slices}slices" if slices > 1 else ""
    path = folder / f"clip-{width}x{height}-{fps}fps-{frames}{'' if moving else '-still'}{sliced}.h264au"
    if not path.exists():
        codec = av.CodecContext.create("libx264", "w")
        codec.width, codec.height, codec.pix_fmt = width, height, "yuv420p"
        codec.time_base, codec.framerate = Fraction(1, fps), Fraction(fps, 1)
        codec.bit_rate = int(0.25 * width * height * fps)
        keyint = 1 if slices > 1 else fps
        codec.gop_size, codec.max_b_frames = keyint, 0
        codec.options = {"preset": "veryfast", "x264-params": f"keyint={keyint}:min-keyint={keyint}:scenecut=0:"
                         f"repeat-headers=1:sliced-threads=0:slices={slices}"}
        units: list[bytes] = []
        for i, image in enumerate(scene(width, height, frames, fps, moving=moving)):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24").reformat(format="yuv420p")
            frame.pts = i
            units += [bytes(p) for p in codec.encode(frame)]
        units += [bytes(p) for p in codec.encode(None)]
        partial = path.with_suffix(".part")
        partial.write_bytes(b"".join(struct.pack(">I", len(u)) + u for u in units))
        partial.rename(path)
    return Clip(path, width, height, fps, frames)


class RtspServer:
    """tests/support/gst/rtsp_serve.py serving `clip` on 127.0.0.1; stopped and started again on one port."""

    def __init__(self, clip: Clip, port: int = 0, path: str = "/cam") -> None:
        self.clip, self.port, self.path = clip, port, path
        self.process: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    @property
    def url(self) -> str:
        """The camera's address."""
        return f"rtsp://127.0.0.1:{self.port}{self.path}"

    def start(self) -> None:
        """Start the server (on the port it had before, once it had one) and wait until it listens."""
        assert self.process is None, "already running"
        c = self.clip
        cmd = [DEBIAN_PYTHON, str(SERVE), "--clip", str(c.path), "--width", str(c.width), "--height",
               str(c.height), "--fps", str(c.fps), "--port", str(self.port), "--path", self.path]
        # stdin stays open to the server: it stops when this process is gone, however that happened.
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        line = _first_line(self.process, START_TIMEOUT_S)
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the RTSP server did not start: {line}{''.join(self.log)[-2000:]}")
        self.port = int(line.split()[1])
        threading.Thread(target=self._drain, args=(self.process,), daemon=True).start()

    def _drain(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.log.append(line)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL): its clients see the connection end."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> RtspServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The process's first line of output, or what it said before it exited or went quiet."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(process.stdout.readline() if process.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    return got[0] if got else f"nothing within {timeout_s} s"


@contextlib.contextmanager
def serve(clip: Clip, port: int = 0, path: str = "/cam") -> Iterator[RtspServer]:
    """A running RTSP server for `clip` (skipped without its packages), stopped at the end."""
    require_server()
    with RtspServer(clip, port, path) as server:
        yield server


@contextlib.contextmanager
def garbage(payload: bytes = b"\x00\xffNOT RTSP\r\n" * 64) -> Iterator[int]:
    """A port on 127.0.0.1 that answers every connection with `payload` (no RTSP), then closes it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (socket.timeout, OSError):
                continue
            with conn, contextlib.suppress(OSError):
                conn.sendall(payload)

    thread = threading.Thread(target=answer, name="garbage-rtsp", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@contextlib.contextmanager
def silent() -> Iterator[int]:
    """A port on 127.0.0.1 that takes connections (the kernel completes them) and never says a word."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        yield listener.getsockname()[1]
