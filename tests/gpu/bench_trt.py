"""QPS and latency of the TensorRT backend with 1, 2, ... contexts, driven
directly with one thread per context (no daemon, no sockets).

    python tests/gpu/bench_trt.py [--engine PLAN] [--seconds 3] [--contexts 1,2] [--batch 1]

Without --engine it builds the sample classifier with `infermux build`.
Prints one `BENCH ...` line per context count (run.sh collects them) and the
sizing verdict (docs/architecture.md#sizing-contexts): stop adding contexts when QPS grows by less than
30 % while p99 grows by more than 20 %. Ends with a `FIGURE:` line for run.sh;
exits 0 with a `SKIP:` line where there is no GPU or no TensorRT.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gpu_support import build_plan, gpu_missing, images

from infermux.plugins import backends


@dataclass(frozen=True)
class Result:
    """One run: `contexts` threads, each with its own context, for a fixed time."""

    contexts: int
    qps: float
    p50_us: float
    p99_us: float


def run(plan: Path, contexts: int, seconds: float, batch: int) -> Result:
    engine = backends.for_path(plan).load(plan, {})
    ctxs = [engine.create_context() for _ in range(contexts)]
    x = {"images": images(batch)}
    for ctx in ctxs:
        for _ in range(20):  # warm-up: first calls pay lazy initialisation
            ctx.infer(x)
    latencies: list[list[float]] = [[] for _ in ctxs]
    stop = threading.Event()

    def loop(ctx, out: list[float]) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            ctx.infer(x)
            out.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=loop, args=(c, out)) for c, out in zip(ctxs, latencies)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    engine.close()
    all_us = np.array([s for out in latencies for s in out]) * 1e6
    return Result(contexts, len(all_us) / elapsed, float(np.percentile(all_us, 50)),
                  float(np.percentile(all_us, 99)))


def verdict(previous: Result, current: Result) -> str:
    qps_gain = current.qps / previous.qps - 1
    p99_gain = current.p99_us / previous.p99_us - 1
    stop = qps_gain < 0.30 and p99_gain > 0.20
    return (f"{previous.contexts} -> {current.contexts} contexts: QPS {qps_gain:+.0%}, p99 {p99_gain:+.0%}: "
            + ("stop here (the sizing rule)" if stop else "worth it"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engine", type=Path, help="engine to run (default: build the sample classifier)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--contexts", default="1,2", help="comma-separated context counts")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)
    missing = gpu_missing()
    if missing:
        print(f"SKIP: bench: {missing}")
        return 0
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        print("SKIP: bench: TensorRT is not installed for this Python")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        plan = args.engine or build_plan(Path(tmp) / "model.plan")
        results = [run(plan, int(n), args.seconds, args.batch) for n in args.contexts.split(",")]
    for r in results:
        print(f"BENCH contexts={r.contexts} batch={args.batch} qps={r.qps:.0f} "
              f"p50_us={r.p50_us:.0f} p99_us={r.p99_us:.0f}")
    for previous, current in zip(results, results[1:]):
        print(verdict(previous, current))
    print("FIGURE: " + ", ".join(f"{r.contexts} ctx {r.qps:.0f} QPS p99 {r.p99_us / 1000:.2f} ms" for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
