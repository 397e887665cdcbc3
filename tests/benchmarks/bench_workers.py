"""Cold models in worker processes against the same models hot.

    python tests/benchmarks/bench_workers.py [--duration 2] [--rounds 3] [--starts 5] [--no-write] [--section H]
                                             [--against REV]

1. Latency at concurrency 1, client round trip, for an identity model on
   [1, 12288] float32 (49 KB in and out) and on [1, 1225000] float32
   (4.9 MB in and out), each served hot and cold by one daemon. Rounds
   interleave hot and cold so that load from elsewhere hits both alike.
2. Inline vs shared memory for the 49 KB case: two more daemons whose
   workers take every tensor through a slot, or every tensor inline in the
   pipe message (INFERMUX_WORKER_INLINE_BYTES), decide the default.
3. Cold start, from the first request to the first 200 (the client retries
   every 2 ms instead of honouring retry_after_ms, to see the real time),
   with and without the spare worker; `engine` is the worker's own load +
   warm-up time as its `loaded` event reports it. Between starts the
   version is unloaded by the admin socket and the next spare awaited.

4. With --against REV, the hot and cold cases of 1. also run on the daemon
   at git revision REV, in the same rounds: a change's cost as a ratio.

Writes the "## Cold workers" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402
from revision import describe, package_env  # noqa: E402

from infermux.cli.bench import BenchResult, run_load, wait_ready  # noqa: E402
from infermux.client import AdminClient, Client, SharedMemory  # noqa: E402

SECTION = "Cold workers"
SIZES = {"49k": 12288, "4m9": 1225000}
HEAD = """\
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
spare_worker = {spare}
watch = false
"""
MODEL = """
[[models]]
name = "{name}"
engine = "{engine}"
mode = "{mode}"  # placement by its old name (inproc: hot, multiproc: cold), which --against revisions read too
preload = {preload}
idle_unload_s = 0
"""


def identity(path: Path, width: int) -> Path:
    """y = Identity(x), float32 [1, width]: transport cost with nearly no compute."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


class Daemon:
    """`python -m infermux serve` in a temporary folder, stopped on exit."""

    def __init__(self, root: Path, name: str, models: str, spare: bool = True, env: dict | None = None) -> None:
        self.dir = root / name
        self.dir.mkdir()
        self.log = self.dir / "daemon.log"
        config = self.dir / "infermux.toml"
        config.write_text(HEAD.format(engines=root / "engines", spare=str(spare).lower()) + models)
        self.endpoint = f"ipc://{self.dir / 'run' / 'infer.sock'}"
        self.admin = f"ipc://{self.dir / 'run' / 'admin.sock'}"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "infermux", "serve", "--config", str(config),
                                          "--runtime-dir", str(self.dir / "run"), "--state-dir",
                                          str(self.dir / "state"), "--log-level", "info"],
                                         stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, count: int = 1, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(re.findall(pattern, self.text())) < count:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{pattern!r} x{count} not in the log:\n{self.text()[-3000:]}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def models(*entries: tuple[str, str, str]) -> str:
    return "".join(MODEL.format(name=n, engine=e, mode=m, preload="true") for n, e, m in entries)


def inputs(size: str) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).random((1, SIZES[size]), dtype=np.float32)}


Case = tuple[Daemon, str, dict[str, Any], dict[str, Any]]  # daemon, model, inputs, request fields


def latency(cases: dict[str, Case], args: argparse.Namespace) -> dict[str, list[BenchResult]]:
    """Interleaved rounds of c=1 closed-loop runs; name -> one result per round."""
    runs: dict[str, list[BenchResult]] = {name: [] for name in cases}
    for name, (daemon, model, x, fields) in cases.items():
        reply = wait_ready(daemon.endpoint, model, x, fields=fields)
        assert reply.ok, reply.header
    for _ in range(args.rounds):
        for name, (daemon, model, x, fields) in cases.items():
            result = run_load(daemon.endpoint, model, x, concurrency=1, fields=fields,
                              duration_s=args.duration, warmup=args.warmup)
            assert result.errors == 0, result.by_status
            runs[name].append(result)
    return runs


def memcpy_us(nbytes: int, repeat: int = 50) -> float:
    """One warm memcpy of `nbytes` (what a slot costs per direction), median µs."""
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    times = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        np.copyto(dst, src)
        times.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(times)


