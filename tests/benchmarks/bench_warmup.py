"""A camera's first frame against its later ones, through the OCR pipeline, with and without `warm_frames`.

    python engines/fetch_ppocr.py          # once: the models, into engines/ppocr/
    python tests/benchmarks/bench_warmup.py [--rounds 4] [--frames 16] [--size 1280x720] [--no-write]

Each round starts a daemon on etc/infermux/examples/ocr.toml without its `warm_frames` (the detector
is then warmed at the smallest shape it takes, as every model was before `warm_frames`), and one with
`warm_frames = [[W, H]]` of the frames sent (the detector is warmed at the shape its resize makes of
them), in turns; once it is ready one camera sends the same generated JPEG `--frames` times, one at
a time. Per daemon: the detector step's time (`timing_us["det"]` of the reply) on the first frame
and the median of the later ones, the whole frame's the same way, and the seconds from start to ready
(what the warm-up costs).

The daemon's figures are wall time, which a shared box's load swings by several times. So the
detector is also measured alone, in this process, as the daemon loads and warms it (the onnxruntime
backend, `models.hot.warm_up` with no shapes or with the one the pipeline sends): the CPU time of
the one thread that runs it (`intra_op_num_threads = 1`, the example's) for its first call at the
frames' shape and the median of the next ones. Writes "## Warm-up at the pipeline's shapes" in RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from support.harness import Daemon, example  # noqa: E402
from results import markdown_table, print_and_write, stamp  # noqa: E402

from infermux.pipelines.wire import send_frame  # noqa: E402

SECTION = "Warm-up at the pipeline's shapes"
ENGINES = REPO / "engines" / "ppocr"
VARIANTS = ("without warm_frames (as before)", "warm_frames = the frames' size")


@dataclass(frozen=True)
class Round:
    """One daemon's first frame against its later ones (ms), and its start-to-ready time (s)."""

    det_first: float
    det_later: float
    frame_first: float
    frame_later: float
    ready_s: float


def config(size: tuple[int, int] | None) -> str:
    text = (REPO / "etc/infermux/examples/ocr.toml").read_text().replace(
        'engine_dir = "../../../engines/ppocr"', f'engine_dir = "{ENGINES}"')
    text = "\n".join(line for line in text.splitlines() if not line.startswith("warm_frames")) + "\n"
    if size is None:
        return text
    anchor = 'name = "ocr"\n'
    assert anchor in text
    return text.replace(anchor, f"{anchor}warm_frames = [[{size[0]}, {size[1]}]]\n", 1)


def one_round(jpeg: bytes, frames: int, size: tuple[int, int] | None) -> Round:
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        daemon = Daemon(Path(tmp), config(size)).start(timeout=300)
        ready_s = time.perf_counter() - began
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(daemon.endpoint)
        det, whole = [], []
        try:
            for _ in range(frames):
                t = time.perf_counter()
                reply = send_frame(sock, "ocr", jpeg, "jpeg", timeout_s=300, timeout_ms=120_000)
                whole.append((time.perf_counter() - t) * 1000)
                assert reply.status == 200, reply.header
                det.append(reply.header["timing_us"]["det"] / 1000)
        finally:
            sock.close()
            daemon.stop()
    return Round(det[0], statistics.median(det[1:]), whole[0], statistics.median(whole[1:]), ready_s)


def detector_alone(shape: tuple[int, ...], warmed: bool, later: int) -> tuple[float, float]:
    """CPU ms of the detector's first call at `shape` after the daemon's warm-up (at `shape` where
    `warmed`), and the median of `later` calls after it."""
    from infermux.config import ModelConfig
    from infermux.models.hot import WarmShape, warm_up
    from infermux.plugins import backends

    path = ENGINES / "det.onnx"
    engine = backends.for_path(path).load(path, {})
    try:
        warm_up(engine, ModelConfig("ppocr_det", path), [WarmShape("", shape, "float32")] if warmed else [])
        context = engine.create_context()
        x = {engine.inputs[0].name: np.zeros(shape, np.float32)}
        cpu = []
        for _ in range(1 + later):
            t = time.thread_time()
            context.infer(x)
            cpu.append((time.thread_time() - t) * 1000)
        context.close()
    finally:
        engine.close()
    return cpu[0], statistics.median(cpu[1:])


