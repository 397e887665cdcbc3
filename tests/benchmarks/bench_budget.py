"""Where a request's CPU time goes, by process, and what is left for a compiled receive loop.

    python tests/benchmarks/bench_budget.py [--concurrency 64] [--duration 3] [--rounds 7] [--no-write]

The sample classifier, one [1,3,64,64] float32 image a request, driven by
infermux's load generator (`run_load`, in its own process) against five
servers on ipc, rounds alternating between them:

  echo         baselines.py's echo server: Python receives and replies, no work
  C echo       echo.c, the same replies from a loop with no interpreter, on
               the libzmq that pyzmq loads (built here with the system's cc;
               left out, and said so, where there is none)
  bare loop    baselines.py's bare loop: receive, parse, onnxruntime, reply
  C bare loop  the same with its receive, parse and reply in C (bare.c), calling
               the same onnxruntime context through Python (left out as above)
  daemon       `infermux serve` with 1 context, as the bare loop, on the compiled
               socket calls where they are built (transport/wire.py)
  daemon, pyzmq calls   the same on pyzmq's calls (INFERMUX_WIRE=python)
  daemon, batched       the batched daemon of bench_pytriton.py (2 contexts,
               max_batch 16, 200 µs): the frontend thread hands compute to
               the executors' threads

For each: QPS, and CPU time per request of the server process and of the
load generator's process (user + system, every thread, ZeroMQ's I/O
threads included), and the server's busiest thread and ZeroMQ I/O threads
alone (a thread is on one core at a time, so the busiest caps the QPS);
beside them, onnxruntime's own call, timed in one process. CPU time is
not stretched by other tenants as QPS is.

The verdict answers one question: to answer the `--target` QPS on this box
(default: 5 × PyTriton's QPS at this concurrency, from RESULTS.md's peer
comparison), how many µs of CPU a request may cost, and how many of those
are left once the load generator, the compiled loop's receive and reply,
and onnxruntime's call are paid. That is the budget a compiled fast path
would have for parsing, routing, statistics and the reply header. It then
says how near the C bare loop came to the target, and its QPS against the
Python bare loop's round by round (median and range).
Writes the "## CPU per request, by process" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import (BASELINES, ENGINE, MODEL, PYZMQ_CALLS, SHAPE, cpu_per_request, daemon_command,  # noqa: E402
                        serving)
from bench_pytriton import CONFIGURATIONS, SECTION as PEER  # noqa: E402
from compiled import build_bare, build_echo  # noqa: E402
from results import RESULTS, markdown_table, print_and_write, stamp, thread_cpu_s  # noqa: E402

from infermux.cli.bench import BenchResult, run_load  # noqa: E402
from infermux.cli.infer import parse_inputs  # noqa: E402
from infermux.transport.wire import choose  # noqa: E402

SECTION = "CPU per request, by process"


@dataclass(frozen=True)
class Round:
    """One round of one server: the load generator's figures and both processes' CPU µs per request."""

    result: BenchResult
    server_us: float
    generator_us: float
    threads: Threads


@dataclass(frozen=True)
class Threads:
    """The server's CPU µs a request on its busiest thread, and on ZeroMQ's I/O threads together.

    A thread runs on one core at a time, so the busiest thread's cost caps
    the server at 1e6 / busiest_us requests a second however many cores
    are free: in a Python server, the thread that holds the request path.
    """

    busiest_us: float
    io_us: float


def thread_split(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                 requests: int) -> Threads:
    """Each thread's CPU over a round (threads that ended are not counted), charged to its requests."""
    spent = {tid: (name, cpu - before.get(tid, (name, 0.0))[1]) for tid, (name, cpu) in after.items()}
    io = sum(s for name, s in spent.values() if name.startswith("ZMQbg/IO"))
    busiest = max((s for name, s in spent.values() if not name.startswith("ZMQbg/")), default=0.0)
    return Threads(busiest * 1e6 / max(1, requests), io * 1e6 / max(1, requests))


def timed_load(endpoint: str, inputs: Mapping[str, Any], concurrency: int, duration_s: float,
               warmup: int) -> tuple[BenchResult, float]:
    """run_load in the generator's process, with that process's CPU seconds over the measured part."""
    run_load(endpoint, MODEL, inputs, concurrency=concurrency, count=warmup)
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = run_load(endpoint, MODEL, inputs, concurrency=concurrency, duration_s=duration_s)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return result, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def onnxruntime_call_us(calls: int = 2000, rounds: int = 5) -> float:
    """CPU µs of one context's call on one image, best of `rounds` (1 intra-op thread, as every server here)."""
    from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend

    context = OnnxRuntimeBackend().load(ENGINE, {"intra_op_num_threads": 1}).create_context()
    inputs = parse_inputs([], [SHAPE], "float32")
    for _ in range(200):
        context.infer(inputs)
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            context.infer(inputs)
        best = min(best, (time.process_time() - start) / calls * 1e6)
    return best


