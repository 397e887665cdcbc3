"""The daemon against a bare ROUTER + onnxruntime loop, in one run on one machine.

    python tests/benchmarks/bench_core.py [--duration 3] [--rounds 5] [--no-write] [--against REV]

The sample classifier, one [1,3,64,64] float32 image per request, at
concurrency 1 and 16:

  a  backend   onnxruntime called in-process (1 intra-op thread; c threads,
               one context each): what the model costs with no I/O at all
  b  echo      ROUTER echo process on the same ipc transport, replies of the
               model's output size: the ceiling of transport + load generator
  c  bare      ROUTER + parse + onnxruntime + reply, no routing, one process:
               the baseline the daemon must reach ≥ 0.7× of
  d  daemon    `python -m infermux serve` (2 contexts), end to end
  d1 daemon    the same with 1 context, like the bare loop
  d1p daemon   d1 on pyzmq's socket calls (INFERMUX_WIRE=python), where d1
               runs the compiled ones (transport/wire.py): what they save
  e  daemon@REV with --against REV: the same daemon at another git revision,
               run beside d, so a change's cost is a ratio from one run

b, c and d are driven by the same load generator (`infermux.cli.bench.run_load`)
in its own process, so it never shares a GIL with the server under test; a
runs in that process too. Every server runs for the whole script and the
rounds interleave them, so a burst of load from elsewhere on the box hits
all cases alike; the table shows the median round (by QPS) and every
round's QPS, and each comparison is the median of the per-round ratios
(round i of one server against round i of the other, seconds apart) with
their range, so one noisy round cannot decide a goal.

A real model too: PP-OCR's text detector [1,3,320,320] from the
rapidocr-onnxruntime wheel (`engines/fetch_ppocr.py` puts it in
engines/ppocr/det.onnx; skipped when it is not there), bare loop against
the daemon with 1 context, at concurrency 4. Writes the
"## Core: daemon vs bare loop" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
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

from results import markdown_table, print_and_write, process_cpu_s, stamp, stop_server  # noqa: E402
from revision import describe, package_env  # noqa: E402

from infermux.cli.bench import BenchResult, run_load, wait_ready  # noqa: E402
from infermux.cli.infer import parse_inputs  # noqa: E402
from infermux.transport.wire import ENV as WIRE_ENV, choose  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PYZMQ_CALLS = {WIRE_ENV: "python"}  # d1p: the frontend on pyzmq's socket calls (transport/wire.py)
ENGINE = ROOT / "engines" / "classifier" / "1" / "model.onnx"
BASELINES = Path(__file__).resolve().parent / "baselines.py"
MODEL, SHAPE = "classifier", "images=1x3x64x64"
CONCURRENCY = (1, 16)
OCR_ENGINE = ROOT / "engines" / "ppocr" / "det.onnx"
OCR_MODEL, OCR_SHAPE, OCR_CONCURRENCY = "det", "x=1x3x320x320", 4
OCR_WARMUP = 8  # ~0.15 s a request on the 2-core box: the classifier's 200 would take half a minute
SECTION = "Core: daemon vs bare loop"
DAEMON_TOML = """\
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"

[[models]]
name = "{model}"
version = "1"
engine = "{engine}"
contexts = {contexts}
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


@dataclass(frozen=True)
class Served:
    """A server process under test: where it listens, and its pid (for its CPU time)."""

    endpoint: str
    pid: int


@contextlib.contextmanager
def serving(name: str, command: list[str], endpoint: str, log_dir: Path,
            env: dict[str, str] | None = None, model: str = MODEL, shape: str = SHAPE) -> Iterator[Served]:
    """Run a server process until the block ends; yield it once it answers 200."""
    log = open(log_dir / f"{name}.log", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                               env={**os.environ, **(env or {})})
    try:
        reply = wait_ready(endpoint, model, parse_inputs([], [shape], "float32"), timeout_s=60)
        if not reply.ok:
            raise RuntimeError(f"{name} answered {reply.status}: {reply.error}")
        yield Served(endpoint, process.pid)
    except Exception:
        log.flush()
        sys.stderr.write((log_dir / f"{name}.log").read_text()[-3000:])
        raise
    finally:
        stop_server(process)
        log.close()


