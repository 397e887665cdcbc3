"""Contexts sharing one onnxruntime session against a session per context, in one run.

    python tests/benchmarks/bench_shared_weights.py [--duration 2] [--rounds 5] [--no-write]

Two models: the sample classifier (a few µs of compute, 48 KiB in) and a
96 MiB one-MatMul model ([1,4096] x [4096,6144], generated in a temporary
folder: almost all weights). Each is served by two daemons with 4 contexts,
one with `share_session = true` (the CPU default: one copy of the weights)
and one with `share_session = false` (a session, and a copy, per context);
both stay up for the whole run and the rounds alternate between them at
concurrency 1, 4 and 16, so they meet the same load from elsewhere on the
box. Then each daemon's RSS and the memory_bytes it reports, beside a
daemon with 1 context. Writes the "## Shared weights" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_core import ENGINE, Measured, Round, cpu_per_request, run_rounds, serving  # noqa: E402
from results import markdown_table, print_and_write, stamp  # noqa: E402
from support.models import one_matmul  # noqa: E402

from infermux.cli.bench import run_load  # noqa: E402
from infermux.cli.infer import parse_inputs  # noqa: E402
from infermux.client import AdminClient  # noqa: E402

SECTION = "Shared weights"
LEVELS = (1, 4, 16)
TOML = """\
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
watch = false

[[models]]
name = "{model}"
version = "1"
engine = "{engine}"
contexts = {contexts}

[models.options]
share_session = {shared}
"""


def daemon(stack: contextlib.ExitStack, tmp: Path, name: str, model: str, engine: Path, shape: str,
           contexts: int, shared: bool) -> tuple[str, int, Path]:
    """Start a daemon for the run; its endpoint, pid and runtime dir."""
    config = tmp / f"{name}.toml"
    config.write_text(TOML.format(engines=engine.parent, model=model, engine=engine, contexts=contexts,
                                  shared=str(shared).lower()))
    run_dir = tmp / f"run-{name}"
    command = [sys.executable, "-m", "infermux", "serve", "--config", str(config), "--runtime-dir", str(run_dir),
               "--state-dir", str(tmp / f"state-{name}")]  # one daemon per state directory
    served = stack.enter_context(serving(name, command, f"ipc://{run_dir}/infer.sock", tmp, model=model,
                                         shape=shape))
    return served.endpoint, served.pid, run_dir


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reported_mib(run_dir: Path, model: str) -> float:
    with AdminClient(f"ipc://{run_dir}/admin.sock", timeout_s=10) as admin:
        rows = {m["name"]: m for m in admin.call("status")["models"]}
    return rows[model]["memory_bytes"] / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="imx-sw-") as tmp_name:
        tmp = Path(tmp_name)
        big = one_matmul(tmp / "big" / "1" / "model.onnx")
        models = [("classifier", ENGINE, "images=1x3x64x64"), ("big", big, "x=1x4096")]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=ctx) as generator, contextlib.ExitStack() as stack:
            cases, memory = {}, []
            for model, engine, shape in models:
                inputs = parse_inputs([], [shape], "float32")
                daemons = {}
                for label, contexts, shared in (("shared", 4, True), ("per-context", 4, False),
                                                ("1 context", 1, True)):
                    daemons[label] = daemon(stack, tmp, f"{model}-{label.replace(' ', '')}", model, engine,
                                            shape, contexts, shared)
                for label in ("shared", "per-context"):
                    endpoint, pid, _ = daemons[label]
                    cases[f"{model} {label}"] = (LEVELS, _load(generator, endpoint, pid, model, inputs, args))
                memory.append((model, engine.stat().st_size / 2**20, daemons))
            measured = run_rounds(cases, args.rounds)
            rows = [(model, size, label, rss_mib(pid), reported_mib(run_dir, model))
                    for model, size, daemons in memory for label, (_, pid, run_dir) in daemons.items()]
    body = report(measured, rows, args)
    print_and_write(SECTION, body, write=not args.no_write, titled=True)
    return 0


def _load(generator: ProcessPoolExecutor, endpoint: str, pid: int, model: str, inputs, args):  # type: ignore[no-untyped-def]
    from bench_core import Served

    served = Served(endpoint, pid)

    def run(c: int) -> Round:
        return cpu_per_request(served, args.warmup, lambda: generator.submit(
            run_load, endpoint, model, inputs, concurrency=c, duration_s=args.duration,
            warmup=args.warmup).result())
    return run


def report(measured: list[Measured], memory: list[tuple[str, float, str, float, float]],
           args: argparse.Namespace) -> str:
    by = {(m.case, m.concurrency): m for m in measured}
    rows = []
    for model in dict.fromkeys(m.case.split()[0] for m in measured):
        for c in LEVELS:
            shared, own = by[f"{model} shared", c], by[f"{model} per-context", c]
            ratios = sorted(s.qps / o.qps for s, o in zip(shared.rounds, own.rounds))
            rows.append([model, str(c), f"{shared.median.qps:,.0f}", f"{own.median.qps:,.0f}",
                         f"**{statistics.median(ratios):.2f}×** ({ratios[0]:.2f}–{ratios[-1]:.2f})",
                         f"{shared.median.p99_us:,.0f}", f"{own.median.p99_us:,.0f}",
                         str(sum(r.errors for r in shared.rounds + own.rounds))])
    qps = markdown_table(["model", "c", "QPS shared", "QPS per-context", "shared ÷ per-context (median of "
                          "rounds, range)", "p99 µs shared", "p99 µs per-context", "errors"], rows)
    mem = markdown_table(["model", "file MiB", "daemon", "RSS MiB", "reported memory_bytes MiB"],
                         [[m, f"{size:.2f}", label, f"{rss:,.0f}", f"{rep:,.1f}"]
                          for m, size, label, rss, rep in memory])
    return "\n".join([
        stamp(), "",
        f"4 contexts, `share_session = true` (one session: the default on CPU) against `false` (a session per "
        f"context, as before), both daemons up for the whole run, {args.rounds} alternating rounds × "
        f"{args.duration:g} s per case after {args.warmup} warm-up requests; median round and the per-round "
        "ratios' median and range. big = [1,4096] x [4096,6144] MatMul (96 MiB of weights).", "",
        qps, "",
        "Memory after the rounds (RSS from /proc, memory_bytes from `status`), beside a daemon with 1 context:", "",
        mem, "",
        "Reproduce: `python tests/benchmarks/bench_shared_weights.py`.",
    ])


if __name__ == "__main__":
    sys.exit(main())