def median_round(results: list[BenchResult]) -> BenchResult:
    return sorted(results, key=lambda r: r.p50_us or 0)[len(results) // 2]


def cold_starts(daemon: Daemon, model: str, spare: bool, count: int) -> list[tuple[float, float]]:
    """(first request → first 200, the worker's engine load + warm-up) in ms, `count` times."""
    x = inputs("49k")
    out = []
    with Client(daemon.endpoint, timeout_s=30) as client, AdminClient(daemon.admin) as admin:
        for i in range(count):
            if spare:
                daemon.wait_for(r"spare_started pid=", count=i + 1)
                time.sleep(0.3)  # let the spare's start-up settle off the CPUs
            start = time.perf_counter()
            while client.infer(model, x).status != 200:
                time.sleep(0.002)
            took = (time.perf_counter() - start) * 1000
            daemon.wait_for(rf"loaded model={model} .*engine_ms=", count=i + 1)
            engine = [int(m) for m in re.findall(rf"loaded model={model} .*engine_ms=(\d+)", daemon.text())][i]
            out.append((took, engine))
            admin.call("unload", model=model)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measured run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--starts", type=int, default=5, help="cold starts per case")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--against", metavar="REV", help="also run the hot and cold cases at git revision REV")
    parser.add_argument("--section", default=SECTION,
                        help="RESULTS.md heading to write, e.g. for a run on another machine")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        root = Path(tmp)
        for size, width in SIZES.items():
            identity(root / "engines" / size / "1" / "model.onnx", width)
        main_models = models(*[(f"{m}{s}", f"{s}/1/model.onnx", mode)
                               for s in SIZES for m, mode in (("hot", "inproc"), ("cold", "multiproc"))])
        main_d = Daemon(root, "main", main_models)
        slot_d = Daemon(root, "slot", models(("cold49k", "49k/1/model.onnx", "multiproc")),
                        env={"INFERMUX_WORKER_INLINE_BYTES": "0"})
        inline_d = Daemon(root, "inline", models(("cold49k", "49k/1/model.onnx", "multiproc")),
                          env={"INFERMUX_WORKER_INLINE_BYTES": str(1 << 20)})
        start_models = MODEL.format(name="starter", engine="49k/1/model.onnx", mode="multiproc", preload="false")
        spare_d = Daemon(root, "spare", start_models, spare=True)
        bare_d = Daemon(root, "nospare", start_models, spare=False)
        daemons = [main_d, slot_d, inline_d, spare_d, bare_d]
        if args.against:
            daemons.append(Daemon(root, "against", main_models, env=package_env(args.against, root / "rev")))
        shm = None
        try:
            for d in daemons:
                d.wait_for(" ready ")
            small, big = inputs("49k"), inputs("4m9")
            shm = SharedMemory.beside(main_d.endpoint, 2 * big["x"].nbytes, "bench")
            region = shm.ndarray(big["x"].shape, big["x"].dtype)
            region[:] = big["x"]
            in_shm = {"x": shm.ref(region)}
            out_shm = {"output_regions": {"y": shm.ref(shm.ndarray(big["x"].shape, offset=big["x"].nbytes))}}
            against = {f"{s} {m}@REV": (daemons[-1], f"{m}{s}", x, {})
                       for s, x in (("49k", small), ("4m9", big)) for m in ("hot", "cold")} if args.against else {}
            runs = latency({"49k hot": (main_d, "hot49k", small, {}), "49k cold": (main_d, "cold49k", small, {}),
                            "4m9 hot": (main_d, "hot4m9", big, {}), "4m9 cold": (main_d, "cold4m9", big, {}),
                            **against,
                            "4m9 hot, input in shared memory": (main_d, "hot4m9", in_shm, {}),
                            "4m9 cold, input in shared memory": (main_d, "cold4m9", in_shm, {}),
                            "4m9 hot, input and output in shared memory": (main_d, "hot4m9", in_shm, out_shm),
                            "4m9 cold, input and output in shared memory": (main_d, "cold4m9", in_shm, out_shm),
                            "49k cold, all via slot": (slot_d, "cold49k", small, {}),
                            "49k cold, all inline": (inline_d, "cold49k", small, {})}, args)
            with_spare = cold_starts(spare_d, "starter", True, args.starts)
            without = cold_starts(bare_d, "starter", False, args.starts)
        finally:
            if shm is not None:
                del region, in_shm, out_shm
                shm.close()
            for d in daemons:
                d.stop()
    body = report(runs, with_spare, without, args)
    print_and_write(args.section, body, write=not args.no_write)
    return 0


