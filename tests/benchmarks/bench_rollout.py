"""What a candidate under shadow costs the clients: the same daemon with and without one, in one run.

    python tests/benchmarks/bench_rollout.py [--duration 3] [--rounds 5] [--warmup 100] [--no-write]

Three daemons serve the sample classifier ([1,3,64,64] conv, 2 contexts)
from watched engine directories whose `model.toml` has a `[rollout]`
table (docs/hot-swap.md#shadow-rollout), and run for the whole script:

  shadowed  version 2 (the same engine) is published and stays a candidate
            (shadow_requests too high to decide): copies of live requests
            are computed on it and compared, on spare CPU only (the
            default min_idle_cpu = 0.25)
  forced    the same with min_idle_cpu = 0: it mirrors whenever a context
            of the serving version is free, whatever the CPUs' idle time
  plain     the same configuration, nothing published: no candidate

The load generator (`infermux.cli.bench.run_load`, in its own process)
drives one daemon at a time closed-loop at concurrency 1 and 16; the
rounds alternate the three daemons (and which goes first), so a burst of
load from elsewhere on the box hits all alike. The table shows the
median round of each case and the requests the candidate compared in it
(mirroring waits while the serving version or the CPUs are busy, so under
load it compares fewer). Goal: p99 shadowed ≤ 1.1× plain at c=16.
Writes the "## Shadow rollout" section of RESULTS.md.

    python tests/benchmarks/bench_rollout.py --gate [--duration 3] [--rounds 3] [--no-write]

The gate's candidates instead (`gate`): a daemon serves `m` (y = x + 1,
[2,4], support.models.heavy with nothing to spread) under a rollout table
with shadow_requests = 200, max_latency_ratio 1.5 (the default) and
min_idle_cpu = 0 (mirroring whatever the load: the clients' worst case); a candidate that answers the same is published,
while 4 clients keep sending: *slow* spreads each request over a
[2,4,500000] intermediate (tens of ms a call), *memory-hungry* over a
[2,4,4000000] one (128 MiB a call) under max_memory_mb = 64. Each round
measures the clients for `--duration` before publishing, then from the
publication until the verdict, in 0.25 s windows on both sides; goal: each
refused before it serves, and the clients' p99 while it shadows within
max_latency_ratio (1.5×) of theirs before, window for window. Two controls
publish nothing: *none* (the measure's own noise) and *memory elsewhere*
(another process at nice 19 does the memory-hungry candidate's three
computations: what that memory costs the clients outside the daemon). Writes the
"## Rollout gate: slow and memory-hungry candidates, window for window"
section.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402

from support.harness import Daemon  # noqa: E402
from infermux.cli.bench import BenchResult, run_load, wait_ready  # noqa: E402
from infermux.cli.infer import parse_inputs  # noqa: E402

ROOT = HERE.parents[1]
ENGINE = ROOT / "engines" / "classifier" / "1" / "model.onnx"
MODEL, SHAPE = "cls", "images=1x3x64x64"
CONCURRENCY = (1, 16)
GOAL = 1.1  # p99 shadowed / plain at c=16
SECTION = "Shadow rollout"
CONFIG = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
"""
MODEL_TOML = """\
contexts = 2
max_queue = 256
[rollout]
shadow_requests = 1000000000
compare = "allclose"
"""
DAEMONS = {"shadowed": (True, ""), "forced": (True, "min_idle_cpu = 0\n"), "plain": (False, "")}


