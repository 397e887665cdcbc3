"""The OCR pipeline's frames per second and latency per frame, against rapidocr.

    python engines/fetch_ppocr.py          # once: the models, into engines/ppocr/
    python tests/benchmarks/bench_pipeline.py [--frames 16] [--size 640x360] [--no-write]

Three runs on the same generated frames (text on noise, examples/camera_ocr.py),
each frame a JPEG:

- rapidocr-onnxruntime in this process, one frame at a time (its default
  settings: onnxruntime on every core; it decodes the JPEG itself);
- infermux's `ocr` pipeline (etc/infermux/examples/ocr.toml as shipped), one
  camera sending one frame at a time;
- the same with 4 cameras at once, each one frame at a time.

fps counts frames over the whole run; p50/p99 are per frame, send to reply.
rapidocr is the reference here only. Writes "## Pipelines" in RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from support.harness import Daemon, example  # noqa: E402
from results import markdown_table, print_and_write, process_cpu_s, stamp  # noqa: E402

from infermux.pipelines.wire import send_frame  # noqa: E402

SECTION = "Pipelines"
ENGINES = REPO / "engines" / "ppocr"
NOTE = ("\n\nWhat caps the ratio is CPU time, and the detector's above all (the column \"CPU s per frame\": "
        "the whole OCR process, every thread). onnxruntime alone on the detector's [1,3,736,1312] input, quiet box: "
        "492 ms a frame on one thread, 261 ms on two (0.49-0.52 CPU s either way); two frames side by side, 3.59 "
        "frames/s on one thread each, 3.30 on two threads each that sleep when idle (`allow_spinning = false`), "
        "2.50 on two that spin. Batching frames does not lower the cost on CPU, so the detector is about two thirds "
        "of the pipeline's CPU per frame and cannot be batched away. The shipped ocr.toml runs it on 2 contexts of "
        "one thread: in back-to-back runs (8 frames a camera, 2026-12-01) two non-spinning threads per context took "
        "1 camera from 1.39-1.45 to 1.86-1.88 fps but 4 cameras from 2.64 to 2.35-2.45 (more CPU a frame, 0.80 "
        "against 0.72 s), and 1 context of two threads gave 4 cameras 2.14-2.64; the example keeps the throughput. "
        "The recogniser's cost grows with the width it is padded to (43 ms a line at 320 px, 101 at 640) and not "
        "with batching: a frame's lines are padded to a multiple of 32 px, not 320. rapidocr keeps both cores busy "
        "on one frame with spinning threads, at 1.1-1.3 CPU s a frame against the pipeline's 0.7-0.8, which bounds "
        "the pipeline near 1.6x with both cores saturated. The ratio swings with the box's load and the hypervisor's "
        "steal (up to a third of the CPU during these runs): 1.42x-1.80x at 4 cameras in this session's runs, "
        "1.16x-2.63x in earlier ones, since spinning threads suffer most when other processes take the cores.")


def jpegs(count: int, size: tuple[int, int]) -> list[bytes]:
    synthetic = example("camera_ocr").synthetic
    return [cv2.imencode(".jpg", synthetic(10_000 + i, size), [cv2.IMWRITE_JPEG_QUALITY, 92])[1].tobytes()
            for i in range(count)]


@dataclass(frozen=True)
class Run:
    """One run's figures; `cpu_s` is the CPU time (all threads) the OCR process spent per frame."""

    fps: float
    p50_ms: float
    p99_ms: float
    lines: int
    cpu_s: float


def summary(latencies_ms: list[float], seconds: float, lines: int, cpu_s: float) -> Run:
    p50, p99 = np.percentile(latencies_ms, [50, 99])
    return Run(len(latencies_ms) / seconds, float(p50), float(p99), lines, cpu_s / len(latencies_ms))


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def rapidocr_run(frames: list[bytes]) -> Run:
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR()
    for data in frames[:2]:  # warm-up
        engine(data)
    latencies, lines = [], 0
    start, cpu = time.perf_counter(), own_cpu_s()
    for data in frames:
        t = time.perf_counter()
        result, _ = engine(data)
        latencies.append((time.perf_counter() - t) * 1000)
        lines += len(result or [])
    return summary(latencies, time.perf_counter() - start, lines, own_cpu_s() - cpu)


