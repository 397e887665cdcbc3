"""Microseconds per call of each processor on camera-sized frames.

    python tests/benchmarks/bench_processors.py [--seconds 0.5] [--rounds 3] [--no-write]

Each case runs for `--seconds` per round, single-threaded; the median round
is shown. The inputs are what a camera pipeline meets: 1280x720 frames (NV12,
JPEG, RGB), a 640x640 letterbox, a DB-net map at PP-OCR's detector size, a
YOLOv8 output for 80 classes, a PP-OCR recogniser output over its 6625
classes. Three other ways to normalise are measured against ours: numpy
through temporaries, ours into a reused buffer (which would need a buffer
per in-flight request to stay thread-safe), OpenCV's blobFromImage. Writes the "## Processors" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402

from infermux.plugins.processors import create  # noqa: E402
from infermux.plugins.processors.base import Region, Sample, Transform  # noqa: E402

SECTION = "Processors"
W, H = 1280, 720


def camera_frame() -> np.ndarray:
    """A 1280x720 RGB frame with smooth content and some edges (JPEG-compressible like a real one)."""
    yy, xx = np.mgrid[0:H, 0:W]
    frame = np.stack([(xx // 5) % 256, (yy // 3) % 256, ((xx + yy) // 7) % 256], axis=2).astype(np.uint8)
    cv2.putText(frame, "INFERMUX 0123", (80, 360), cv2.FONT_HERSHEY_SIMPLEX, 4, (255, 255, 255), 8)
    return frame


def nv12_of(rgb: np.ndarray) -> np.ndarray:
    """The frame as NV12 bytes (cv2 gives I420; interleave its chroma planes)."""
    i420 = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420).reshape(-1)
    y, u, v = i420[:W * H], i420[W * H:W * H * 5 // 4], i420[W * H * 5 // 4:]
    return np.concatenate([y, np.stack([u, v], axis=1).reshape(-1)])


def dbnet_map() -> np.ndarray:
    """PP-OCR's detector output for a 1280x720 frame at limit_side 736 (min): [1, 1, 736, 1312], 24 lines."""
    prob = np.zeros((736, 1312), np.float32)
    for i in range(24):
        y, x = 20 + (i % 12) * 58, 40 + (i // 12) * 640
        prob[y:y + 24, x:x + 520] = 0.9
    return cv2.GaussianBlur(prob, (5, 5), 0)[None, None]


def yolo_output() -> np.ndarray:
    """YOLOv8 [1, 84, 8400]: low scores everywhere but 30 objects, each found by 3 anchors (NMS keeps 30)."""
    rng = np.random.default_rng(0)
    out = rng.uniform(0, 0.05, (1, 84, 8400)).astype(np.float32)
    out[0, :2] = rng.uniform(20, 600, (2, 8400))
    out[0, 2:4] = rng.uniform(10, 80, (2, 8400))
    for j in range(30):
        anchors = slice(j * 200, j * 200 + 3)
        out[0, :4, anchors] = out[0, :4, j * 200:j * 200 + 1] + rng.uniform(-1, 1, (4, 3))
        out[0, 4 + j % 80, anchors] = [0.9, 0.85, 0.8]
    return out


def timed(fn: Callable[[], object], seconds: float, rounds: int) -> tuple[float, list[float]]:
    """Median µs per call over `rounds` rounds of about `seconds` each, and every round's figure."""
    fn()
    per_round = []
    for _ in range(rounds):
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            calls += 1
        per_round.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per_round), per_round


def run_steps(steps: list, make: Callable[[], Sample]) -> Callable[[], Sample]:  # type: ignore[type-arg]
    def go() -> Sample:
        sample = make()
        for step in steps:
            step(sample)
        return sample
    return go


