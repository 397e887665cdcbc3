"""Issue 2: the daemon against a bare ROUTER + onnxruntime loop, in one run on one machine.

    python tests/benchmarks/bench_core.py [--duration 3] [--rounds 3] [--no-write] [--against REV]

The sample classifier, one [1,3,64,64] float32 image per request, at
concurrency 1 and 16:

  a  backend   onnxruntime called in-process (1 intra-op thread; c threads,
               one context each): what the model costs with no I/O at all
  b  echo      ROUTER echo process on the same ipc transport, replies of the
               model's output size: the ceiling of transport + load generator
  c  bare      ROUTER + parse + onnxruntime + reply, no routing, one process:
               the baseline the daemon must reach ≥ 0.7× of
  d  daemon    `python -m infermux serve` (2 contexts), end to end
  e  daemon@REV with --against REV: the same daemon at another git revision,
               run beside d, so a change's cost is a ratio from one run

b, c and d are driven by the same load generator (`infermux.cli.bench.run_load`)
in its own process, so it never shares a GIL with the server under test; a
runs in that process too. Every server runs for the whole script and the
rounds interleave them, so a burst of load from elsewhere on the box hits
all cases alike; the table shows the median round (by QPS) and every
round's QPS. Writes the "## Core: daemon vs bare loop (issue 2)" section of
RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import markdown_table, stamp, stop_server, write_section  # noqa: E402
from revision import describe, package_env  # noqa: E402

from infermux.cli.bench import BenchResult, run_load, wait_ready  # noqa: E402
from infermux.cli.infer import parse_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engines" / "classifier" / "1" / "model.onnx"
BASELINES = Path(__file__).resolve().parent / "baselines.py"
MODEL, SHAPE = "classifier", "images=1x3x64x64"
CONCURRENCY = (1, 16)
SECTION = "Core: daemon vs bare loop (issue 2)"
DAEMON_TOML = """\
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"

