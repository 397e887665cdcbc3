"""How long a client's failover between two daemons takes, when one is killed or wedged.

    python tests/benchmarks/bench_failover.py [--rounds 3] [--requests 600] [--failover-s 2] [--no-write]

Two daemons, A and B, serve the same small matmul model (about a
millisecond a request), which also returns a constant tag saying which
daemon computed it. One `Pipeline` over both keeps 32 requests in flight;
after half the requests are answered, A gets

  SIGKILL  its connections break: the socket monitor reports it at once
  SIGSTOP  wedged, connections open: given up after `failover_s` of silence
           (or its ZMTP heartbeats unanswered, whichever comes first)

and the run goes on until every request is answered. Per round: the
requests A held at the fault, how many were resent, the failover time (from
the signal to the first reply from B to a request A held), and the longest
any request waited after the fault, against the median wait before it.
Every request is checked to be answered once, with its own id. A is started
afresh each round. Writes the "## Client failover" section of
RESULTS.md.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402

from support import models  # noqa: E402
from support.harness import DAEMON_HEAD, Daemon  # noqa: E402
from infermux.client import Pipeline  # noqa: E402
from infermux.client.failover import FAILOVER_S  # noqa: E402

WIDTH, LAYERS, WINDOW = 256, 8, 32
MODEL = '[[models]]\nname = "work"\nengine = "work{tag}/1/model.onnx"\n'
SECTION = "Client failover"


def tagged_work(path: Path, tag: float) -> Path:
    """y = x·w·w… (LAYERS matmuls, [N,WIDTH]) and who = [tag]: the reply says which daemon computed it."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32), "w")
    nodes, x = [], "x"
    for i in range(LAYERS):
        nodes.append(helper.make_node("MatMul", [x, "w"], ["y" if i == LAYERS - 1 else f"h{i}"]))
        x = f"h{i}"
    nodes.append(helper.make_node("Identity", ["tag"], ["who"]))
    value = helper.make_tensor_value_info
    return models._save(nodes, [value("x", TensorProto.FLOAT, ["N", WIDTH])],
                        [value("y", TensorProto.FLOAT, ["N", WIDTH]), value("who", TensorProto.FLOAT, [1])],
                        [w, numpy_helper.from_array(np.float32([tag]), "tag")], path)


@dataclass
class Round:
    """What one fault cost the client."""

    held: int
    resent: int
    failover_ms: float | None  # None: A had answered everything it held before it went
    longest_ms: float
    median_before_ms: float


class Fleet2:
    """Daemons A (tag 1) and B (tag 2); A is replaced after each fault."""

    def __init__(self, root: Path) -> None:
        self.root, self.engines = root, root / "engines"
        for tag in (1, 2):
            tagged_work(self.engines / f"work{tag}/1/model.onnx", float(tag))
        self.a, self.b = self.start(1), self.start(2)

    def start(self, tag: int) -> Daemon:
        workdir = self.root / f"d{tag}-{time.monotonic_ns()}"
        workdir.mkdir()
        return Daemon(workdir, (DAEMON_HEAD + MODEL).format(engines=self.engines, tag=tag)).start()

    def close(self) -> None:
        for daemon in (self.a, self.b):
            if daemon.alive():
                daemon.signal(signal.SIGKILL)
                daemon.signal(signal.SIGCONT)
            daemon.stop()


def run_round(fleet: Fleet2, fault: signal.Signals, total: int, failover_s: float) -> Round:
    x = np.random.default_rng(1).random((1, WIDTH), dtype=np.float32)
    sent: dict[int, float] = {}
    waits: dict[int, float] = {}
    first_resent: float | None = None
    held: frozenset[int] = frozenset()
    fault_at = 0.0
    with Pipeline([fleet.a.endpoint, fleet.b.endpoint], timeout_s=60, failover_s=failover_s) as pipe:
        while len(sent) < total or pipe.in_flight:
            while len(sent) < total and pipe.in_flight < WINDOW:
                sent[pipe.submit("work", {"x": x})] = time.perf_counter()
            reply = pipe.next_reply()
            now, ident = time.perf_counter(), reply.header["id"]
            assert reply.status == 200 and ident in sent and ident not in waits, reply.header
            waits[ident] = now - sent[ident]
            if fault_at and first_resent is None and ident in held and reply.outputs["who"][0] == 2.0:
                first_resent = now - fault_at
            if len(waits) == total // 2:
                held = pipe.holding(fleet.a.endpoint)
                fault_at = time.perf_counter()
                fleet.a.signal(fault)
        resent = pipe.moved
    before = [w for i, w in waits.items() if sent[i] < fault_at]
    after = [w for i, w in waits.items() if i in held or sent[i] >= fault_at]
    return Round(len(held), resent, None if first_resent is None else first_resent * 1000,
                 max(after) * 1000, statistics.median(before) * 1000)


def replace_a(fleet: Fleet2) -> None:
    """End the faulted A for good (a stopped one too) and start a fresh one."""
    fleet.a.signal(signal.SIGKILL)
    fleet.a.signal(signal.SIGCONT)
    fleet.a.stop()
    fleet.a = fleet.start(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=600, help="requests per round")
    parser.add_argument("--failover-s", type=float, default=FAILOVER_S)
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args()
    rows, failovers = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet2(Path(tmp))
        try:
            for fault in (signal.SIGKILL, signal.SIGSTOP):
                failovers[fault.name] = []
                for number in range(1, args.rounds + 1):
                    result = run_round(fleet, fault, args.requests, args.failover_s)
                    replace_a(fleet)
                    if result.failover_ms is not None:
                        failovers[fault.name].append(result.failover_ms)
                    rows.append([fault.name, str(number), str(result.held), str(result.resent),
                                 "—" if result.failover_ms is None else f"{result.failover_ms:.1f}",
                                 f"{result.longest_ms:.1f}", f"{result.median_before_ms:.2f}"])
        finally:
            fleet.close()
    medians = ", ".join(f"{name} {statistics.median(values):.1f} ms" if values else f"{name} —"
                        for name, values in failovers.items())
    body = "\n".join([
        stamp(),
        f"Two daemons on this box, one `Pipeline` over both with {WINDOW} requests in flight, {args.requests} "
        f"requests a round ({LAYERS} matmuls of {WIDTH}×{WIDTH} each), `failover_s` = {args.failover_s:g}; "
        "the fault hits A after half of them are answered. Failover: from the signal to the first reply from "
        "B to a request A held. Longest wait: submit to reply, of the requests sent after the fault or held "
        "by A at it. Every request was answered once, 200, with its id. The box is shared with other work: "
        "the absolute figures are noisy.",
        "",
        markdown_table(["fault", "round", "held by A", "resent", "failover ms", "longest wait ms",
                        "median wait before ms"], rows),
        "",
        f"Median failover: {medians}. A killed daemon is left as soon as its connection breaks, and what it "
        "held queues behind B's own requests: the failover is about one wait of B's; a wedged one, whose "
        "connections stay open, is left after `failover_s`.",
        "Reproduce: `python tests/benchmarks/bench_failover.py`.",
    ])
    print_and_write(SECTION, body, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
