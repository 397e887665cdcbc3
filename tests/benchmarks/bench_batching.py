"""Issue 4: dynamic batching throughput and per-key fairness, in one run on one machine.

    python tests/benchmarks/bench_batching.py [--duration 3] [--rounds 3] [--no-write]

Throughput: the sample MLP (features [1,256]) and classifier (images
[1,3,64,64]) with the batch settings of etc/infermux/infermux.toml, against
the same models with `max_batch = 1`, at concurrency 16 and 32. All four
are served by one daemon for the whole run and the rounds interleave them,
so load from elsewhere on the box hits every case alike; the table shows
the median round (by QPS). The load generator (`infermux.bench.run_load`)
runs in its own process.

Fairness: three cameras (keys cam0..cam2), each one request in flight,
against the classifier: alone; then with a fourth key keeping 10× as many
in flight (the flood); then the same flood with no keys at all (one shared
FIFO lane, what per-key fairness replaces). Every sender is its own
process. The figure that matters is the cameras' p99 with the flood
against their p99 alone (goal: within 2×).

Writes the "## Batching and fairness (issue 4)" section of RESULTS.md.
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
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import markdown_table, stamp, write_section  # noqa: E402

from infermux import config as cfg  # noqa: E402
from infermux.bench import BenchResult, run_load, wait_ready  # noqa: E402
from infermux.client import AdminClient  # noqa: E402
from infermux.infer import parse_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ETC = ROOT / "etc" / "infermux" / "infermux.toml"
SECTION = "Batching and fairness (issue 4)"
SHAPES = {"mlp": "features=1x256", "classifier": "images=1x3x64x64"}
CONCURRENCY = (16, 32)
CAMERAS, FLOOD_FACTOR = 3, 10
FAIR_MODEL = "classifier"


def model_toml(mc: cfg.ModelConfig, name: str, batched: bool) -> str:
    """One [[models]] entry: the shipped settings, with batching on or off."""
    preferred = f"preferred_batch = {list(mc.preferred_batch)}\n" if batched and mc.preferred_batch else ""
    return (f'[[models]]\nname = "{name}"\nengine = "{mc.engine}"\ncontexts = {mc.contexts}\n'
            f"max_queue = 256\ntimeout_ms = 10000\nmax_batch = {mc.max_batch if batched else 1}\n"
            f"batch_delay_us = {mc.batch_delay_us if batched else 0}\n{preferred}")


def shipped() -> dict[str, cfg.ModelConfig]:
    """The sample models as etc/infermux/infermux.toml configures them."""
    return {m.name: m for m in cfg.load(ETC).models}


def inputs_of(model: str) -> dict:
    return parse_inputs([], [SHAPES[model.split("_")[0]]], "float32")


@contextlib.contextmanager
def daemon(tmp: Path) -> Iterator[tuple[str, str]]:
    """One daemon serving every model batched and unbatched; yields (infer, admin) endpoints."""
    models = shipped()
    text = f'[daemon]\nlisten = ["ipc://infer.sock"]\nengine_dir = "{ROOT / "engines"}"\n'
    for name in SHAPES:
        text += model_toml(models[name], name, True) + model_toml(models[name], f"{name}_unbatched", False)
    config, run_dir = tmp / "infermux.toml", tmp / "run"
    config.write_text(text)
    log = open(tmp / "daemon.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "infermux", "serve", "--config", str(config),
                                "--runtime-dir", str(run_dir)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"ipc://{run_dir}/infer.sock"
    try:
        for name in SHAPES:
            wait_ready(endpoint, name, inputs_of(name), timeout_s=60)
        yield endpoint, f"ipc://{run_dir}/admin.sock"
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def batches(admin: str, model: str) -> dict[int, int]:
    """Cumulative backend calls per batch size (rows) of `model`."""
    with AdminClient(admin) as client:
        view = next(v for v in client.call("models")["models"] if v["name"] == model)
    return {int(k): n for k, n in view["stats"]["batches"].items()}


def mean_batch(before: dict[int, int], after: dict[int, int]) -> float:
    calls = {k: after[k] - before.get(k, 0) for k in after}
    n = sum(calls.values())
    return sum(k * c for k, c in calls.items()) / n if n else 0.0


@dataclass
class Case:
    """Every round of one model at one concurrency."""

    model: str
    concurrency: int
    rounds: list[BenchResult] = field(default_factory=list)
    mean_batch: list[float] = field(default_factory=list)

    @property
    def median(self) -> BenchResult:
        return sorted(self.rounds, key=lambda r: r.qps)[(len(self.rounds) - 1) // 2]


def throughput(pool: ProcessPoolExecutor, endpoint: str, admin: str, args: argparse.Namespace) -> list[Case]:
    cases = {(m, c): Case(m, c) for base in SHAPES for m in (base, f"{base}_unbatched") for c in CONCURRENCY}
    for round_ in range(args.rounds):
        for (model, c), case in cases.items():
            before = batches(admin, model)
            result = pool.submit(run_load, endpoint, model, inputs_of(model), concurrency=c,
                                 duration_s=args.duration, warmup=args.warmup).result()
            case.rounds.append(result)
            case.mean_batch.append(mean_batch(before, batches(admin, model)))
            print(f"  round {round_ + 1}  {model:<22} c={c:<3} {result.qps:8,.0f}/s  p50 {result.p50_us:7.0f} µs"
                  f"  p99 {result.p99_us:7.0f} µs  batch {case.mean_batch[-1]:.1f}", file=sys.stderr)
    return list(cases.values())


@dataclass
class Fairness:
    """One scenario's rounds: the cameras' results and the flood's."""

    name: str
    cameras: list[list[BenchResult]] = field(default_factory=list)
    flood: list[BenchResult | None] = field(default_factory=list)

    def camera_p99(self, i: int) -> float:
        """The worst camera's p99 in round i."""
        return max(r.p99_us or 0.0 for r in self.cameras[i])

    @property
    def median_round(self) -> int:
        order = sorted(range(len(self.cameras)), key=self.camera_p99)
        return order[(len(order) - 1) // 2]


def fairness(pool: ProcessPoolExecutor, endpoint: str, args: argparse.Namespace) -> list[Fairness]:
    inputs = inputs_of(FAIR_MODEL)
    scenarios = [Fairness("cameras alone"), Fairness("+ flood, keyed"), Fairness("+ flood, no keys")]

    def load(key: str | None, concurrency: int):
        return pool.submit(run_load, endpoint, FAIR_MODEL, inputs, concurrency=concurrency,
                           duration_s=args.duration, warmup=50, fields={"key": key})

    for round_ in range(args.rounds):
        for scenario in scenarios:
            keyed = scenario.name != "+ flood, no keys"
            flood = load("flood" if keyed else None, FLOOD_FACTOR) if scenario.name != "cameras alone" else None
            cameras = [load(f"cam{i}" if keyed else None, 1) for i in range(CAMERAS)]
            scenario.cameras.append([f.result() for f in cameras])
            scenario.flood.append(flood.result() if flood else None)
            worst = scenario.camera_p99(-1)
            print(f"  round {round_ + 1}  {scenario.name:<18} cameras p99 {worst:7.0f} µs"
                  + (f"  flood {scenario.flood[-1].qps:7,.0f}/s" if flood else ""), file=sys.stderr)
    return scenarios


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def report(cases: list[Case], fair: list[Fairness], args: argparse.Namespace,
           loads: tuple[float, float]) -> str:
    models = shipped()
    rows = []
    by_key = {(c.model, c.concurrency): c for c in cases}
    for base in SHAPES:
        for conc in CONCURRENCY:
            on, off = by_key[base, conc], by_key[f"{base}_unbatched", conc]
            for case in (off, on):
                r = case.median
                rows.append([case.model, str(conc), f"{r.qps:,.0f}", _us(r.p50_us), _us(r.p99_us),
                             f"{statistics.median(case.mean_batch):.1f}", str(sum(x.errors for x in case.rounds)),
                             " / ".join(f"{x.qps:,.0f}" for x in case.rounds)])
    ratios = ", ".join(f"{base} c={conc}: **{by_key[base, conc].median.qps / by_key[f'{base}_unbatched', conc].median.qps:.2f}×**"
                       for base in SHAPES for conc in CONCURRENCY)
    settings = "; ".join(f"{n}: contexts {models[n].contexts}, max_batch {models[n].max_batch}, "
                         f"batch_delay_us {models[n].batch_delay_us}"
                         + (f", preferred_batch {list(models[n].preferred_batch)}" if models[n].preferred_batch else "")
                         for n in SHAPES)
    fair_rows = []
    for s in fair:
        i = s.median_round
        cams = s.cameras[i]
        flood = s.flood[i]
        fair_rows.append([s.name, f"{sum(r.qps for r in cams):,.0f}", _us(statistics.median(r.p50_us or 0 for r in cams)),
                          _us(s.camera_p99(i)), " / ".join(_us(s.camera_p99(k)) for k in range(len(s.cameras))),
                          f"{flood.qps:,.0f}" if flood else "-", _us(flood.p99_us) if flood else "-"])
    alone = fair[0].camera_p99(fair[0].median_round)
    keyed = fair[1].camera_p99(fair[1].median_round)
    fifo = fair[2].camera_p99(fair[2].median_round)
    return f"""{stamp()}
1-min load average {loads[0]:.2f} before the run, {loads[1]:.2f} after; the box is shared, so other work can skew single rounds.

### Throughput: batched vs unbatched

Shipped settings (etc/infermux/infermux.toml) — {settings}. Unbatched = the same model with `max_batch = 1`. One request = one row. {args.rounds} rounds × {args.duration:g} s per case after {args.warmup} warm-up requests, rounds interleaved; median round (by QPS) shown; "batch" = mean rows per backend call (from the daemon's histogram).

{markdown_table(["model", "c", "QPS", "p50 µs", "p99 µs", "batch", "errors", "QPS per round"], rows)}

Batched / unbatched QPS (medians): {ratios}. Goal: ≥ 1.5× on the MLP at c=32.

### Fairness: one key with {FLOOD_FACTOR}× the others' requests in flight

{FAIR_MODEL} with its shipped settings. {CAMERAS} cameras, one request in flight each (keys cam0..cam{CAMERAS - 1}); the flood keeps {FLOOD_FACTOR} in flight under one key; "no keys" sends the same load without keys (one FIFO lane). Each sender is its own process (`run_load`); {args.rounds} rounds × {args.duration:g} s; the round with the median worst-camera p99 shown.

{markdown_table(["scenario", "cameras QPS", "camera p50 µs", "worst camera p99 µs", "p99 per round", "flood QPS", "flood p99 µs"], fair_rows)}

Cameras' p99 with the flood / alone: keyed **{keyed / alone:.2f}×** (goal ≤ 2×), no keys {fifo / alone:.2f}×.
Reproduce: `python tests/benchmarks/bench_batching.py`.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per case and round (default 3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    parser.add_argument("--only", choices=("throughput", "fairness"), help="run one part (implies --no-write)")
    args = parser.parse_args(argv)
    before = os.getloadavg()[0]
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no GIL shared with this one
    with tempfile.TemporaryDirectory() as tmp, daemon(Path(tmp)) as (endpoint, admin), \
            ProcessPoolExecutor(CAMERAS + 1, mp_context=ctx) as pool:
        list(pool.map(time.sleep, [0.2] * (CAMERAS + 1)))  # start every generator before measuring
        cases = throughput(pool, endpoint, admin, args) if args.only != "fairness" else []
        fair = fairness(pool, endpoint, args) if args.only != "throughput" else []
    if args.only:
        return 0
    body = report(cases, fair, args, (before, os.getloadavg()[0]))
    print(body)
    if not args.no_write:
        write_section(SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
