"""How well the `track` step keeps identities, what it costs a frame, and what re-inference per track saves.

    python tests/benchmarks/bench_tracking.py [--rounds 5] [--frames N] [--no-write]

On the shipped generated sequences (tests/support/tracking.py, fixed seeds):

- identities: IDF1 (with IDP and IDR) and identity switches, for the
  boxes given straight to the processor (a detector's full boxes with
  noise, misses and false alarms) and through a detector pipeline on a
  real daemon (decode → normalize → brightness map → dbnet → track, which
  sees each object's visible part; scored against the visible boxes);
- the track step's cost per frame: µs per call in this process (median
  and p99 over the sequence's frames, best of `--rounds`), and the
  daemon's own p50 for the step;
- secondary calls: the test classifier run on each tracked region every
  frame, and with `reinfer_every` 5 and 15, each sequence through the
  three pipelines in turn on one daemon: the rows the classifier computed
  (its own statistics), and the frames' mean latency.

Writes the "## Tracking" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402
from support import models, tracking  # noqa: E402
from support.harness import Daemon, dealer  # noqa: E402
from support.tracking import classifying, detecting, id_switches, idf1, replay, rows_computed  # noqa: E402

from infermux.plugins.processors import create  # noqa: E402
from infermux.plugins.processors.base import Region, Sample  # noqa: E402

SECTION = "Tracking"
CLASSIFIER = REPO / "engines/classifier/1/model.onnx"
EVERY = (5, 15)


def corners(box: tracking.Box) -> np.ndarray:
    x0, y0, x1, y1 = box
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)


def direct(seq: tracking.Sequence, rounds: int) -> tuple[list[dict[int, tracking.Box]], list[float]]:
    """The sequence's detections through a fresh `track` processor, `rounds` times: the ids of the last
    round, and per frame the fastest call's µs."""
    frames = [[Region(corners(b), s) for b, s in seq.detections(i)] for i in range(seq.length)]
    best = [float("inf")] * seq.length
    predicted: list[dict[int, tracking.Box]] = []
    for _ in range(rounds):
        tracker, predicted = create("track"), []
        for i, regions in enumerate(frames):
            sample = Sample(key="cam", regions=[Region(r.box, r.score) for r in regions])
            start = time.perf_counter_ns()
            tracker(sample)
            best[i] = min(best[i], (time.perf_counter_ns() - start) / 1000)
            predicted.append({r.track_id: tuple(float(v) for v in (*r.box.min(0), *r.box.max(0)))  # type: ignore[misc]
                              for r in sample.regions})
    return predicted, best


def config_text(watched: Path) -> str:
    text = f'[daemon]\nlisten = ["ipc://infer.sock"]\nengine_dir = "{watched}"\nwatch = false\n'
    text += f'[[models]]\nname = "det"\nengine = "{watched / "det/1/model.onnx"}"\n'
    for name in ("every_1", *(f"every_{n}" for n in EVERY)):
        text += f'[[models]]\nname = "cls_{name}"\nengine = "{CLASSIFIER}"\nmax_batch = 32\n'
    text += detecting("tracks")
    text += classifying("every_1", "cls_every_1")
    for n in EVERY:
        text += classifying(f"every_{n}", f"cls_every_{n}", f"reinfer_every = {n}")
    return text


def track_p50_us(daemon: Daemon) -> float:
    with daemon.admin() as admin:
        view = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "tracks")
    return float(view["steps"]["track"]["p50_us"])


def scores(seq: tracking.Sequence, how: str, truth: list[dict[int, tracking.Box]],
           predicted: list[dict[int, tracking.Box]]) -> list[str]:
    """A row of the identities table."""
    s = idf1(truth, predicted)
    return [seq.name, f"{len(seq.things)}", f"{seq.length}", how, f"{s.idf1:.3f}", f"{s.idp:.3f}", f"{s.idr:.3f}",
            f"{id_switches(truth, predicted)}", f"{len({k for f in predicted for k in f})}"]