def cameras_run(daemon: Daemon, frames: list[bytes], cameras: int) -> Run:
    """`cameras` threads, each sending every frame once, one at a time."""
    endpoint = daemon.endpoint
    latencies: list[float] = []
    lines = [0]
    lock = threading.Lock()

    def camera(index: int, record: bool) -> None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        order = frames[index % len(frames):] + frames[:index % len(frames)]  # cameras out of step
        for data in (order if record else order[:2]):
            t = time.perf_counter()
            reply = send_frame(sock, "ocr", data, "jpeg", timeout_s=300, timeout_ms=120_000)
            ms = (time.perf_counter() - t) * 1000
            assert reply.status == 200, reply.header
            if record:
                with lock:
                    latencies.append(ms)
                    lines[0] += len(reply.header["regions"])
        sock.close()

    run_threads(camera, cameras, False)  # warm-up
    assert daemon.proc is not None
    start, cpu = time.perf_counter(), process_cpu_s(daemon.proc.pid)
    run_threads(camera, cameras, True)
    return summary(latencies, time.perf_counter() - start, lines[0] // cameras,
                   process_cpu_s(daemon.proc.pid) - cpu)


def run_threads(target: Callable[[int, bool], None], count: int, record: bool) -> None:
    threads = [threading.Thread(target=target, args=(i, record)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def progress(results: dict[str, Run]) -> None:
    """The run just finished, as one line (each run takes tens of seconds)."""
    name, r = list(results.items())[-1]
    print(f"{name}: {r.fps:.2f} fps, p50 {r.p50_ms:,.0f} ms, p99 {r.p99_ms:,.0f} ms, "
          f"{r.cpu_s:.2f} CPU s a frame", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=16, help="frames per run (per camera)")
    parser.add_argument("--size", default="640x360", help="frame size WxH")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    if not (ENGINES / "rec.onnx").is_file():
        sys.exit("bench_pipeline: run `python engines/fetch_ppocr.py` first (the models go to engines/ppocr/)")
    width, height = (int(v) for v in args.size.lower().split("x"))
    frames = jpegs(args.frames, (width, height))
    load = os.getloadavg()[0]
    results: dict[str, Run] = {}
    results["rapidocr, one process, one frame at a time"] = rapidocr_run(frames)
    progress(results)
    config = (REPO / "etc/infermux/examples/ocr.toml").read_text().replace(
        'engine_dir = "../../../engines/ppocr"', f'engine_dir = "{ENGINES}"')
    with tempfile.TemporaryDirectory() as tmp:
        daemon = Daemon(Path(tmp), config).start(timeout=120)
        try:
            for cameras in (1, 4):
                results[f"infermux `ocr` pipeline, {cameras} camera{'s' if cameras > 1 else ''}"] = \
                    cameras_run(daemon, frames, cameras)
                progress(results)
        finally:
            daemon.stop()
    base = next(iter(results.values())).fps
    rows = [[name, f"{r.fps:.2f}", f"{r.p50_ms:,.0f}", f"{r.p99_ms:,.0f}", f"{r.lines}", f"{r.cpu_s:.2f}",
             f"{r.fps / base:.2f}×"] for name, r in results.items()]
    body = (f"{stamp()}\n1-min load average {load:.2f} before the run, {os.getloadavg()[0]:.2f} after (the box "
            "is shared with other sessions' tests, so figures are noisy; the ratios are of one run).\n\n"
            + markdown_table(["run", "fps", "p50 ms", "p99 ms", "text lines per pass", "CPU s per frame",
                             "× rapidocr"], rows)
            + f"\n\n{args.frames} generated {width}x{height} JPEG frames per camera, after 2 warm-up frames. "
            "Reproduce: `python engines/fetch_ppocr.py && python tests/benchmarks/bench_pipeline.py`."
            + NOTE)
    print_and_write(SECTION, body, write=not args.no_write)


if __name__ == "__main__":
    main()