def report(runs: dict[str, list[BenchResult]], with_spare: list[tuple[float, float]],
           without: list[tuple[float, float]], args: argparse.Namespace) -> str:
    rows, best = [], {name: median_round(results) for name, results in runs.items()}
    for name, r in best.items():
        rows.append([name, f"{r.qps:,.0f}", f"{r.p50_us:,.0f}", f"{r.p90_us:,.0f}", f"{r.p99_us:,.0f}",
                     " / ".join(f"{x.p50_us:,.0f}" for x in runs[name])])
    extra = {s: best[f"{s} cold"].p50_us - best[f"{s} hot"].p50_us for s in SIZES}
    shared = {what: best[f"4m9 cold, {what} in shared memory"].p50_us - best[f"4m9 hot, {what} in shared memory"].p50_us
              for what in ("input", "input and output")}
    copy = memcpy_us(SIZES["4m9"] * 4)

    def starts(values: list[tuple[float, float]]) -> list[str]:
        total = [t for t, _ in values]
        over = [t - e for t, e in values]
        return [f"{statistics.median(total):,.0f}", f"{min(total):,.0f}–{max(total):,.0f}",
                f"{statistics.median([e for _, e in values]):,.0f}", f"{statistics.median(over):,.0f}"]

    load_avg = os.getloadavg()[0]
    return "\n".join([
        stamp(), f"1-min load average {load_avg:.2f} at the end of the run.", "",
        f"Identity models, concurrency 1, {args.rounds} rounds × {args.duration:g} s after {args.warmup} warm-up "
        "requests; median round by p50 shown, with every round's p50. Latency is the client's round trip in µs.", "",
        markdown_table(["case", "QPS", "p50 µs", "p90 µs", "p99 µs", "p50 per round"], rows), "",
        f"Cold minus hot, p50: **{extra['49k']:,.0f} µs** at 49 KB, **{extra['4m9']:,.0f} µs** at 4.9 MB "
        f"(goal at 4.9 MB: ≤ 500 µs). The cold path adds one copy of the tensor into the slot (one warm "
        f"4.9 MB memcpy takes {copy:,.0f} µs here, measured in this run; the worker computes its outputs "
        "straight into the slot), two process wake-ups with their Python around them, and the tensor read and "
        "written by one more process, often on the other CPU. docs/workers.md breaks the 4.9 MB request down.",
        "",
        f"With the tensors in a client's shared-memory region (regions.py), the worker maps the region and "
        f"nobody copies the input; cold minus hot at 4.9 MB is **{shared['input']:,.0f} µs** with the input "
        f"there (the output comes back in a frame) and **{shared['input and output']:,.0f} µs** with both "
        "(from the second request of a kind on, both paths compute the output straight into the region).",
        "",
        f"Cold start, first request to first 200 ({len(with_spare)} starts each, [1,12288] identity model):", "",
        markdown_table(["case", "median ms", "range ms", "engine ms", "start − engine ms"],
                       [["spare worker", *starts(with_spare)], ["no spare", *starts(without)]]), "",
        "Goal with the spare: engine load + 150 ms. `engine` is the worker's own load and warm-up; the rest is "
        "the LOAD message, the proxy, the client's 2 ms retry loop and the first request.",
        *against_lines(best, args.against),
        "Reproduce: `python tests/benchmarks/bench_workers.py`.",
    ])


def against_lines(best: dict[str, BenchResult], rev: str | None) -> list[str]:
    """This checkout's p50 over the revision's, per case, from the same rounds."""
    if not rev:
        return []
    ratios = ", ".join(f"{case} {best[case].p50_us / best[f'{case}@REV'].p50_us:.2f}×"
                       for case in ("49k hot", "49k cold", "4m9 hot", "4m9 cold"))
    return ["", f"p50 of this checkout / {describe(rev)} (the @REV rows, same rounds): {ratios}."]


if __name__ == "__main__":
    sys.exit(main())