@dataclass
class Case:
    """One daemon at one concurrency, every round."""

    name: str
    concurrency: int
    rounds: list[BenchResult] = field(default_factory=list)
    compared: list[int] = field(default_factory=list)  # requests the candidate compared during each round

    def median(self, key: str) -> float:
        values = sorted(getattr(r, key) for r in self.rounds)
        return values[(len(values) - 1) // 2]

    def median_compared(self) -> int:
        values = sorted(self.compared)
        return values[(len(values) - 1) // 2] if values else 0


def start(work: Path, name: str, candidate: bool, rollout: str = "") -> Daemon:
    """A daemon serving `cls` version 1 under a rollout table (more of it in `rollout`); with `candidate`,
    version 2 shadows it."""
    root = work / name / "engines"
    (root / MODEL / "1").mkdir(parents=True)
    shutil.copyfile(ENGINE, root / MODEL / "1" / "model.onnx")
    (root / MODEL / "model.toml").write_text(MODEL_TOML + rollout)
    daemon = Daemon(work / name, CONFIG.format(root=root)).start()
    inputs = parse_inputs([], [SHAPE], "float32")
    if not wait_ready(daemon.endpoint, MODEL, inputs, timeout_s=60).ok:
        raise RuntimeError(f"{name}: {MODEL} is not served:\n{daemon.log()[-2000:]}")
    if candidate:
        staged = root / MODEL / ".2"
        staged.mkdir()
        shutil.copyfile(ENGINE, staged / "model.onnx")
        staged.rename(root / MODEL / "2")  # published the documented way: it becomes a candidate
        daemon.wait_for(f"rollout_started model={MODEL} version=2", 60)
    return daemon


def rollout_view(daemon: Daemon) -> dict[str, Any]:
    """The candidate's `rollout` view in admin `models` ({} when it has none)."""
    with daemon.admin() as admin:
        rows = admin.call("models")["models"]
    return next((m["rollout"] for m in rows if m["name"] == MODEL and m.get("rollout")), {})


def measure(args: argparse.Namespace, work: Path) -> tuple[list[Case], dict[str, Any]]:
    """All daemons up for the whole run; rounds rotate which one goes first."""
    daemons = {name: start(work, name, candidate, rollout) for name, (candidate, rollout) in DAEMONS.items()}
    cases = {(name, c): Case(name, c) for c in CONCURRENCY for name in daemons}
    inputs = parse_inputs([], [SHAPE], "float32")
    ctx = multiprocessing.get_context("spawn")  # the load generator shares no GIL with anything here
    try:
        with ProcessPoolExecutor(1, mp_context=ctx) as generator:
            for round_ in range(args.rounds):
                for c in CONCURRENCY:
                    names = list(daemons)
                    order = names[round_ % len(names):] + names[:round_ % len(names)]
                    for name in order:
                        daemon = daemons[name]
                        before = rollout_view(daemon).get("compared", 0)
                        result = generator.submit(run_load, daemon.endpoint, MODEL, inputs, concurrency=c,
                                                  duration_s=args.duration, warmup=args.warmup).result()
                        case = cases[name, c]
                        case.rounds.append(result)
                        case.compared.append(rollout_view(daemon).get("compared", 0) - before)
                        print(f"  round {round_ + 1}  {name:<9} c={c:<3} {result.qps:7,.0f}/s  "
                              f"p50 {result.p50_us:6.0f} µs  p99 {result.p99_us:6.0f} µs  "
                              f"compared {case.compared[-1]}", file=sys.stderr)
        final = {}
        for name in ("shadowed", "forced"):
            final[name] = rollout_view(daemons[name])
            if not final[name]:
                raise RuntimeError(f"{name}: the candidate is gone: " + daemons[name].log()[-2000:])
            final[name]["paused_events"] = daemons[name].log().count(f"rollout_paused model={MODEL} version=2")
        return list(cases.values()), final
    finally:
        for daemon in daemons.values():
            daemon.stop()


def paired(by: dict[tuple[str, int], Case], name: str, level: int, figure: str = "p99_us") -> list[float]:
    """`figure` of `name` / plain per round, sorted: each round's runs were back to back, the fairest pairs."""
    return sorted(getattr(a, figure) / getattr(b, figure)
                  for a, b in zip(by[name, level].rounds, by["plain", level].rounds))


def median_of(ratios: list[float]) -> float:
    return ratios[(len(ratios) - 1) // 2]


def report(cases: list[Case], final: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    rows = [[c.name, str(c.concurrency), f"{c.median('qps'):,.0f}", f"{c.median('p50_us'):,.0f}",
             f"{c.median('p99_us'):,.0f}", str(c.median_compared()), " ".join(f"{r.qps:,.0f}" for r in c.rounds)]
            for c in sorted(cases, key=lambda c: (c.concurrency, list(DAEMONS).index(c.name)))]
    by = {(c.name, c.concurrency): c for c in cases}
    lines = []
    for name in ("shadowed", "forced"):
        parts = []
        for level in CONCURRENCY:
            r, p50, qps = (paired(by, name, level, figure) for figure in ("p99_us", "p50_us", "qps"))
            parts.append(f"c={level}: p99 per round median **{median_of(r):.2f}×** (range {r[0]:.2f}–{r[-1]:.2f}×), "
                         f"p50 {median_of(p50):.2f}× ({p50[0]:.2f}–{p50[-1]:.2f}), "
                         f"QPS {median_of(qps):.2f}× ({qps[0]:.2f}–{qps[-1]:.2f})")
        f = final[name]
        lines.append(f"- {name} / plain: " + "; ".join(parts) + f". At the end its candidate had {f['compared']:,} "
                     f"compared (agreement {f['agreement']:.2%}), {f['not_mirrored']:,} live requests not copied, "
                     f"mirroring paused {f['paused_events']} times.")
    verdict = median_of(paired(by, "shadowed", 16))
    return "\n".join([
        stamp(),
        f"Commit {commit()}; `flock /tmp/infermux-heavy.lock python tests/benchmarks/bench_rollout.py "
        f"--duration {args.duration:g} --rounds {args.rounds} --warmup {args.warmup}`.",
        "",
        "The sample classifier ([1,3,64,64], 2 contexts) under a `[rollout]` table: *shadowed* has version 2 "
        "(the same engine) as a candidate for the whole run, mirroring on spare CPU only (default "
        "`min_idle_cpu = 0.25`); *forced* the same with `min_idle_cpu = 0`; *plain* has no candidate. All three "
        "daemons up throughout, the rounds rotating them. Median round of each (by each figure); *compared*: "
        "requests the candidate computed and compared during the median round. Ratios: each figure's "
        "per-round ratio against plain (the rounds ran back to back), median and range.",
        "",
        markdown_table(["daemon", "c", "QPS", "p50 µs", "p99 µs", "compared", "QPS each round"], rows),
        "",
        *lines,
        "",
        f"Goal p99 shadowed ≤ {GOAL}× plain at c=16 (median of the rounds' ratios): "
        + ("met." if verdict <= GOAL else "**not met**."),
    ])


OUTSIDE = "memory elsewhere"  # a control (OUTSIDE_CODE below)
GATE_SECTION = "Rollout gate: slow and memory-hungry candidates, window for window"
GATE_CANDIDATES = {"slow": (500_000, ""), "memory-hungry": (4_000_000, "max_memory_mb = 64\n"), "none": (0, ""),
                   OUTSIDE: (0, "")}
CONTROL_WINDOWS = 4  # "none" publishes nothing: this many windows measured the same way, the measure's own noise
# The memory-hungry candidate's work done by another process at nice 19 while nothing is published: its
# three computations' worth of fresh 128 MiB arrays (a load's two warm-up runs and one comparison).
# It starts before the round's windows and waits for a line on stdin: its interpreter's start is not in them.
OUTSIDE_CODE = ("import sys\nimport numpy as np\nsys.stdin.readline()\n"
                "for _ in range(3):\n    np.ones((2, 4, 4_000_000), np.float32).sum()\n")
# min_idle_cpu = 0: on a shared box the CPUs are seldom a quarter idle, and a candidate that never mirrors
# is never judged; this is the gate's worst case for the clients (it mirrors whatever the load).
GATE_TOML = "max_queue = 256\ntimeout_ms = 30000\n[rollout]\nshadow_requests = 200\nmin_idle_cpu = 0\n"
GATE_CLIENTS = 4
GATE_WINDOW_S = 0.25  # client latencies are summed up per window this long (a verdict comes within a second)


@dataclass
class GateRound:
    """One publication of one gate candidate, and what the clients saw before and while it shadowed."""

    before: list[BenchResult]  # GATE_WINDOW_S windows before the publication
    during: list[BenchResult]  # GATE_WINDOW_S windows from the publication to the verdict
    verdict: str  # the rollout_failed (or rollout_passed) line's fields
    seconds: float  # from publication to the verdict
    served_by_candidate: bool


def gate_round(work: Path, kind: str, round_: int, args: argparse.Namespace, generator: Any) -> GateRound:
    """A fresh daemon serving `m` 1; the `kind` candidate published under load until its verdict."""
    from support import models

    repeat, extra = GATE_CANDIDATES[kind]
    root = work / f"{kind}{round_}" / "engines"
    models.heavy(root / "m" / "1" / "model.onnx", offset=1, repeat=1)
    (root / "m" / "model.toml").write_text(GATE_TOML + extra)
    daemon = Daemon(work / f"{kind}{round_}", CONFIG.format(root=root)).start()
    inputs = parse_inputs([], ["x=2x4"], "float32")
    outside = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", OUTSIDE_CODE], stdin=subprocess.PIPE,
                               text=True) if kind == OUTSIDE else None
    try:
        if outside is not None:
            time.sleep(1.0)  # its imports done before the windows before
        before = [generator.submit(run_load, daemon.endpoint, "m", inputs, concurrency=GATE_CLIENTS,
                                   duration_s=GATE_WINDOW_S, warmup=0 if i else args.warmup).result()
                  for i in range(round(args.duration / GATE_WINDOW_S))]
        if repeat:
            models.heavy(root / "m" / ".2" / "model.onnx", offset=1, repeat=repeat)
        began = time.monotonic()
        if repeat:
            (root / "m" / ".2").rename(root / "m" / "2")
        if outside is not None and outside.stdin is not None:
            outside.stdin.write("go\n")
            outside.stdin.close()
        windows: list[BenchResult] = []
        while not windows or (not verdict_line(daemon) if repeat else len(windows) < CONTROL_WINDOWS):
            if time.monotonic() - began > 120:
                raise RuntimeError(f"{kind}: no verdict in 120 s:\n{daemon.log()[-3000:]}")
            windows.append(generator.submit(run_load, daemon.endpoint, "m", inputs, concurrency=GATE_CLIENTS,
                                            duration_s=GATE_WINDOW_S).result())
        line = verdict_line(daemon)
        seconds = time.monotonic() - began  # an upper bound: to the end of the window that saw it
        if outside is not None and outside.wait(60):
            raise RuntimeError(f"{OUTSIDE}: its process failed ({outside.returncode})")
        return GateRound(before, windows, line.split("infermux.events: ")[1] if line else "", seconds,
                         "swapped model=m version=2" in daemon.log())
    finally:
        daemon.stop()
        if outside is not None and outside.poll() is None:
            outside.kill()
            outside.wait()


def verdict_line(daemon: Daemon) -> str:
    """The candidate's rollout_failed or rollout_passed line, "" before it."""
    return next((x for x in daemon.log().splitlines() if "infermux.events: rollout_failed " in x
                 or "infermux.events: rollout_passed " in x), "")


def gate(args: argparse.Namespace) -> str:
    work = Path(tempfile.mkdtemp(prefix="bench-gate-"))
    ctx = multiprocessing.get_context("spawn")
    results: dict[str, list[GateRound]] = {kind: [] for kind in GATE_CANDIDATES}
    try:
        with ProcessPoolExecutor(1, mp_context=ctx) as generator:
            for round_ in range(args.rounds):
                kinds = list(GATE_CANDIDATES)
                for kind in kinds[round_ % len(kinds):] + kinds[:round_ % len(kinds)]:  # each goes first in turn
                    r = gate_round(work, kind, round_, args, generator)
                    results[kind].append(r)
                    print(f"  round {round_ + 1} {kind:<14} p99 {p99s(r.before)} µs before, {p99s(r.during)} µs "
                          f"while shadowing; verdict after {r.seconds:.1f} s: {r.verdict[:160]}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return gate_report(results, args)


def p99s(windows: list[BenchResult]) -> str:
    return "/".join(f"{w.p99_us or 0:.0f}" for w in windows)


def gate_row(kind: str, i: int, r: GateRound) -> tuple[list[str], float, float, bool]:
    """The table's row of one round; its median-window and worst-window ratios, and whether it was refused."""
    p99_before = [w.p99_us or 0 for w in r.before]
    p99_during = [w.p99_us or 0 for w in r.during]
    median_ratio = statistics.median(p99_during) / (statistics.median(p99_before) or 1)
    worst_ratio = max(p99_during) / (max(p99_before) or 1)
    refused = r.verdict.startswith("rollout_failed") and not r.served_by_candidate
    verdict = "refused" if refused else "**served**" if r.verdict else "—"
    fields = dict(part.split("=", 1) for part in r.verdict.split(" ")[1:] if "=" in part and '"' not in part)
    return ([kind, str(i + 1), verdict, fields.get("compared", "—"), f"{r.seconds:.1f}",
             str(len(r.during)), f"{statistics.median(w.p50_us or 0 for w in r.before):,.0f}",
             f"{statistics.median(w.p50_us or 0 for w in r.during):,.0f}", f"{statistics.median(p99_before):,.0f}",
             f"{statistics.median(p99_during):,.0f}", f"{median_ratio:.2f}×", f"{max(p99_before):,.0f}",
             f"{max(p99_during):,.0f}", f"{worst_ratio:.2f}×"], median_ratio, worst_ratio, refused)


def gate_report(results: dict[str, list[GateRound]], args: argparse.Namespace) -> str:
    rows, met, met_worst = [], True, True
    for kind, rounds in results.items():
        for i, r in enumerate(rounds):
            row, median_ratio, worst_ratio, refused = gate_row(kind, i, r)
            rows.append(row)
            if kind in ("none", OUTSIDE):
                continue
            met = met and refused and median_ratio <= 1.5
            met_worst = met_worst and refused and worst_ratio <= 1.5
    reasons = {kind: rounds[0].verdict.split('reason="', 1)[-1].split("; worst")[0].rstrip('"')[:220] for kind, rounds in
               results.items() if rounds and kind not in ("none", OUTSIDE)}
    return "\n".join([
        stamp(),
        f"Commit {commit()}; `flock /tmp/infermux-heavy.lock python tests/benchmarks/bench_rollout.py --gate "
        f"--duration {args.duration:g} --rounds {args.rounds} --warmup {args.warmup}`.",
        "",
        f"`m` (y = x + 1, [2,4]) under `[rollout]` with `shadow_requests = 200`, `max_latency_ratio = 1.5` (the "
        f"default) and `min_idle_cpu = 0` (it mirrors whatever the load: the clients' worst case; at the default "
        f"0.25 this shared box seldom lets it mirror), {GATE_CLIENTS} closed-loop clients throughout. A "
        "candidate that answers the same is published: *slow* computes through a [2,4,500000] intermediate, "
        "*memory-hungry* through a [2,4,4000000] one (128 MiB a call) under `max_memory_mb = 64`. *compared*: "
        "comparisons when it was refused; *s*: publication to verdict (to the end of the window that saw it). "
        f"Client latencies (µs) in {GATE_WINDOW_S:g} s windows: {round(args.duration / GATE_WINDOW_S)} before "
        "publishing, and *windows* from "
        f"the publication to the verdict (*none*: nothing published, {CONTROL_WINDOWS} windows measured the same way, what "
        "the measure gives on this box without a candidate; *memory elsewhere*: nothing published, but another process at nice 19 "
        "allocates and sums three [2,4,4000000] arrays, the memory-hungry candidate's work outside the daemon, measured as *none*). "
        "Window for window: the median window's p99 while it shadowed over the "
        "median window's before (the typical second), and the worst window's over the worst before.",
        "",
        markdown_table(["candidate", "round", "verdict", "compared", "s", "windows", "p50 before", "p50 shadowing",
                        "p99 before (median window)", "p99 shadowing (median window)", "ratio",
                        "p99 before (worst window)", "p99 shadowing (worst window)", "ratio"], rows),
        "",
        *[f"- {kind}: `{why}`" for kind, why in reasons.items()],
        "",
        "Goal: each refused before it serves, clients' p99 while it shadows within 1.5× of before: "
        + ("met" if met else "**not met**") + " by the median window, "
        + ("met" if met_worst else "**not met**") + " by the worst window.",
    ])


def commit() -> str:
    out = subprocess.run(["git", "log", "-1", "--format=%h"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "daemon"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + (" (daemon/ modified)" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per round and case")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=100, help="requests before each round, not measured")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--gate", action="store_true", help="the slow and the memory-hungry candidate instead")
    args = parser.parse_args()
    if args.gate:
        print_and_write(GATE_SECTION, gate(args), write=not args.no_write)
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    try:
        cases, final = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(cases, final, args)
    print_and_write(SECTION, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
