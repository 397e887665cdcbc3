"""The fast path's steps, each measured by leaving out the ones after it: where the frontend thread's CPU goes.

    python tests/benchmarks/bench_ladder.py [--concurrency 64] [--duration 3] [--rounds 5] [--no-write]

A measuring tool, not a server to run: each rung is the real daemon (1
context, the sample classifier, one [1,3,64,64] float32 image a request)
whose `Server._handle`, once WARM headers have been read from a layout,
answers each request read from a layout with only that rung's steps:

  compute and reply   the context's call and the 200 header from the parts
                      OkReplies encoded once, sent: no statistics and no
                      checks, the least a Python frontend could do
  + a compact record  and one tuple of the request's figures appended to a
                      bounded deque: what a statistics record could cost at
                      the least (nothing reads it)
  + the per-request checks   and what a request must still be checked for
                      when the decisions that depend only on its header and
                      version are kept: its deadline, an idle context (its
                      lock), the inline gate, and the estimates the gate
                      learns (track_compute): the path docs/performance.md
                      proposes, but for a dictionary lookup
  + statistics        the context's call and the reply, with the estimate the
                      inline gate learns (Executor._learn) and Stats.record
                      in place of the compact record and the checks
  + the job's checks  and the envelope's note of its request, the Job, its
                      deadline and the router's tensor check
  + the executor's serve   the job computed and answered by
                      Executor.compute instead (its context's lock, the
                      estimate, statistics, the reply through Executor._succeed)
  the daemon, general path   unchanged but for the express lane, which
                      INFERMUX_EXPRESS=off turns off: the oversize, recorder
                      and mirror checks, Router.admit_fast,
                      Router.idle (the inline gate) and all after them
  the express lane: compute and reply   the daemon with its express lane
                      on, the lane's Python (ExpressLane.serve) cut to the
                      first rung's steps: the context's call and the 200
                      header, between the lane's C receive, look-up and send:
                      the most that trimming the lane's Python could reach
  the daemon          unchanged: its express lane (express.py) receives,
                      looks the layout up and replies in C, and computes
                      with the fast path's checks and no Job

Every rung but the last two runs with the express lane off, so that its
`Server._handle` sees every request.

Rounds alternate between the rungs; for each, its QPS and its busiest
thread's CPU µs a request (the frontend thread, which computes each
request itself), medians. A thread is on one core at a time, so that
thread's cost caps the QPS; two rungs' difference is what the steps
between them cost on it, in a process whose caches onnxruntime's call
shares. Writes the "## Frontend thread, step by step" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
from collections import deque
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_budget import thread_split  # noqa: E402
from bench_core import MODEL, SHAPE, daemon_command, serving  # noqa: E402
from results import markdown_table, print_and_write, stamp, thread_cpu_s  # noqa: E402

from infermux.cli.bench import BenchResult, run_load  # noqa: E402
from infermux.cli.infer import parse_inputs  # noqa: E402

SECTION = "Frontend thread, step by step"
GENERAL, LANE_FLOOR, DAEMON = "the daemon, general path", "the express lane: compute and reply", "the daemon"
RUNGS = ("compute and reply", "+ a compact record", "+ the per-request checks", "+ statistics",
         "+ the job's checks", "+ the executor's serve", GENERAL, LANE_FLOOR, DAEMON)
LANE_RUNGS = (LANE_FLOOR, DAEMON)  # the rungs that run with the express lane on
WARM = 100  # headers read from a layout before a rung takes over: the layout is learnt by the daemon's own path


def patch(rung: str) -> None:
    """Replace `Server._handle` in this process by `rung`'s (the daemon's own on the general path and
    the daemon's rungs; the lane's Python on the lane's floor)."""
    from infermux.execution.inline import track_compute
    from infermux.execution.job import Job
    from infermux.frontend import server as frontend
    from infermux.frontend.oversize import ClientEnvelope
    from infermux.protocol import ProtocolError

    if rung == LANE_FLOOR:
        return patch_lane()
    if rung in (GENERAL, DAEMON):
        return
    level = RUNGS.index(rung)
    original = frontend.Server._handle
    records: deque[tuple[int, int, int, int, int]] = deque(maxlen=4096)

    def handle(self: Any, frames: list[Any], refuse: bool) -> None:
        if refuse or self.parses.hits < WARM:
            return original(self, frames, refuse)
        received = time.perf_counter_ns()
        split = frontend._delimiter(frames)
        envelope, body = ClientEnvelope(frames[:split]), frames[split:]
        try:
            request = self.parses.parse(body, self.limits, self._lookup)
        except ProtocolError:
            return original(self, frames, refuse)
        version = self.router.registry.models[request.model].default()
        executor = version.placement.executors[0]
        if level == 2:
            if not checked(executor, version, request, received):
                return original(self, frames, refuse)
        elif level >= 4:
            envelope.came_with(request)
            job = Job(envelope, request, frames, received, deadline_ns=0)
            job.deadline_ns = received + (request.timeout_ms or version.config.timeout_ms) * 1_000_000
            if job.late():
                return original(self, frames, refuse)
            self.router._check_tensors(version, job)
            if level >= 5:
                job.target = version
                if not executor.compute(job):
                    raise RuntimeError("the one context was busy on a 1-context daemon's frontend thread")
                return
        start = time.perf_counter_ns()
        try:
            outputs = executor._context.infer(request.inputs)
        except BaseException:
            if level == 2:
                executor._busy.release()
            raise
        end = time.perf_counter_ns()
        queue_us, compute_us, total_us = (start - received) // 1000, (end - start) // 1000, (end - received) // 1000
        if level == 1:
            records.append((200, total_us, queue_us, compute_us, 1))
        elif level == 2:  # the context's lock back, the estimates the gate learns, and the compact record
            executor._busy.release()
            sample = (end - start) / 1000
            executor.row_wall_us = track_compute(executor.row_wall_us, sample)
            executor.row_us = track_compute(executor.row_us, sample)
            records.append((200, total_us, queue_us, compute_us, 1))
        elif level >= 3:
            executor._learn(1, start, end)
            executor.stats.record(200, total_us, queue_us, compute_us, 0)
        self.sender.send(envelope + executor._ok.encode(request.id, queue_us, compute_us, total_us, outputs))

    def checked(executor: Any, version: Any, request: Any, received: int) -> bool:
        """The per-request checks' rung before its call: the request's deadline, an idle context, the inline
        gate; True with the context's lock taken (handle gives it back after the call)."""
        scheduler = version.placement
        deadline = received + (request.timeout_ms or version.config.timeout_ms) * 1_000_000
        return not (time.perf_counter_ns() > deadline or executor.in_flight or len(executor.queue)
                    or not scheduler._inline(executor.row_us, False)) and executor._busy.acquire(blocking=False)

    frontend.Server._handle = handle