def daemon_command(tmp: Path, name: str = "daemon", contexts: int = 2, model: str = MODEL,
                   engine: Path = ENGINE, extra: str = "") -> tuple[list[str], str]:
    """The daemon serving `engine` as `model` with `contexts` contexts, and where its socket will be.

    `extra`: more of the model's keys, as whole lines (`max_batch = 16`, ...); the config ends in its
    `[[models]]` table, so they are appended to its end."""
    config = tmp / f"{name}.toml"
    config.write_text(DAEMON_TOML.format(engines=ROOT / "engines", model=model, contexts=contexts,
                                         engine=engine.relative_to(ROOT / "engines")) + extra)
    run_dir = tmp / f"run-{name}"
    command = [sys.executable, "-m", "infermux", "serve", "--config", str(config), "--runtime-dir", str(run_dir),
               "--state-dir", str(tmp / f"state-{name}")]  # one daemon per state directory
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
    cpu_us: list[float]  # the server process's CPU time per request, each round (none for case a)

    @property
    def median_cpu_us(self) -> float | None:
        ordered = sorted(self.cpu_us)
        return ordered[(len(ordered) - 1) // 2] if ordered else None

    @property
    def median(self) -> BenchResult:
        ordered = sorted(self.rounds, key=lambda r: r.qps)
        return ordered[(len(ordered) - 1) // 2]


Round = tuple[BenchResult, float | None]  # the load generator's figures, the server's CPU µs per request
Case = tuple[tuple[int, ...], Callable[[int], Round]]  # concurrencies, run(c)


def cpu_per_request(served: Served, warmup: int, run: Callable[[], BenchResult]) -> Round:
    """Run one round and charge the server's CPU time over it (warm-up included) to its requests.

    CPU time, unlike QPS, is not stretched by the other tenants of a shared
    box taking the cores away (steal): it shows the serving cost itself.
    """
    before = process_cpu_s(served.pid)
    result = run()
    return result, (process_cpu_s(served.pid) - before) * 1e6 / max(1, result.requests + warmup)


def measure_all(args: argparse.Namespace, tmp: Path) -> list[Measured]:
    """All cases, rounds interleaved, with every server up for the whole run."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no GIL shared with anything here
    with ProcessPoolExecutor(1, mp_context=ctx) as generator, contextlib.ExitStack() as stack:
        def load(served: Served, model: str = MODEL, shape: str = SHAPE,
                 warmup: int = args.warmup) -> Callable[[int], Round]:
            inputs = parse_inputs([], [shape], "float32")
            return lambda c: cpu_per_request(served, warmup, lambda: generator.submit(
                run_load, served.endpoint, model, inputs, concurrency=c, duration_s=args.duration,
                warmup=warmup).result())

        cases: dict[str, Case] = {
            "a backend": (CONCURRENCY,
                          lambda c: (generator.submit(backend_direct, c, args.duration, args.warmup).result(), None))}
        echo_ep, bare_ep = f"ipc://{tmp}/echo.sock", f"ipc://{tmp}/bare.sock"
        echo = stack.enter_context(serving("echo", [sys.executable, str(BASELINES), "echo", echo_ep], echo_ep, tmp))
        cases["b echo"] = (CONCURRENCY, load(echo))
        bare = stack.enter_context(serving("bare", [sys.executable, str(BASELINES), "bare", bare_ep, str(ENGINE)],
                                           bare_ep, tmp))
        cases["c bare"] = (CONCURRENCY, load(bare))
        if daemon_available():
            for case, name, contexts, env in (("d daemon", "daemon", 2, None), ("d1 daemon", "daemon1", 1, None),
                                              ("d1p daemon", "daemon1p", 1, PYZMQ_CALLS)):
                command, daemon_ep = daemon_command(tmp, name, contexts)
                cases[case] = (CONCURRENCY, load(stack.enter_context(serving(name, command, daemon_ep, tmp, env))))
        if args.against:
            old_env = package_env(args.against, tmp / "against")
            command, old_ep = daemon_command(tmp, "against")
            cases["e daemon@REV"] = (CONCURRENCY, load(stack.enter_context(
                serving("against", command, old_ep, tmp, old_env))))
        cases.update(ocr_cases(stack, tmp, load) if OCR_ENGINE.is_file() and not args.no_ocr else {})
        return run_rounds(cases, args.rounds)


def ocr_cases(stack: contextlib.ExitStack, tmp: Path, load: Callable[..., Callable[[int], Round]]
              ) -> dict[str, Case]:
    """The PP-OCR detector: bare loop and daemon (1 context), both up for the whole run."""
    ocr = (OCR_MODEL, OCR_SHAPE, OCR_WARMUP)
    bare_ep = f"ipc://{tmp}/bare-ocr.sock"
    bare = stack.enter_context(serving("bare-ocr", [sys.executable, str(BASELINES), "bare", bare_ep,
                                                    str(OCR_ENGINE)], bare_ep, tmp, model=OCR_MODEL, shape=OCR_SHAPE))
    command, daemon_ep = daemon_command(tmp, "daemon-ocr", 1, OCR_MODEL, OCR_ENGINE)
    daemon = stack.enter_context(serving("daemon-ocr", command, daemon_ep, tmp, model=OCR_MODEL, shape=OCR_SHAPE))
    return {"f ocr bare": ((OCR_CONCURRENCY,), load(bare, *ocr)),
            "g ocr daemon": ((OCR_CONCURRENCY,), load(daemon, *ocr))}


def run_rounds(cases: dict[str, Case], rounds: int) -> list[Measured]:
    """Every case at each of its concurrencies, `rounds` times, the rounds interleaved."""
    results = {(case, c): Measured(case, c, [], []) for case, (levels, _) in cases.items() for c in levels}
    for round_ in range(rounds):
        for c in sorted({c for levels, _ in cases.values() for c in levels}):
            for case, (levels, run) in cases.items():
                if c not in levels:
                    continue
                result, cpu_us = run(c)
                results[case, c].rounds.append(result)
                if cpu_us is not None:
                    results[case, c].cpu_us.append(cpu_us)
                print(f"  round {round_ + 1}  {case:<12} c={c:<3} {result.qps:8,.0f}/s  "
                      f"p50 {result.p50_us:7.0f} µs  p99 {result.p99_us:7.0f} µs", file=sys.stderr)
    return list(results.values())


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def spread(values: list[float]) -> str:
    """Median and range of per-round ratios: `0.85× (0.80–0.91)`."""
    ordered = sorted(values)
    return f"{statistics.median(ordered):.2f}× ({ordered[0]:.2f}–{ordered[-1]:.2f})"


def _ratios(by_key: dict[tuple[str, int], Measured], case: str, base: str, levels: tuple[int, ...]) -> str:
    """`case` ÷ `base` at each concurrency, round by round (the rounds alternate between the two, so
    each ratio compares runs seconds apart): the median of those ratios and their range, for QPS,
    p50 and p99. One noisy round moves the range, not the verdict."""
    def per_round(c: int, figure: str) -> list[float]:
        pairs = zip(by_key[case, c].rounds, by_key[base, c].rounds)
        return [getattr(a, figure) / getattr(b, figure) for a, b in pairs if getattr(b, figure)]

    return ", ".join(f"c={c}: QPS **{spread(per_round(c, 'qps'))}**, p50 {spread(per_round(c, 'p50_us'))}, "
                     f"p99 {spread(per_round(c, 'p99_us'))}" for c in levels)


def cpu_line(cpu: dict[tuple[str, int], float | None], against: bool) -> str:
    """The server's CPU time per request, daemon ÷ bare loop (and ÷ the other revision's daemon)."""
    pairs = [("d1 daemon", "c bare", c) for c in CONCURRENCY] + [("d daemon", "c bare", c) for c in CONCURRENCY]
    pairs += [("g ocr daemon", "f ocr bare", OCR_CONCURRENCY)]
    pairs += [("d daemon", "e daemon@REV", c) for c in CONCURRENCY] if against else []
    parts = [f"{case.split()[0]} ÷ {base.split()[0]} c={c}: **{cpu[case, c] / cpu[base, c]:.2f}×** "
             f"({cpu[case, c]:,.0f} against {cpu[base, c]:,.0f} µs)"
             for case, base, c in pairs if cpu.get((case, c)) and cpu.get((base, c))]
    return ("Server CPU time per request (user + system of the server process over each round, warm-up "
            "included; median of the rounds): " + "; ".join(parts) + ".") if parts else ""


def ratio_lines(by_key: dict[tuple[str, int], Measured], args: argparse.Namespace) -> list[str]:
    """One line per comparison the run allows."""
    if ("d daemon", 1) not in by_key:
        return ["Daemon / bare loop: not run (the daemon core is not in this checkout)."]
    lines = [f"Daemon (2 contexts) / bare loop, per-round ratios (median and range of {args.rounds} rounds): "
             f"{_ratios(by_key, 'd daemon', 'c bare', CONCURRENCY)}. Target: ≥ 0.7× QPS.",
             f"Daemon (1 context, as the bare loop) / bare loop: "
             f"{_ratios(by_key, 'd1 daemon', 'c bare', CONCURRENCY)}. "
             "Goals: ≥ 0.9× QPS at c=1, ≥ 0.8× QPS and ≤ 1.3× p99 at c=16."]
    lines.append(f"Daemon (1 context), compiled socket calls / pyzmq's (d1 / d1p, same run): "
                 f"{_ratios(by_key, 'd1 daemon', 'd1p daemon', CONCURRENCY)}; d1 ran {choose().describe()}.")
    if ("g ocr daemon", OCR_CONCURRENCY) in by_key:
        lines.append(f"PP-OCR detector, daemon (1 context) / bare loop: "
                     f"{_ratios(by_key, 'g ocr daemon', 'f ocr bare', (OCR_CONCURRENCY,))}. Goal: ≥ 0.95×.")
    if ("e daemon@REV", 1) in by_key:
        lines.append("This checkout / " + describe(args.against) + " (e, same run): "
                     + _ratios(by_key, "d daemon", "e daemon@REV", CONCURRENCY) + ".")
    return lines


def report(measured: list[Measured], args: argparse.Namespace, load: tuple[float, float]) -> str:
    """The RESULTS.md section: table, ratios, conditions."""
    rows = []
    for m in sorted(measured, key=lambda m: (m.concurrency, m.case)):
        r = m.median
        rows.append([m.case, str(m.concurrency), f"{r.qps:,.0f}", _us(r.p50_us), _us(r.p90_us), _us(r.p99_us),
                     _us(m.median_cpu_us), str(sum(x.errors for x in m.rounds)),
                     " / ".join(f"{x.qps:,.0f}" for x in m.rounds)])
    table = markdown_table(["case", "c", "QPS", "p50 µs", "p90 µs", "p99 µs", "server CPU µs/req", "errors",
                            "QPS per round"], rows)
    by_key = {(m.case, m.concurrency): m for m in measured}
    cpu = {(m.case, m.concurrency): m.median_cpu_us for m in measured}
    verdict = "\n\n".join(line for line in [*ratio_lines(by_key, args), cpu_line(cpu, bool(args.against))] if line)
    return "\n".join([
        stamp(),
        f"1-min load average {load[0]:.2f} before the run, {load[1]:.2f} after (this script keeps ~2 busy); "
        "the box is shared, so other work can skew single rounds.",
        "",
        f"Sample classifier, one [1,3,64,64] float32 image per request (48 KiB in, 40 B out), ipc transport; "
        f"f/g: PP-OCR's text detector (rapidocr-onnxruntime), one [1,3,320,320] image (1.2 MB in, 400 KB out). "
        f"{args.rounds} rounds × {args.duration:g} s per case after {args.warmup} warm-up requests; "
        "median round shown (by QPS). Latency is the client's round trip (for a: the backend call).",
        "",
        table,
        "",
        verdict,
        "",
        "a = onnxruntime in-process (c threads, one context each); b = ROUTER echo process (transport + "
        "generator ceiling); c = ROUTER + protocol parse + onnxruntime, one process, no routing; "
        "d = `infermux serve`, 2 contexts; d1 = the same, 1 context; d1p = d1 with pyzmq's socket calls "
        "(INFERMUX_WIRE=python) where d1 runs the compiled ones; f = c on the PP-OCR detector; "
        "g = d1 on it. b–g share one load generator (`infermux.cli.bench.run_load`: one "
        "DEALER, c requests in flight) in its own process.",
        "Reproduce: `python tests/benchmarks/bench_core.py`.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per case and round (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up requests per case and round")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--no-ocr", action="store_true", help="leave out the PP-OCR detector rows (f, g)")
    parser.add_argument("--against", metavar="REV", help="also run the daemon at git revision REV (case e)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="imx-core-") as tmp:  # short: ipc paths are limited to ~100 bytes
        measured = measure_all(args, Path(tmp))
    body = report(measured, args, (load_before, os.getloadavg()[0]))
    took = time.monotonic() - started
    print_and_write(SECTION, body, write=not args.no_write, titled=True)
    print(f"\n(took {took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