def peer_qps(concurrency: int, results: Path = RESULTS) -> float | None:
    """PyTriton's QPS at `concurrency` in RESULTS.md's peer comparison table, if it is there."""
    text = results.read_text() if results.exists() else ""
    heading = f"## {PEER}\n"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0] if heading in text else ""
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("|")]
    if len(rows) < 3:
        return None
    column = [c.strip() for c in rows[0]].index("PyTriton QPS")
    for row in rows[2:]:
        if row[0].strip() == str(concurrency):
            return float(re.sub(r"[^0-9.]", "", row[column]))
    return None


Server = tuple[list[str], str, dict[str, str] | None]  # command, endpoint, environment added


def servers(tmp: Path) -> tuple[dict[str, Server], list[str]]:
    """Each server's command, endpoint and environment, in the order they run; and the compiled ones left
    out, with why."""
    py = [sys.executable, str(BASELINES)]
    echo, bare = build_echo(tmp), build_bare(tmp)
    commands: dict[str, Callable[[str], list[str]] | None] = {
        "echo": lambda endpoint: [*py, "echo", endpoint],
        "C echo": (lambda endpoint: [str(echo.path), endpoint]) if echo.path else None,
        "bare loop": lambda endpoint: [*py, "bare", endpoint, str(ENGINE)],
        "C bare loop": ((lambda endpoint: [*py, "compiled-bare", endpoint, str(ENGINE), str(bare.path)])
                        if bare.path else None),
    }
    chosen: dict[str, Server] = {}
    for name, command in commands.items():
        if command is not None:
            endpoint = f"ipc://{tmp}/{name.replace(' ', '-')}.sock"
            chosen[name] = (command(endpoint), endpoint, None)
    chosen["daemon"] = (*daemon_command(tmp, contexts=1), None)
    if choose().compiled:  # else "daemon" runs pyzmq's calls already
        chosen["daemon, pyzmq calls"] = (*daemon_command(tmp, "daemon-pyzmq", contexts=1), PYZMQ_CALLS)
    _, contexts, batching = CONFIGURATIONS[-1]  # the batched daemon of the PyTriton comparison
    chosen["daemon, batched"] = (*daemon_command(tmp, "daemon-batched", contexts=contexts, extra=batching), None)
    missing = [f"{name} left out: {built.missing}." for name, built in (("C echo", echo), ("C bare loop", bare))
               if built.path is None]
    return chosen, missing


def measure(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, list[Round]], list[str]]:
    """Every server's rounds, alternating; and which compiled servers are missing, and why."""
    chosen, missing = servers(tmp)
    order = list(chosen)
    endpoints = {name: endpoint for name, (_, endpoint, _) in chosen.items()}
    inputs = parse_inputs([], [SHAPE], "float32")
    rounds: dict[str, list[Round]] = {name: [] for name in order}
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as generator, \
            contextlib.ExitStack() as stack:
        served = {name: stack.enter_context(serving(name, command, endpoint, tmp, env))
                  for name, (command, endpoint, env) in chosen.items()}
        for k in range(args.rounds):
            for name in order:
                generator_s: list[float] = []

                def run(name: str = name) -> BenchResult:
                    result, seconds = generator.submit(timed_load, endpoints[name], inputs, args.concurrency,
                                                       args.duration, args.warmup).result()
                    generator_s.append(seconds)
                    return result

                before = thread_cpu_s(served[name].pid)
                result, server_us = cpu_per_request(served[name], args.warmup, run)
                threads = thread_split(before, thread_cpu_s(served[name].pid), result.requests + args.warmup)
                assert server_us is not None
                rounds[name].append(Round(result, server_us, generator_s[0] * 1e6 / max(1, result.requests),
                                          threads))
                print(f"round {k + 1}/{args.rounds} {name}: {result.qps:,.0f} QPS, server "
                      f"{server_us:.1f} µs/req (busiest thread {threads.busiest_us:.1f}, ZeroMQ I/O "
                      f"{threads.io_us:.1f}), load generator {rounds[name][-1].generator_us:.1f}", flush=True)
    return rounds, missing