def alone_table(shape: tuple[int, ...], rounds: int, later: int) -> str:
    rows = []
    for warmed in (False, True):
        got = [detector_alone(shape, warmed, later) for _ in range(rounds)]
        ratios = [first / rest for first, rest in got]
        rows.append(["at its shape too" if warmed else "at its smallest shape (as before)",
                     " / ".join(f"{first:,.0f}" for first, _ in got), " / ".join(f"{rest:,.0f}" for _, rest in got),
                     f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}-{max(ratios):.2f})"])
        print(f"detector alone, warmed {rows[-1][0]}: first {rows[-1][1]} CPU ms, later {rows[-1][2]}", flush=True)
    return markdown_table(["detector warmed", "1st call CPU ms", "later p50 CPU ms", "1st / later (median, range)"],
                          rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="daemons started per variant")
    parser.add_argument("--frames", type=int, default=16, help="frames sent to each daemon")
    parser.add_argument("--size", default="1280x720", help="frame size WxH")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    if not (ENGINES / "det.onnx").is_file():
        sys.exit("bench_warmup: run `python engines/fetch_ppocr.py` first (the models go to engines/ppocr/)")
    width, height = (int(v) for v in args.size.lower().split("x"))
    image = example("camera_ocr").synthetic(10_000, (width, height))
    jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 92])[1].tobytes()
    load = os.getloadavg()[0]
    from infermux.plugins.processors.geometry import Resize

    tw, th = Resize({"mode": "multiple", "multiple": 32, "limit_side": 736, "limit": "min"}).output_size(width, height)
    det_shape = (1, 3, th, tw)  # as ocr.toml's det_resize makes it
    alone = alone_table(det_shape, args.rounds, args.frames - 1)
    rounds: dict[str, list[Round]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):  # the variants in turns, so that the box's load falls on both
        for variant, size in zip(VARIANTS, (None, (width, height))):
            result = one_round(jpeg, args.frames, size)
            rounds[variant].append(result)
            print(f"round {r + 1} {variant}: det first {result.det_first:,.0f} ms, later p50 {result.det_later:,.0f} "
                  f"ms; frame first {result.frame_first:,.0f} ms, later {result.frame_later:,.0f} ms; "
                  f"ready in {result.ready_s:.1f} s", flush=True)
    rows = []
    for variant, got in rounds.items():
        ratios = [g.det_first / g.det_later for g in got]
        rows.append([variant, " / ".join(f"{g.det_first:,.0f}" for g in got),
                     " / ".join(f"{g.det_later:,.0f}" for g in got),
                     f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}-{max(ratios):.2f})",
                     " / ".join(f"{g.frame_first:,.0f}" for g in got), " / ".join(f"{g.frame_later:,.0f}" for g in got),
                     f"{statistics.median(g.ready_s for g in got):.1f}"])
    body = (f"{stamp()}\n1-min load average {load:.2f} before the run, {os.getloadavg()[0]:.2f} after (the box "
            "is shared with other sessions' tests: each figure is one daemon's, the variants ran in turns).\n\n"
            + markdown_table(["daemon", "det, 1st frame ms", "det, later p50 ms", "1st / later (median, range)",
                              "frame, 1st ms", "frame, later p50 ms", "start to ready s"], rows)
            + f"\n\n{args.rounds} daemons per variant, one camera sending one generated {width}x{height} JPEG "
            f"{args.frames} times, one at a time; the detector's input is the shape its resize makes of it, "
            f"{list(det_shape)}.\n\nThe detector alone, {args.rounds} engines per row, each warmed as the daemon "
            "warms it, then called at that shape: the CPU time of its one thread, which the box's load moves "
            "far less than wall time.\n\n" + alone
            + "\n\nReproduce: `python engines/fetch_ppocr.py && python tests/benchmarks/bench_warmup.py`.")
    print_and_write(SECTION, body, write=not args.no_write)


if __name__ == "__main__":
    main()
