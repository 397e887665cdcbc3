"""An HTTP MJPEG camera for tests: multipart/x-mixed-replace JPEG frames on 127.0.0.1, in a thread.

    with mjpeg.serve(640, 360, fps=15) as server:
        server.url                                   # http://127.0.0.1:PORT/video.mjpg

Each client gets the frames of `support.rtsp.scene` (JPEG-encoded once, looped) at `fps` in real
time, as an IP camera's MJPEG endpoint sends them; any other path answers 404. The server and its
client threads end when the block does.
"""

from __future__ import annotations

import contextlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

from support.rtsp import scene

BOUNDARY = "infermuxframe"
PATH = "/video.mjpg"


class MjpegServer(ThreadingHTTPServer):
    """The HTTP server: its JPEG frames, their rate, and the event that ends every client's stream."""

    daemon_threads = True

    def __init__(self, jpegs: list[bytes], fps: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.jpegs, self.interval, self.closing = jpegs, 1.0 / fps, threading.Event()

    @property
    def url(self) -> str:
        """The camera's address."""
        return f"http://127.0.0.1:{self.server_address[1]}{PATH}"


class _Handler(BaseHTTPRequestHandler):
    server: MjpegServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != PATH:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        start, n, jpegs = time.monotonic(), 0, self.server.jpegs
        while not self.server.closing.is_set():
            jpeg = jpegs[n % len(jpegs)]
            part = (f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n").encode()
            try:
                self.wfile.write(part + jpeg + b"\r\n")
            except OSError:
                return  # the client left
            n += 1
            self.server.closing.wait(max(0.0, start + n * self.server.interval - time.monotonic()))

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a test's output is not the place for an access log."""


@contextlib.contextmanager
def serve(width: int, height: int, fps: int = 15, seconds: float = 2.0, quality: int = 80) -> Iterator[MjpegServer]:
    """A running MJPEG server of a generated scene, closed (with its clients' streams) at the end."""
    import cv2

    jpegs = [cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])[1].tobytes()
             for image in scene(width, height, max(1, round(seconds * fps)), fps)]
    server = MjpegServer(jpegs, fps)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="mjpeg", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