def cases(tmp: Path) -> list[tuple[str, str, Callable[[], object]]]:
    rgb = camera_frame()
    nv12 = nv12_of(rgb)
    jpeg = cv2.imencode(".jpg", rgb[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])[1].reshape(-1)
    (tmp / "dict.txt").write_text("\n".join(chr(0x4E00 + i) for i in range(6623)) + "\n")
    (tmp / "labels.txt").write_text("\n".join(f"class{i}" for i in range(1000)) + "\n")
    letterbox = create("resize", {"mode": "letterbox", "size": [640, 640]})
    normalize = create("normalize", {"mean": [0.0], "std": [1.0]})
    decode = create("decode")
    boxed = Sample(image=rgb)
    letterbox(boxed)
    square = boxed.tensor
    assert square is not None
    regions = [Region(np.array([[x, y], [x + 500, y + 10], [x + 498, y + 50], [x - 2, y + 40]], np.float32), 0.9)
               for x in (60, 700) for y in range(20, 680, 60)]
    prob, detections = dbnet_map(), yolo_output()
    strided = np.concatenate([nv12.reshape(-1, W), np.zeros((H * 3 // 2, 256), np.uint8)], axis=1).reshape(-1)
    rng = np.random.default_rng(1)
    rec = rng.random((6, 40, 6625), dtype=np.float32)
    scale, reused = np.float32(1 / 255), np.empty((3, 640, 640), np.float32)

    def naive() -> np.ndarray:
        return np.ascontiguousarray(((square.astype(np.float32) * scale - 0.0) / 1.0).transpose(2, 0, 1))[None]

    def into_reused() -> np.ndarray:
        for c in range(3):
            np.multiply(square[:, :, c], scale, out=reused[c], casting="unsafe")
            reused[c] += 0.0
        return reused

    def opencv_blob() -> np.ndarray:
        return cv2.dnn.blobFromImage(square, float(scale), None, (0, 0, 0), False, False)

    return [
        ("decode", "NV12 1280x720 -> RGB", run_steps([decode], lambda: Sample(
            data=nv12, format="nv12", width=W, height=H, stride=W))),
        ("decode", "NV12 1280x720, stride 1536 -> RGB", run_steps([decode], lambda: Sample(
            data=strided, format="nv12", width=W, height=H, stride=1536))),
        ("decode", f"JPEG 1280x720 q90 ({jpeg.size // 1024} KiB) -> RGB", run_steps([decode], lambda: Sample(
            data=jpeg, format="jpeg"))),
        ("resize", "letterbox 1280x720 -> 640x640", run_steps([letterbox], lambda: Sample(image=rgb))),
        ("resize", "multiple of 32, limit_side 736 (min) -> 1312x736", run_steps(
            [create("resize", {"mode": "multiple", "limit_side": 736, "limit": "min"})], lambda: Sample(image=rgb))),
        ("normalize", "640x640 uint8 HWC -> float32 NCHW (ours)", run_steps([normalize], lambda: Sample(
            image=square))),
        ("(compare)", "same, numpy (x*s-m)/s then transpose copy", naive),
        ("(compare)", "same, into one reused buffer", into_reused),
        ("(compare)", "same, cv2.dnn.blobFromImage", opencv_blob),
        ("layout", "640x640x3 uint8 HWC -> NCHW", run_steps([create("layout")], lambda: Sample(image=square))),
        ("chain", "NV12 1280x720 -> letterbox 640 -> float32 NCHW", run_steps(
            [decode, letterbox, normalize],
            lambda: Sample(data=nv12, format="nv12", width=W, height=H, stride=W))),
        ("dbnet", "map [1,1,736,1312], 24 text lines", run_steps([create("dbnet")], lambda: Sample(
            image=rgb, transform=Transform(1312 / W, 736 / H), outputs={"map": prob}))),
        ("yolo", "v8 [1,84,8400], 30 boxes, NMS per class", run_steps(
            [create("yolo")], lambda: Sample(transform=Transform(0.5, 0.5, 0, 140),
                                             outputs={"out": detections}))),
        ("ctc", "[6,40,6625] (PP-OCR rec batch of 6)", run_steps(
            [create("ctc", {"dictionary": str(tmp / "dict.txt")})], lambda: Sample(outputs={"rec": rec}))),
        ("classify", "[1,1000] softmax top-5 with labels", run_steps(
            [create("classify", {"k": 5, "labels": str(tmp / "labels.txt")})],
            lambda: Sample(outputs={"logits": rec[0, :1, :1000]}))),
        ("crop", "24 rotated regions of 1280x720, rectified (cubic)", run_steps(
            [create("crop")], lambda: Sample(image=rgb, regions=list(regions)))),
        ("crop", "same, interpolation linear", run_steps(
            [create("crop", {"interpolation": "linear"})], lambda: Sample(image=rgb, regions=list(regions)))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per case per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    cv2.setNumThreads(1)  # one call per core, as the daemon's threads will run them
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, what, fn in cases(Path(tmp)):
            median, per_round = timed(fn, args.seconds, args.rounds)
            rows.append([kind, what, f"{median:,.0f}", " / ".join(f"{r:,.0f}" for r in per_round)])
            print(f"{kind:10} {what:55} {median:10,.0f} µs", flush=True)
    body = (f"{stamp()} OpenCV {cv2.__version__}, cv2.setNumThreads(1).\n"
            f"1-min load average {load:.2f} before the run, {os.getloadavg()[0]:.2f} after (the box is shared, "
            "so figures are noisy; compare rows of one run).\n\n"
            + markdown_table(["processor", "case", "µs per call", "µs per round"], rows)
            + f"\n\nOne thread, median of {args.rounds} rounds of {args.seconds} s. "
            "Reproduce: `python tests/benchmarks/bench_processors.py`.")
    print_and_write(SECTION, body, write=not args.no_write)


if __name__ == "__main__":
    main()
