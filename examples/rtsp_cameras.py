"""Test cameras: GStreamer's RTSP server serving N live H.264 streams, to try `[[cameras]]` without a camera.

    python3 examples/rtsp_cameras.py                       # rtsp://127.0.0.1:8554/cam1 ... /cam4
    python3 examples/rtsp_cameras.py --cameras 2 --size 1280x720 --fps 15 --port 8555 --address 0.0.0.0

Each camera is GStreamer's test source (a ball moving across a background of its own colour) encoded
live as an IP camera encodes (x264, no B-frames, a key frame every second with its parameter sets),
one encoder per camera however many clients read it. It prints each camera's URL once it listens, and
runs until Ctrl-C or SIGTERM.

Run it with the system's python3, not a virtual environment's: it needs GStreamer's Python bindings
and RTSP server from the distribution (Debian / Ubuntu: `sudo apt install python3-gi
gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good
gstreamer1.0-plugins-ugly`). docs/cameras.md, "Try it: four cameras", points the daemon at them.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import NoReturn

PACKAGES = ("python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good "
            "gstreamer1.0-plugins-ugly")
# Background colours (ARGB) told apart at a glance in a snapshot.
COLOURS = (0xFF204060, 0xFF602040, 0xFF406020, 0xFF505050, 0xFF203060, 0xFF603020, 0xFF306020, 0xFF602060)
# Each element the streams need, and the Debian package that has it.
ELEMENTS = {"videotestsrc": "gstreamer1.0-plugins-base", "videoconvert": "gstreamer1.0-plugins-base",
            "x264enc": "gstreamer1.0-plugins-ugly", "rtph264pay": "gstreamer1.0-plugins-good"}


def fail(message: str) -> NoReturn:
    """One line on stderr saying what to do, and exit 1."""
    print(f"rtsp_cameras.py: {message}", file=sys.stderr)
    raise SystemExit(1)


def size(text: str) -> tuple[int, int]:
    """WIDTHxHEIGHT, each even and between 16 and 4096."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 640x360") from None
    if not all(16 <= n <= 4096 and n % 2 == 0 for n in (width, height)):
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be even, 16 to 4096")
    return width, height


def launch(n: int, width: int, height: int, fps: int) -> str:
    """Camera `n`'s pipeline: a live test source, encoded as a camera encodes, payloaded for RTP."""
    kbits = max(64, width * height * fps // 4000)  # about a quarter of a bit per pixel
    return (f"( videotestsrc is-live=true pattern=ball background-color={COLOURS[n % len(COLOURS)]} "
            f"! video/x-raw,width={width},height={height},framerate={fps}/1 ! videoconvert "
            f"! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} bitrate={kbits} "
            "! rtph264pay name=pay0 pt=96 config-interval=-1 )")


def main() -> None:
    """Parse the command line, check GStreamer has what the streams need, and serve until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=4, choices=range(1, 17), metavar="N", help="1 to 16 (4)")
    parser.add_argument("--size", type=size, default=(640, 360), help="WIDTHxHEIGHT (640x360)")
    parser.add_argument("--fps", type=int, default=15, choices=range(1, 61), metavar="FPS", help="1 to 60 (15)")
    parser.add_argument("--port", type=int, default=8554, help="the RTSP port (8554)")
    parser.add_argument("--address", default="127.0.0.1", help="where to listen (127.0.0.1; 0.0.0.0: every address)")
    args = parser.parse_args()
    try:
        import gi

        gi.require_version("Gst", "1.0")
        gi.require_version("GstRtspServer", "1.0")
        from gi.repository import GLib, Gst, GstRtspServer
    except (ImportError, ValueError):
        fail(f"GStreamer's RTSP server or its Python bindings are missing for {sys.executable}: "
             f"sudo apt install {PACKAGES}, then run this with /usr/bin/python3 (a virtual environment "
             "does not see them unless made with --system-site-packages)")
    Gst.init(None)
    absent = sorted({pkg for element, pkg in ELEMENTS.items() if Gst.ElementFactory.find(element) is None})
    if absent:
        fail(f"GStreamer lacks elements the cameras need: sudo apt install {' '.join(absent)}")
    server = GstRtspServer.RTSPServer()
    server.set_address(args.address)
    server.set_service(str(args.port))
    mounts = server.get_mount_points()
    width, height = args.size
    for n in range(1, args.cameras + 1):
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(launch(n, width, height, args.fps))
        factory.set_shared(True)  # one encoder per camera, however many clients (the daemon, doctor) read it
        mounts.add_factory(f"/cam{n}", factory)
    if server.attach(None) == 0:
        fail(f"cannot listen on {args.address}:{args.port} (taken by another program?): give another --port")
    host = "127.0.0.1" if args.address in ("0.0.0.0", "::") else args.address
    for n in range(1, args.cameras + 1):
        print(f"rtsp://{host}:{server.get_bound_port()}/cam{n}", flush=True)
    loop = GLib.MainLoop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signum, loop.quit)
    loop.run()


if __name__ == "__main__":
    main()