def measure(daemon: Daemon, sock: zmq.Socket, seq: tracking.Sequence,
            rounds: int) -> tuple[list[list[str]], list[str], list[str]]:
    """One sequence's rows: identities (boxes given, detector pipeline), the track step's cost, secondary calls."""
    predicted, us = direct(seq, rounds)
    ids = [scores(seq, "boxes given", seq.ground_truth(), predicted),
           scores(seq, "detector pipeline", seq.ground_truth(visible_boxes=True),
                  replay(sock, "tracks", seq, f"ids/{seq.name}").predicted())]
    regions = statistics.mean(len(seq.detections(i)) for i in range(seq.length))
    cost = [seq.name, f"{regions:.1f}", f"{statistics.median(us):.0f}", f"{np.percentile(us, 99):.0f}"]
    calls, latency = {}, {}
    for n in (1, *EVERY):
        before = rows_computed(daemon, f"cls_every_{n}")
        start = time.perf_counter()
        got = replay(sock, f"every_{n}", seq, f"calls/{n}/{seq.name}")
        latency[n] = (time.perf_counter() - start) / seq.length * 1000
        calls[n] = rows_computed(daemon, f"cls_every_{n}") - before
        assert set(got.statuses) == {200}, got.statuses
    return ids, cost, [seq.name, f"{calls[1]}", *(f"{calls[n]} ({calls[n] / calls[1]:.0%})" for n in EVERY),
                       *(f"{latency[n]:.1f}" for n in (1, *EVERY))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of each sequence for the per-frame cost")
    parser.add_argument("--frames", type=int, help="only each sequence's first N frames (a quick check)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    seqs = [seq.first(args.frames) if args.frames else seq for seq in tracking.sequences()]
    ids_rows, cost_rows, calls_rows = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        watched = Path(tmp) / "engines"
        models.brightness_map(watched / "det/1/model.onnx")
        daemon = Daemon(Path(tmp), config_text(watched)).start(timeout=60)
        try:
            with dealer(daemon.endpoint) as sock:
                for seq in seqs:
                    ids, cost, calls = measure(daemon, sock, seq, args.rounds)
                    ids_rows += ids
                    cost_rows.append(cost)
                    calls_rows.append(calls)
                    print(*ids, cost, calls, sep="\n", flush=True)
            daemon_p50 = track_p50_us(daemon)
        finally:
            daemon.stop()
    body = (f"{stamp()}\n\n"
            + markdown_table(["sequence", "objects", "frames", "boxes", "IDF1", "IDP", "IDR", "id switches",
                              "ids given"], ids_rows)
            + "\n\n\"boxes given\": the sequence's detections straight to the processor (full boxes, 1 px noise, "
            "scored by how much of the object is in view, 3 % missed, a low-scored false alarm in one frame of "
            "ten); \"detector pipeline\": the frames as PNG through a daemon (brightness map → dbnet → track), "
            "scored against the visible boxes. IoU ≥ 0.5 counts a match; objects less than a quarter in view "
            "are not in the truth. Default options.\n\n"
            + markdown_table(["sequence", "regions a frame", "track µs p50", "track µs p99"], cost_rows)
            + f"\n\nThe `track` step's call in this process, best of {args.rounds} rounds per frame. In the daemon "
            f"(all sequences, through the `tracks` pipeline), the step's p50: {daemon_p50:.0f} µs.\n\n"
            + markdown_table(["sequence", "classifier calls, every frame",
                              *(f"reinfer_every = {n}" for n in EVERY),
                              "ms a frame, every frame", *(f"ms a frame, every {n}" for n in EVERY)], calls_rows)
            + "\n\nCalls: rows the secondary classifier computed (its own statistics), each tracked region's crop "
            "once per call; the three pipelines run each sequence in turn on one daemon, one frame at a time. "
            "Reproduce: `python tests/benchmarks/bench_tracking.py`.")
    print_and_write(SECTION, body, write=not args.no_write)


if __name__ == "__main__":
    main()
