"""Decode an RTSP camera with GStreamer into an appsink, and say what it cost: a decoder of the cameras' benchmark.

    /usr/bin/python3 decode.py --url rtsp://127.0.0.1:PORT/cam --warmup 2 --seconds 8 [--decoder avdec_h264]

Run by Debian's python3 (python3-gi, GStreamer's plugins; tests/benchmarks/bench_cameras.py starts it):
the standard library and gi only. Frames come out as BGR (what the cameras' pipelines take), each copied
out of its buffer once, as a camera process copies it into shared memory. After `warmup` seconds of
frames it measures `seconds` more and prints one JSON line: frames, the process's user + system CPU
seconds (every GStreamer thread) and wall seconds over that window.

The decoder is a few elements in the launch line: `avdec_h264` (FFmpeg's, gstreamer1.0-libav) here; on a
Jetson `nvv4l2decoder ! nvvidconv` (the hardware decoder, NVMM memory copied out by the converter) with
the same code around it.
"""

from __future__ import annotations

import argparse
import json
import time

import gi

gi.require_version("Gst", "1.0")
from gi.repository import Gst  # noqa: E402

PULL_TIMEOUT_NS = 10 * Gst.SECOND


def launch_line(url: str, decoder: str, transport: str) -> str:
    """The pipeline: RTSP in, H.264 depayloaded and decoded by `decoder`, BGR frames to an appsink."""
    return (f"rtspsrc location={url} protocols={transport} latency=0 ! rtph264depay ! h264parse ! {decoder} "
            "! videoconvert ! video/x-raw,format=BGR ! appsink name=sink sync=false max-buffers=2 drop=true")


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Pull frames for warmup + seconds; the frames and CPU of the second part."""
    Gst.init(None)
    pipeline = Gst.parse_launch(launch_line(args.url, args.decoder, args.transport))
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(Gst.State.PLAYING)
    try:
        frames, started, window = 0, None, None
        while True:
            sample = sink.emit("try-pull-sample", PULL_TIMEOUT_NS)
            if sample is None:
                raise SystemExit(f"no frame from {args.url} within {PULL_TIMEOUT_NS // Gst.SECOND} s")
            ok, info = sample.get_buffer().map(Gst.MapFlags.READ)
            if ok:
                bytes(info.data)  # the one copy a camera process makes (into shared memory)
                sample.get_buffer().unmap(info)
            now = time.monotonic()
            started = started or now
            if window is None and now - started >= args.warmup:
                window, frames, cpu0 = now, 0, time.process_time()
            frames += 1
            if window is not None and now - window >= args.seconds:
                return {"frames": frames - 1, "cpu_s": time.process_time() - cpu0, "wall_s": now - window}
    finally:
        pipeline.set_state(Gst.State.NULL)


def main() -> None:
    """Parse the command line, measure, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--decoder", default="avdec_h264")
    parser.add_argument("--transport", default="tcp")
    print(json.dumps(measure(parser.parse_args())), flush=True)


if __name__ == "__main__":
    main()
