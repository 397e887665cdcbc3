"""What zones and lines add to a tracked object's lifecycle, per region of a frame.

    python tests/benchmarks/bench_zones.py [--rounds 7] [--regions 20] [--frames 500]

A lifecycle (daemon/pipelines/lifecycle.py) is shown `--frames` frames of `--regions` tracked
objects walking across the frame, on a stream whose camera has 8 zones of 8 points and 8 lines,
and on a stream with none; rounds alternate the two. Prints µs per region for each (median of the
rounds) and their difference; it writes nothing (figures go to RESULTS.md by hand, with the load).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infermux.config import CameraConfig, LifecycleConfig  # noqa: E402
from infermux.config.settings import LineConfig, ZoneConfig  # noqa: E402
from infermux.pipelines.lifecycle import Lifecycle  # noqa: E402
from infermux.pipelines.zones import ZoneBook  # noqa: E402
from infermux.plugins.processors.base import Region  # noqa: E402

SIZE = (1280, 720)


def camera() -> CameraConfig:
    ring = [(0.5 + 0.1 * np.cos(a), 0.5 + 0.1 * np.sin(a)) for a in np.linspace(0, 2 * np.pi, 8, endpoint=False)]
    zones = tuple(ZoneConfig(f"z{i}", tuple((x + (i - 4) * 0.05, y) for x, y in ring)) for i in range(8))
    lines = tuple(LineConfig(f"l{i}", ((0.05, 0.1 + 0.1 * i), (0.95, 0.12 + 0.1 * i))) for i in range(8))
    return CameraConfig(name="cam", url="/dev/video0", pipeline="p", zones=zones, lines=lines)


def frames(regions: int, count: int) -> list[list[Region]]:
    out = []
    for f in range(count):
        row = []
        for r in range(regions):
            x, y = (37 * r + 2 * f) % 1200, (23 * r + f) % 650
            box = np.array([[x, y], [x + 40, y], [x + 40, y + 60], [x, y + 60]], np.float32)
            row.append(Region(box=box, score=0.9, label="person", track_id=r + 1))
        out.append(row)
    return out


def one_round(key: str, shown: list[list[Region]]) -> float:
    """µs per region for one pass over the frames, on a fresh lifecycle."""
    life = Lifecycle(LifecycleConfig(min_frames=1, end_after_s=3600), "p", zones=ZoneBook([camera()]))
    started = time.perf_counter()
    for i, regions in enumerate(shown):
        life.observe(key, regions, 1_700_000_000.0 + i / 15, False, SIZE)
    return (time.perf_counter() - started) * 1e6 / sum(len(r) for r in shown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--regions", type=int, default=20)
    parser.add_argument("--frames", type=int, default=500)
    args = parser.parse_args()
    shown = frames(args.regions, args.frames)
    with_areas, without = [], []
    for _ in range(args.rounds):  # alternating: a load that comes and goes falls on both alike
        with_areas.append(one_round("cam", shown))
        without.append(one_round("other", shown))
    a, b = statistics.median(with_areas), statistics.median(without)
    print(f"µs per region, median of {args.rounds} rounds: 8 zones + 8 lines {a:.1f} (range {min(with_areas):.1f}-"
          f"{max(with_areas):.1f}), none {b:.1f} ({min(without):.1f}-{max(without):.1f}); added {a - b:.1f} µs")


if __name__ == "__main__":
    main()
