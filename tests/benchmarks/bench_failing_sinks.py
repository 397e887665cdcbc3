"""Failing sinks against a camera and a plain client: the camera's frame rate and the client's p99 with
webhooks that answer 200 and with webhooks that answer 500 or never answer, their spools at their bound.

    python tests/benchmarks/bench_failing_sinks.py [--rounds 3] [--requests 500] [--no-write]

One daemon per round and case (tests/support/sinks.py's camera_and_webhooks: camera `front` at 10 fps
into a tracked pipeline with object events, the sample classifier, a `jsonl` sink and two webhooks),
rounds alternating the cases; in the failing case the measurement starts once both webhooks are down and
have dropped events. Measured: the frames the camera had served over the client's run, per second, and
the p50/p99 of `--requests` sequential 1-row requests to the classifier. Goal (the issue): the failing
case within 1.5x of the healthy one, for both.

Writes "## Failing sinks beside a camera and a client" in RESULTS.md unless --no-write.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402
from support import models, tracking  # noqa: E402
from support.camera_files import cameras, write_frames  # noqa: E402
from support.harness import Daemon  # noqa: E402
from support.polling import eventually  # noqa: E402
from support.sinks import Endpoint, camera_and_webhooks  # noqa: E402

SECTION = "Failing sinks beside a camera and a client"
FPS = 10


def one(case: str, requests: int) -> dict[str, float]:
    """One daemon of `case` ("healthy" or "failing"): the camera's served frames/s and the client's latency."""
    answers: list[int | None] = [200] if case == "healthy" else [500]
    failing, stuck = Endpoint(answers), Endpoint([200] if case == "healthy" else [None])
    with tempfile.TemporaryDirectory(prefix="bench_failing_sinks.") as folder:
        work = Path(folder)
        models.brightness_map(work / "engines" / "det" / "1" / "model.onnx")
        seq = tracking.crossing()
        clip = write_frames(work / "crossing.mp4", [seq.frame(i) for i in range(seq.length)], fps=FPS)
        d = Daemon(work, camera_and_webhooks(work, clip, FPS, failing.url, stuck.url)).start()
        try:
            return measure(d, case, requests)
        finally:
            d.stop()
            failing.close()
            stuck.close()


def measure(d: Daemon, case: str, requests: int) -> dict[str, float]:
    def ready() -> bool:
        with d.admin() as admin:
            sinks = {s["name"]: s for s in admin.call("sinks")["sinks"]}
        hooks = [sinks["failing"], sinks["stuck"]]
        if case == "failing":
            return all(s["state"] == "down" and s["dropped"] > 0 for s in hooks)
        return all(s["state"] == "up" and s["delivered"] > 5 for s in hooks)

    eventually(lambda: cameras(d)["front"]["served"] > 20, "the camera served", 60)
    eventually(ready, f"the {case} webhooks", 90)
    x = np.zeros((1, 3, 64, 64), np.float32)
    before, started, took = cameras(d)["front"], time.monotonic(), []
    with d.client() as client:
        for _ in range(requests):
            t = time.perf_counter()
            assert client.infer("classifier", {"images": x}).status == 200
            took.append(time.perf_counter() - t)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - started)))  # the camera's rate over 5 s at least
    after, seconds = cameras(d)["front"], time.monotonic() - started
    assert after["failed"] == before["failed"], after
    took.sort()
    return {"fps": (after["served"] - before["served"]) / seconds, "p50_ms": took[len(took) // 2] * 1e3,
            "p99_ms": took[min(len(took) - 1, int(len(took) * 0.99))] * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    got: dict[str, list[dict[str, float]]] = {"healthy": [], "failing": []}
    for r in range(args.rounds):
        for case in (("healthy", "failing") if r % 2 == 0 else ("failing", "healthy")):
            got[case].append(one(case, args.requests))
            print(r, case, got[case][-1], flush=True)
    med = {case: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for case, runs in got.items()}
    rows = [[case, f"{m['fps']:.2f}", f"{m['p50_ms']:.2f}", f"{m['p99_ms']:.2f}",
             ", ".join(f"{x['p99_ms']:.2f}" for x in got[case])] for case, m in med.items()]
    fps_ratio = med["healthy"]["fps"] / med["failing"]["fps"]
    p99_ratio = med["failing"]["p99_ms"] / med["healthy"]["p99_ms"]
    body = "\n\n".join([
        f"{stamp()} Command: `python tests/benchmarks/bench_failing_sinks.py --rounds {args.rounds} --requests "
        f"{args.requests}` (commit {os.popen('git rev-parse --short HEAD').read().strip()}), rounds alternating "
        "the cases, medians.",
        markdown_table(["webhooks", f"camera frames/s served (of {FPS})", "client p50 ms", "client p99 ms",
                        "p99 each round"], rows),
        f"The camera's rate, healthy over failing: **{fps_ratio:.2f}×**; the client's p99, failing over healthy: "
        f"**{p99_ratio:.2f}×** (goal: both ≤ 1.5×)."])
    print_and_write(SECTION, body, write=not args.no_write, titled=True)


if __name__ == "__main__":
    main()