[[models]]
name = "classifier"
version = "1"
engine = "classifier/1/model.onnx"
contexts = 2
"""


def backend_direct(concurrency: int, duration_s: float, warmup: int) -> BenchResult:
    """Case a: `concurrency` threads, each calling its own onnxruntime context in a closed loop."""
    from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend

    engine = OnnxRuntimeBackend().load(ENGINE, {"intra_op_num_threads": 1})
    contexts = [engine.create_context() for _ in range(concurrency)]
    inputs = parse_inputs([], [SHAPE], "float32")
    latencies: list[list[int]] = [[] for _ in contexts]
    start_line = threading.Barrier(concurrency + 1)
    stop = threading.Event()

    def work(context, out: list[int]) -> None:
        for _ in range(warmup):
            context.infer(inputs)
        start_line.wait()
        clock = time.perf_counter_ns
        while not stop.is_set():
            t0 = clock()
            context.infer(inputs)
            out.append(clock() - t0)

    threads = [threading.Thread(target=work, args=(c, out)) for c, out in zip(contexts, latencies)]
    for t in threads:
        t.start()
    start_line.wait()
    start = time.perf_counter_ns()
    time.sleep(duration_s)
    stop.set()
    for t in threads:
        t.join()
    merged = [v for out in latencies for v in out]
    return BenchResult.from_latencies("in-process", MODEL, concurrency, merged, {200: len(merged)},
                                      (time.perf_counter_ns() - start) / 1e9)


@contextlib.contextmanager
def serving(name: str, command: list[str], endpoint: str, log_dir: Path,
            env: dict[str, str] | None = None) -> Iterator[str]:
    """Run a server process until the block ends; yield its endpoint once it answers 200."""
    log = open(log_dir / f"{name}.log", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                               env={**os.environ, **(env or {})})
    try:
        reply = wait_ready(endpoint, MODEL, parse_inputs([], [SHAPE], "float32"), timeout_s=60)
        if not reply.ok:
            raise RuntimeError(f"{name} answered {reply.status}: {reply.error}")
        yield endpoint
    except Exception:
        log.flush()
        sys.stderr.write((log_dir / f"{name}.log").read_text()[-3000:])
        raise
    finally:
        stop_server(process)
        log.close()


def daemon_command(tmp: Path, name: str = "daemon") -> tuple[list[str], str]:
    """The daemon with the issue-2 config, and where its socket will be."""
    config = tmp / f"{name}.toml"
    config.write_text(DAEMON_TOML.format(engines=ROOT / "engines"))
    run_dir = tmp / f"run-{name}"
    command = [sys.executable, "-m", "infermux", "serve", "--config", str(config), "--runtime-dir", str(run_dir)]
    return command, f"ipc://{run_dir}/infer.sock"


def daemon_available() -> bool:
    """The daemon core (infermux.cli.serve) is in this checkout."""
    import importlib.util

    return importlib.util.find_spec("infermux.cli.serve") is not None


@dataclass
class Measured:
    """Every round of one case at one concurrency."""

    case: str
    concurrency: int
    rounds: list[BenchResult]

    @property
    def median(self) -> BenchResult:
        ordered = sorted(self.rounds, key=lambda r: r.qps)
        return ordered[(len(ordered) - 1) // 2]


def measure_all(args: argparse.Namespace, tmp: Path) -> list[Measured]:
    """All cases, rounds interleaved, with every server up for the whole run."""
    inputs = parse_inputs([], [SHAPE], "float32")
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no GIL shared with anything here
    with ProcessPoolExecutor(1, mp_context=ctx) as generator, contextlib.ExitStack() as stack:
        def load(endpoint: str) -> Callable[[int], BenchResult]:
            return lambda c: generator.submit(run_load, endpoint, MODEL, inputs, concurrency=c,
                                              duration_s=args.duration, warmup=args.warmup).result()

        cases: dict[str, Callable[[int], BenchResult]] = {
            "a backend": lambda c: generator.submit(backend_direct, c, args.duration, args.warmup).result()}
        echo_ep, bare_ep = f"ipc://{tmp}/echo.sock", f"ipc://{tmp}/bare.sock"
        stack.enter_context(serving("echo", [sys.executable, str(BASELINES), "echo", echo_ep], echo_ep, tmp))
        cases["b echo"] = load(echo_ep)
        stack.enter_context(serving("bare", [sys.executable, str(BASELINES), "bare", bare_ep, str(ENGINE)],
                                    bare_ep, tmp))
        cases["c bare"] = load(bare_ep)
        if daemon_available():
            command, daemon_ep = daemon_command(tmp)
            stack.enter_context(serving("daemon", command, daemon_ep, tmp))
            cases["d daemon"] = load(daemon_ep)
        if args.against:
            old_env = package_env(args.against, tmp / "against")
            command, old_ep = daemon_command(tmp, "against")
            stack.enter_context(serving("against", command, old_ep, tmp, old_env))
            cases["e daemon@REV"] = load(old_ep)
        results = {(case, c): Measured(case, c, []) for case in cases for c in CONCURRENCY}
        for round_ in range(args.rounds):
            for c in CONCURRENCY:
                for case, run in cases.items():
                    result = run(c)
                    results[case, c].rounds.append(result)
                    print(f"  round {round_ + 1}  {case:<9} c={c:<3} {result.qps:8,.0f}/s  "
                          f"p50 {result.p50_us:7.0f} µs  p99 {result.p99_us:7.0f} µs", file=sys.stderr)
    return list(results.values())


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def report(measured: list[Measured], args: argparse.Namespace, load: tuple[float, float]) -> str:
    """The RESULTS.md section: table, ratios, conditions."""
    rows = []
    for m in sorted(measured, key=lambda m: (m.concurrency, m.case)):
        r = m.median
        rows.append([m.case, str(m.concurrency), f"{r.qps:,.0f}", _us(r.p50_us), _us(r.p90_us), _us(r.p99_us),
                     str(sum(x.errors for x in m.rounds)), " / ".join(f"{x.qps:,.0f}" for x in m.rounds)])
    table = markdown_table(["case", "c", "QPS", "p50 µs", "p90 µs", "p99 µs", "errors", "QPS per round"], rows)
    by_key = {(m.case, m.concurrency): m.median for m in measured}
    if ("d daemon", 1) in by_key:
        ratios = ", ".join(
            f"c={c}: **{by_key['d daemon', c].qps / by_key['c bare', c].qps:.2f}×** QPS, "
            f"p50 {by_key['d daemon', c].p50_us / by_key['c bare', c].p50_us:.2f}×"
            for c in CONCURRENCY)
        verdict = f"Daemon / bare loop (medians): {ratios}. Target: ≥ 0.7× QPS."
    else:
        verdict = "Daemon / bare loop: not run (the daemon core is not in this checkout)."
    if ("e daemon@REV", 1) in by_key:
        verdict += "\n\nThis checkout / " + describe(args.against) + " (e, same run): " + ", ".join(
            f"c={c}: **{by_key['d daemon', c].qps / by_key['e daemon@REV', c].qps:.2f}×** QPS, "
            f"p99 {by_key['d daemon', c].p99_us / by_key['e daemon@REV', c].p99_us:.2f}×" for c in CONCURRENCY) + "."
    return "\n".join([
        stamp(),
        f"1-min load average {load[0]:.2f} before the run, {load[1]:.2f} after (this script keeps ~2 busy); "
        "the box is shared, so other work can skew single rounds.",
        "",
        f"Sample classifier, one [1,3,64,64] float32 image per request (48 KiB in, 40 B out), ipc transport. "
        f"{args.rounds} rounds × {args.duration:g} s per case after {args.warmup} warm-up requests; "
        "median round shown (by QPS). Latency is the client's round trip (for a: the backend call).",
        "",
        table,
        "",
        verdict,
        "",
        "a = onnxruntime in-process (c threads, one context each); b = ROUTER echo process (transport + "
        "generator ceiling); c = ROUTER + protocol parse + onnxruntime, one process, no routing; "
        "d = `infermux serve`, 2 contexts. b–d share one load generator (`infermux.cli.bench.run_load`: one "
        "DEALER, c requests in flight) in its own process.",
        "Reproduce: `python tests/benchmarks/bench_core.py`.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per case and round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up requests per case and round")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--against", metavar="REV", help="also run the daemon at git revision REV (case e)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="imx-core-") as tmp:  # short: ipc paths are limited to ~100 bytes
        measured = measure_all(args, Path(tmp))
    body = report(measured, args, (load_before, os.getloadavg()[0]))
    print(f"\n## {SECTION}\n\n{body}\n\n(took {time.monotonic() - started:.0f} s)")
    if not args.no_write:
        write_section(SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
