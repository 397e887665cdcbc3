"""An RTSP server for the tests, as a camera is one: GStreamer's gst-rtsp-server in its own process.

    /usr/bin/python3 rtsp_serve.py --clip CLIP --width 640 --height 360 --fps 15 [--port 0] [--path /cam]

Run by Debian's python3 (python3-gi, gir1.2-gst-rtsp-server-1.0; tests/support/rtsp.py starts it): it
imports nothing but the standard library and gi. CLIP holds H.264 access units made by the test
(tests/support/rtsp.py `make_clip`), each a 4-byte big-endian length and its bytes. Every client gets its
own media: the clip from its first (IDR) frame, looped, pushed at `fps` in real time and timestamped
when pushed, as a live camera's encoder does. Listens on 127.0.0.1 only and prints `port N` once it
does. It stops on SIGTERM, SIGINT, or when its standard input closes (the test that started it is gone).
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import sys
import threading
import time
from pathlib import Path

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def read_clip(path: Path) -> list[bytes]:
    """The access units of a length-prefixed clip file."""
    data, units, at = path.read_bytes(), [], 0
    while at + 4 <= len(data):
        (size,) = struct.unpack_from(">I", data, at)
        units.append(data[at + 4:at + 4 + size])
        at += 4 + size
    if not units:
        raise SystemExit(f"{path}: no access unit")
    return units


class Feeder:
    """Pushes the clip into one media's appsrc at `fps`, looping, until the media goes."""

    def __init__(self, appsrc: Gst.Element, units: list[bytes], fps: float) -> None:
        self.appsrc, self.units, self.interval = appsrc, units, 1.0 / fps
        self.wanted, self.stopped = threading.Event(), threading.Event()
        appsrc.connect("need-data", lambda *_: self.wanted.set())
        threading.Thread(target=self.run, name="feeder", daemon=True).start()

    def run(self) -> None:
        # A live source sends nothing before the pipeline plays: need-data says it does.
        while not self.wanted.wait(0.1):
            if self.stopped.is_set():
                return
        start, n = time.monotonic(), 0
        while not self.stopped.is_set():
            delay = start + n * self.interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            buffer = Gst.Buffer.new_wrapped(self.units[n % len(self.units)])
            if self.appsrc.emit("push-buffer", buffer) != Gst.FlowReturn.OK:
                return  # the media was torn down (the client left)
            n += 1


def serve(args: argparse.Namespace) -> None:
    """Listen, print the port, and run until told to stop."""
    Gst.init(None)
    units = read_clip(Path(args.clip))
    caps = (f"video/x-h264,stream-format=byte-stream,alignment=au,width={args.width},height={args.height},"
            f"framerate={args.fps}/1")
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(f'( appsrc name=src is-live=true do-timestamp=true format=time caps="{caps}" '
                       "! rtph264pay name=pay0 pt=96 config-interval=-1 )")
    factory.set_shared(False)
    feeders: list[Feeder] = []

    def configure(_factory: GstRtspServer.RTSPMediaFactory, media: GstRtspServer.RTSPMedia) -> None:
        feeder = Feeder(media.get_element().get_by_name_recurse_up("src"), units, args.fps)
        media.connect("unprepared", lambda *_: feeder.stopped.set())
        feeders[:] = [f for f in feeders if not f.stopped.is_set()] + [feeder]

    factory.connect("media-configure", configure)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    server.get_mount_points().add_factory(args.path, factory)
    if server.attach(None) == 0:
        raise SystemExit(f"cannot listen on 127.0.0.1:{args.port}")
    loop = GLib.MainLoop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signum, loop.quit)
    GLib.io_add_watch(sys.stdin.fileno(), GLib.PRIORITY_DEFAULT, GLib.IO_IN | GLib.IO_HUP | GLib.IO_ERR,
                      lambda fd, cond: _stdin_open(fd, cond, loop))
    print(f"port {server.get_bound_port()}", flush=True)
    loop.run()
    for feeder in feeders:
        feeder.stopped.set()


def _stdin_open(fd: int, condition: GLib.IOCondition, loop: GLib.MainLoop) -> bool:
    """Quit the loop once standard input is closed (its reader read end of file)."""
    if condition & (GLib.IO_HUP | GLib.IO_ERR) or not os.read(fd, 4096):
        loop.quit()
        return False
    return True


def main() -> None:
    """Parse the command line and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--height", type=int, required=True)
    parser.add_argument("--fps", type=int, default=15)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--path", default="/cam")
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