def patch_lane() -> None:
    """Cut the express lane's Python to the first rung's steps: the context's call and the 200 header.
    Its C receive, look-up and send are unchanged, so what this rung leaves out of the daemon is the
    lane's per-request Python around the call: the checks, the lock, statistics and estimates."""
    import numpy as np

    from infermux.frontend import express
    from infermux.frontend.parsecache import id_value

    executors: dict[str, Any] = {}  # nothing swaps or reloads while a rung is measured

    def serve(self: Any, layout: Any, ident: bytes | None, frames: list[Any], split: int) -> list[Any]:
        executor = executors.get(layout.model)
        if executor is None:
            executor = executors[layout.model] = self.router.registry.models[layout.model].default() \
                .placement.executors[0]
        received = time.perf_counter_ns()
        inputs = {spec.name: np.frombuffer(frame, dtype=spec.dtype).reshape(spec.shape)
                  for spec, frame in zip(layout.inputs, frames[split + 1:])}
        start = time.perf_counter_ns()
        outputs = executor._context.infer(inputs)
        end = time.perf_counter_ns()
        return executor._ok.encode(id_value(ident), (start - received) // 1000, (end - start) // 1000,
                                   (end - received) // 1000, outputs)

    express.ExpressLane.serve = serve


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, list[tuple[BenchResult, float]]]:
    """Every rung's rounds, alternating: the load generator's figures and the busiest thread's µs a request."""
    inputs = parse_inputs([], [SHAPE], "float32")
    rounds: dict[str, list[tuple[BenchResult, float]]] = {rung: [] for rung in RUNGS}
    with contextlib.ExitStack() as stack:
        served = {}
        for n, rung in enumerate(RUNGS):
            command, endpoint = daemon_command(tmp, f"rung{n}", contexts=1)
            command = [sys.executable, __file__, "--serve", rung, *command[3:]]  # [python, -m, infermux, serve...]
            env = {} if rung in LANE_RUNGS else {"INFERMUX_EXPRESS": "off"}
            served[rung] = stack.enter_context(serving(f"rung{n}", command, endpoint, tmp, env=env))
        for k in range(args.rounds):
            for rung in RUNGS:
                endpoint, pid = served[rung].endpoint, served[rung].pid
                run_load(endpoint, MODEL, inputs, concurrency=args.concurrency, count=args.warmup)
                before = thread_cpu_s(pid)
                result = run_load(endpoint, MODEL, inputs, concurrency=args.concurrency, duration_s=args.duration)
                busiest = thread_split(before, thread_cpu_s(pid), result.requests).busiest_us
                rounds[rung].append((result, busiest))
                print(f"round {k + 1}/{args.rounds} {rung}: {result.qps:,.0f} QPS, busiest thread {busiest:.1f} µs/req",
                      flush=True)
    return rounds


def report(rounds: dict[str, list[tuple[BenchResult, float]]], args: argparse.Namespace) -> str:
    """The section: each rung's medians and what its steps add to the rung before."""
    rows, previous = [], None
    for rung, measured in rounds.items():
        qps = statistics.median(r.qps for r, _ in measured)
        busiest = statistics.median(us for _, us in measured)
        errors = sum(r.requests - r.ok for r, _ in measured)
        added = f"+{busiest - previous:.1f}" if previous is not None else "–"
        rows.append([rung, f"{qps:,.0f}", f"{busiest:.1f}", added, f"{1e6 / busiest:,.0f}" if busiest else "–",
                     str(errors)])
        previous = busiest
    table = markdown_table(["rung", "QPS", "busiest thread µs/req", "added by its steps", "that thread's ceiling",
                            "errors"], rows)
    return "\n".join([
        stamp(), "",
        f"Sample classifier, concurrency {args.concurrency}, ipc, 1 context; {args.rounds} rounds × "
        f"{args.duration:g} s per rung after {args.warmup} warm-up requests, alternating; medians. The rungs above "
        "the general path are the daemon with `Server._handle` cut down to their steps, and the express lane's rung "
        "the daemon with the lane's Python cut to the first rung's steps (this script's docstring); they drop what a "
        "server must do and are measurements, not configurations.", "", table, "",
        "Reproduce: `python tests/benchmarks/bench_ladder.py`."]) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:  # a rung's daemon: this script started it (measure)
        patch(argv[1])
        from infermux.cli import main as infermux

        return infermux(argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per rung and round (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=2000, help="requests per rung and round before measuring")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ladder.") as tmp:
        rounds = measure(args, Path(tmp))
    body = report(rounds, args)
    print_and_write(SECTION, body, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
