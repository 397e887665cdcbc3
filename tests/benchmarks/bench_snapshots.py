"""What snapshots cost a pipeline's thread per frame, and the writer thread per snapshot.

    python tests/benchmarks/bench_snapshots.py [--width 1280] [--height 720] [--boxes 10] [--rounds 5]

The calls a pipeline's thread makes for each served frame of a keyed stream
(daemon/pipelines/runner.py `_observed`): `seen_of` (the frame kept by
reference, with its boxes) and `Snapshots.remember`; the same for a frame
decoded in place from a client's shared memory (an mmap here), which is
copied; and what the writer thread does per snapshot: draw the boxes and
encode the JPEG. Alternating rounds; the median of each is printed.
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from infermux.config import SnapshotConfig
from infermux.pipelines.seen import seen_of
from infermux.pipelines.snapshots import Snapshots, draw, encode
from infermux.plugins.processors.base import Region


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--boxes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    h, w = args.height, args.width
    regions = [Region(np.array([[10 + i, 10], [50 + i, 10], [50 + i, 60], [10 + i, 60]], np.float32), 0.9, "car", i)
               for i in range(args.boxes)]
    plain = np.zeros((h, w, 3), np.uint8)
    region = mmap.mmap(-1, h * w * 3)
    shm_data = np.frombuffer(memoryview(region), np.uint8)
    snaps = Snapshots(SnapshotConfig(), Path(tempfile.mkdtemp()) / "snapshots")

    def per_frame(image: np.ndarray, data: np.ndarray, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            snaps.remember(seen_of(image, data, regions, "cam", "p", "rgb", 0.0))
        return (time.perf_counter() - start) / n * 1e6

    def writer(n: int = 20) -> float:
        seen = seen_of(plain, plain.reshape(-1), regions, "cam", "p", "rgb", 0.0)
        start = time.perf_counter()
        for _ in range(n):
            encode(draw(seen, 0), 85)
        return (time.perf_counter() - start) / n * 1e6

    rounds: dict[str, list[float]] = {"kept by reference": [], "shared memory, copied": [], "draw + encode": []}
    for _ in range(args.rounds):
        rounds["kept by reference"].append(per_frame(plain, plain.reshape(-1), 2000))
        rounds["shared memory, copied"].append(per_frame(shm_data.reshape(h, w, 3), shm_data, 300))
        rounds["draw + encode"].append(writer())
    snaps.stop()
    for name, values in rounds.items():
        print(f"{name:24} median {statistics.median(values):9.1f} us ({w}x{h}, {args.boxes} boxes)")


if __name__ == "__main__":
    main()