def report(rounds: dict[str, list[Round]], missing: list[str], ort_us: float, args: argparse.Namespace) -> str:
    """The section: one row per server (medians), onnxruntime's call, and the budget left."""
    med = {name: (statistics.median(r.result.qps for r in rs), statistics.median(r.server_us for r in rs),
                  statistics.median(r.generator_us for r in rs)) for name, rs in rounds.items()}
    busiest = {name: statistics.median(r.threads.busiest_us for r in rs) for name, rs in rounds.items()}
    io = {name: statistics.median(r.threads.io_us for r in rs) for name, rs in rounds.items()}
    errors = {name: sum(r.result.requests - r.result.ok for r in rs) for name, rs in rounds.items()}
    cores = len(os.sched_getaffinity(0))
    rows = [[name, f"{qps:,.0f}", f"{server:.1f}", f"{busiest[name]:.1f}", f"{io[name]:.1f}", f"{gen:.1f}",
             f"{server + gen:.1f}", f"{(server + gen) * qps / 1e6:.2f}", str(errors[name])]
            for name, (qps, server, gen) in med.items()]
    table = markdown_table(["server", "QPS", "server CPU µs/req", "its busiest thread", "its ZeroMQ I/O threads",
                            "load generator CPU µs/req", "together", "cores busy", "errors"], rows)
    lines = [stamp(), "",
             f"Sample classifier, one [1,3,64,64] float32 image a request, concurrency {args.concurrency}, ipc; "
             f"{args.rounds} rounds × {args.duration:g} s per server after {args.warmup} warm-up requests, "
             "alternating; medians. CPU is user + system of each whole process over the round (ZeroMQ's I/O "
             "threads included); the server's is charged to the round's requests and its warm-up, and so is "
             "each of its threads' (read from /proc/PID/task).", "", table, "",
             f"onnxruntime's call alone, one context, 1 intra-op thread: **{ort_us:.1f} µs** of CPU a request."]
    lines += [line for why in missing for line in ("", why)]
    ceiling = thread_line(busiest, args)
    lines += ["", budget_line(rounds, med, ort_us, cores, args), *(["", ceiling] if ceiling else []), "",
              "Reproduce: `python tests/benchmarks/bench_budget.py` (the C servers need a C compiler, `cc`, and "
              "Python's headers)."]
    return "\n".join(lines) + "\n"


def budget_line(rounds: dict[str, list[Round]], med: dict[str, tuple[float, float, float]], ort_us: float,
                cores: int, args: argparse.Namespace) -> str:
    """What the target asks of each request's CPU, and what is left after the parts no frontend avoids."""
    target = args.target or (5 * peer if (peer := peer_qps(args.concurrency)) else None)
    if target is None:
        return "No target: give --target QPS (no PyTriton figure at this concurrency in RESULTS.md)."
    per_request = cores * 1e6 / target
    echo = "C echo" if "C echo" in med else "echo"
    generator, transport = med[echo][2], med[echo][1]
    left = per_request - generator - transport - ort_us
    source = "--target" if args.target else f"5 × PyTriton's QPS at c={args.concurrency} in RESULTS.md"
    busy = [(server + gen) * qps / 1e6 for qps, server, gen in med.values()]
    return (f"Budget: {target:,.0f} QPS ({source}) on {cores} cores is at most **{per_request:.0f} µs** of CPU a "
            f"request for every process together (with every core busy all the time; the servers above keep "
            f"{min(busy):.2f}–{max(busy):.2f} busy). The load generator takes {generator:.0f}, the {echo} server's receive "
            f"and reply {transport:.0f}, onnxruntime's call {ort_us:.0f}: **{left:.0f} µs** are left for "
            f"parsing, routing, statistics and the reply header (the daemon's server process spends "
            f"{med['daemon'][1]:.0f} µs a request in all; the bare loop's {med['bare loop'][1]:.0f})."
            + compiled_line(rounds, target))


def thread_line(busiest: dict[str, float], args: argparse.Namespace) -> str:
    """What the target asks of the busiest thread alone, and how far each server's is from it."""
    target = args.target or (5 * peer if (peer := peer_qps(args.concurrency)) else None)
    if target is None:
        return ""
    ceilings = ", ".join(f"{name} {us:.0f} µs ({1e6 / us:,.0f} a second)" for name, us in busiest.items() if us > 0)
    return (f"One thread: a thread runs on one core at a time, so at {target:,.0f} QPS no thread may spend "
            f"more than **{1e6 / target:.0f} µs** a request, however many cores are free. Each server's busiest "
            f"thread, and the ceiling it sets by itself: {ceilings}.")


def compiled_line(rounds: dict[str, list[Round]], target: float) -> str:
    """How near the compiled bare loop came to the target, and its per-round ratio to the Python bare loop."""
    if "C bare loop" not in rounds:
        return ""
    qps = statistics.median(r.result.qps for r in rounds["C bare loop"])
    server = statistics.median(r.server_us for r in rounds["C bare loop"])
    ratios = [c.result.qps / p.result.qps for c, p in zip(rounds["C bare loop"], rounds["bare loop"])]
    return (f" The C bare loop, the bare loop's work with its loop in C and onnxruntime reached through Python, "
            f"answered **{qps:,.0f}** a second ({qps / target:.2f}× the target) with {server:.0f} µs of server CPU "
            f"a request; against the bare loop, round by round, **{statistics.median(ratios):.2f}×** "
            f"({min(ratios):.2f}–{max(ratios):.2f}).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight (default 64)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per server and round (default 3)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up requests per server and round")
    parser.add_argument("--target", type=float, help="QPS to budget for (default: 5 × PyTriton's, RESULTS.md)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-budget.") as tmp:
        rounds, missing = measure(args, Path(tmp))
    body = report(rounds, missing, onnxruntime_call_us(), args)
    print_and_write(SECTION, body, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
