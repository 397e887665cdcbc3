"""The fast path's own cost, in-process: CPU a request and calls a request, against another revision.

    python tests/benchmarks/bench_fast_path.py [--against REV] [--rounds 6] [--requests 10000]

One `Server` (no event loop) serves the `add_one` test model, whose compute
is a few µs, so what is measured is the Python around it: the general
frontend's `Server._handle` on a repeated plain request (parse from its
layout, `Router.admit_fast`, the compute and its reply) and the express
lane's `ExpressLane.serve` on the same request (what `_wire.serve` calls
for each message), the replies sent nowhere. Each round is one process per
revision, the revisions alternating, and reports the frontend thread's CPU
time a request (`time.thread_time_ns`, the least of 3 passes) and, once,
the Python calls a request (cProfile), which do not depend on the box's
load. Prints only; the figures go in RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

from revision import ROOT, describe, package_env  # noqa: E402

WORKER = "--measure"  # the child process's own mode


def measure(requests: int, count_calls: bool) -> None:
    """In this process (the revision on sys.path): print `admit_fast µs express µs [calls calls]`."""
    import cProfile
    import pstats
    import threading
    import time

    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from infermux import config as cfg
    from infermux.frontend.server import Server
    from infermux.protocol import encode_request
    from support.models import add_one

    tmp = Path(tempfile.mkdtemp(prefix="imx-fast-"))
    add_one(tmp / "engines" / "plain" / "1" / "model.onnx")
    text = (f'[daemon]\nlisten = ["ipc://{tmp}/infer.sock"]\nengine_dir = "{tmp / "engines"}"\nwatch = false\n'
            'inline_max_us = 1000000\ninline_busy_max_us = 1000000\n'
            '[[models]]\nname = "plain"\nversion = "1"\nengine = "plain/1/model.onnx"\n')
    server = Server(cfg.parse(text, tmp / "infermux.toml"), tmp / "run")
    server.bind()
    server.start_models().join()
    server._frontend_thread = threading.get_ident()
    server._send = lambda frames, envelope=None: None  # type: ignore[method-assign]
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    body = [bytes(memoryview(f)) for f in encode_request("plain", {"x": x}, id=7)]
    for _ in range(200):  # the layout learnt, the tensors accepted, the estimates warm
        server._handle([b"peer", b"", *body], False)
    layout, lane = server.parses.layout, server.express
    assert layout is not None and lane is not None, "no layout learnt, or no express lane (compiled calls?)"
    lane._room = 1 << 19  # as `run` sets it for a burst
    frames = [b"peer", b"", *body]

    def general(n: int) -> None:
        for _ in range(n):
            server._handle([b"peer", b"", *body], False)

    def express(n: int) -> None:
        for _ in range(n // 64):  # bursts of 64, settled after each as `run` does
            for _ in range(64):
                lane.serve(layout, b"7", frames, 2)
            for executor in lane._computed:
                executor.settle()
            lane._computed.clear()

    def cpu_us(run: object) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.thread_time_ns()
            run(requests)  # type: ignore[operator]
            best = min(best, (time.thread_time_ns() - start) / requests / 1000)
        return best

    line = f"{cpu_us(general):.2f} {cpu_us(express):.2f}"
    if count_calls:
        for run in (general, express):
            profile = cProfile.Profile()
            profile.enable()
            run(2048)
            profile.disable()
            line += f" {sum(v[1] for v in pstats.Stats(profile).stats.values()) / 2048:.2f}"  # type: ignore[attr-defined]
    print(line, flush=True)
    server.registry.close(5.0)
    server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="also measure git revision REV, rounds alternating")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=10000, help="requests a pass (3 passes a round)")
    parser.add_argument(WORKER, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.requests, args.calls)
        return 0
    with tempfile.TemporaryDirectory(prefix="imx-fastrev-") as tmp:
        builds = {"this checkout": {}}
        if args.against:
            builds[describe(args.against)] = package_env(args.against, Path(tmp))
        figures: dict[str, list[list[float]]] = {name: [] for name in builds}
        for index in range(args.rounds):
            for name, env in builds.items():
                command = [sys.executable, __file__, WORKER, "--requests", str(args.requests)]
                run = subprocess.run(command + (["--calls"] if index == 0 else []), env={**os.environ, **env},
                                     capture_output=True, text=True, check=True, cwd=ROOT)
                figures[name].append([float(v) for v in run.stdout.split()])
                print(f"round {index + 1}  {name}: {run.stdout.strip()}", flush=True)
    for name, rounds in figures.items():
        calls = f", calls a request {rounds[0][2]:.1f} and {rounds[0][3]:.1f}" if len(rounds[0]) > 2 else ""
        print(f"{name}: admit_fast {statistics.median(r[0] for r in rounds):.2f} µs, "
              f"express {statistics.median(r[1] for r in rounds):.2f} µs (medians of {len(rounds)} rounds){calls}")
    if len(figures) == 2:
        mine, theirs = figures.values()
        for i, what in enumerate(("admit_fast", "express")):
            ratios = sorted(m[i] / t[i] for m, t in zip(mine, theirs))
            print(f"this checkout / {args.against}, {what}: median per-round ratio {statistics.median(ratios):.3f} "
                  f"({ratios[0]:.3f}–{ratios[-1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
