"""infermux against PyTriton (Triton's C++ server with a Python model), in one run on one machine.

    python tests/benchmarks/bench_pytriton.py [--duration 3] [--rounds 3] [--no-write]

Both serve the sample classifier through onnxruntime (1 intra-op thread a
session), one [1,3,64,64] float32 image a request, at concurrency 1, 16
and 64, rounds alternating between the two servers:

  infermux   `infermux serve` in three configurations (CONFIGURATIONS): 1
             context, 2 contexts (one shared session), and 2 contexts batched
             (max_batch 16, 200 µs delay), driven by
             `infermux.cli.bench.run_load` (one DEALER, c requests in flight);
             the best of the three at each concurrency is compared
  pytriton   `Triton.bind` with 2 model instances (a session each) and
             Triton's dynamic batcher (max_batch_size 16, 100 µs delay),
             driven over gRPC by `tritonclient.grpc.aio` (c requests in flight)

Each side uses its own client, in its own process: the protocols differ, so
no one load generator can drive both. PyTriton runs in a venv of its own
(`--venv`, made on first use with `pip install nvidia-pytriton onnxruntime`)
on the system's Python (`--python`): the wheel's Python backend stub links
the system's libpython, and a different build of the same minor version
(pyenv's, say) fails in the stub with "'_thread.RLock' object has no
attribute '_recursion_count'". Writes the "## Peer comparison: PyTriton"
section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import BASELINES, ENGINE, daemon_command, serving  # noqa: E402
from compiled import build_bare  # noqa: E402
from results import markdown_table, print_and_write, stamp  # noqa: E402

from infermux.cli.bench import run_load  # noqa: E402
from infermux.cli.infer import parse_inputs  # noqa: E402

SECTION = "Peer comparison: PyTriton"
LEVELS = (1, 16, 64)
# infermux's configurations, each its own daemon: (case, contexts, extra config lines). One context
# computes every request on the frontend thread (the fast path); two let a second request run on an
# executor thread; batching merges what waits.
CONFIGURATIONS = (
    ("infermux 1 context", 1, ""),
    ("infermux 2 contexts", 2, ""),
    ("infermux batched", 2, "max_batch = 16\nbatch_delay_us = 200\n"),
)
# Measured beside them, on the same socket and load generator (baselines.py): the bare loop, the echo
# server, which answers without parsing or computing (what this box and load generator allow), and the
# bare loop with its loop in C (bare.c), where it can be built: what a compiled receive loop would reach.
REFERENCES = (("echo", "echo"), ("bare loop", "bare", str(ENGINE)))
COMPILED = "C bare loop"
GRPC_PORT, HTTP_PORT, METRICS_PORT = 18801, 18800, 18802
SERVER = """\
import sys
import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

path, grpc_port, http_port, metrics_port, instances = sys.argv[1], *map(int, sys.argv[2:6])

def instance():
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    @batch
    def infer(images):
        return {"probs": session.run(["probs"], {"images": images})[0]}
    return infer

config = TritonConfig(grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port, log_verbose=0)
with Triton(config=config) as triton:
    triton.bind(model_name="classifier", infer_func=[instance() for _ in range(instances)],
                inputs=[Tensor(name="images", dtype=np.float32, shape=(3, 64, 64))],
                outputs=[Tensor(name="probs", dtype=np.float32, shape=(10,))],
                config=ModelConfig(max_batch_size=16,
                                   batcher=DynamicBatcher(max_queue_delay_microseconds=100)))
    print("serving", flush=True)
    triton.serve()
"""
CLIENT = """\
import asyncio, json, sys, time
import numpy as np
import tritonclient.grpc.aio as grpcclient

url, concurrency, duration, warmup = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])

async def main():
    client = grpcclient.InferenceServerClient(url)
    image = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
    def request():
        tensor = grpcclient.InferInput("images", [1, 3, 64, 64], "FP32")
        tensor.set_data_from_numpy(image)
        return [tensor]
    for _ in range(warmup):
        await client.infer("classifier", request())
    latencies, errors = [], 0
    stop = time.perf_counter() + duration
    async def worker():
        nonlocal errors
        while time.perf_counter() < stop:
            t0 = time.perf_counter_ns()
            try:
                await client.infer("classifier", request())
            except Exception:
                errors += 1
                continue
            latencies.append((time.perf_counter_ns() - t0) / 1000)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    await client.close()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None
    print(json.dumps({"qps": len(latencies) / elapsed, "p50_us": pick(0.5), "p99_us": pick(0.99),
                      "errors": errors}))

asyncio.run(main())
"""


def pytriton_venv(venv: Path, python: str) -> Path:
    """The venv's interpreter, made (nvidia-pytriton, onnxruntime) on first use."""
    interpreter = venv / "bin" / "python"
    if not interpreter.exists():
        print(f"making {venv} with {python} (nvidia-pytriton, onnxruntime; a few minutes)", file=sys.stderr)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(interpreter), "-m", "pip", "install", "-q", "nvidia-pytriton", "onnxruntime"], check=True)
    return interpreter


def pytriton_round(interpreter: Path, client: Path, c: int, args: argparse.Namespace) -> dict:
    out = subprocess.run([str(interpreter), str(client), f"127.0.0.1:{GRPC_PORT}", str(c), str(args.duration),
                          str(args.warmup)], capture_output=True, text=True, timeout=120 + args.duration)
    if out.returncode != 0:
        raise RuntimeError(f"the PyTriton client failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_for_pytriton(process: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "serving" in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            raise RuntimeError(f"PyTriton exited: {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"PyTriton did not start in {timeout_s:g} s; its log ends:\n"
                       f"{log.read_text(errors='replace')[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "infermux" / "pytriton-venv")
    parser.add_argument("--python", default="/usr/bin/python3", help="the system Python the venv is made with")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    interpreter = pytriton_venv(args.venv, args.python)
    rows: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="imx-pyt-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "server.py").write_text(SERVER)
        (tmp / "client.py").write_text(CLIENT)
        log = tmp / "pytriton.log"
        with open(log, "wb") as out:
            triton = subprocess.Popen([str(interpreter), str(tmp / "server.py"), str(ENGINE), str(GRPC_PORT),
                                       str(HTTP_PORT), str(METRICS_PORT), "2"], stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_pytriton(triton, log)
            servers = {}
            for n, (case, contexts, extra) in enumerate(CONFIGURATIONS):
                servers[case] = daemon_command(tmp, f"daemon{n}", contexts, extra=extra)
            built = build_bare(tmp)
            references = [*REFERENCES, *([(COMPILED, "compiled-bare", str(ENGINE), str(built.path))]
                                         if built.path else [])]
            for case, kind, *more in references:
                endpoint = f"ipc://{tmp}/{kind}.sock"
                servers[case] = ([sys.executable, str(BASELINES), kind, endpoint, *more], endpoint)
            inputs = parse_inputs([], ["images=1x3x64x64"], "float32")
            ctx = multiprocessing.get_context("spawn")
            with contextlib.ExitStack() as stack:
                for case, (command, endpoint) in servers.items():
                    stack.enter_context(serving(case, command, endpoint, tmp))
                generator = stack.enter_context(ProcessPoolExecutor(1, mp_context=ctx))
                for round_ in range(args.rounds):
                    for c in LEVELS:
                        p = pytriton_round(interpreter, tmp / "client.py", c, args)
                        rows.setdefault(("pytriton", c), []).append(p)
                        for case, (_, endpoint) in servers.items():
                            r = generator.submit(run_load, endpoint, "classifier", inputs, concurrency=c,
                                                 duration_s=args.duration, warmup=args.warmup).result()
                            rows.setdefault((case, c), []).append(
                                {"qps": r.qps, "p50_us": r.p50_us, "p99_us": r.p99_us, "errors": r.requests - r.ok})
                        ours = "  ".join(f"{case} {rows[case, c][-1]['qps']:7,.0f}/s" for case in servers)
                        print(f"  round {round_ + 1} c={c:<3} {ours}  pytriton {p['qps']:7,.0f}/s", file=sys.stderr)
        finally:
            triton.terminate()
            try:
                triton.wait(30)
            except subprocess.TimeoutExpired:
                triton.kill()
    body = report(rows, args, built.missing)
    print_and_write(SECTION, body, write=not args.no_write, titled=True)
    return 0


def ratio_range(mine: list[dict], theirs: list[dict]) -> str:
    """Per-round QPS ratios, round i against round i: their median and range."""
    ratios = sorted(m["qps"] / t["qps"] for m, t in zip(mine, theirs) if t["qps"])
    return f"**{statistics.median(ratios):.2f}×** ({ratios[0]:.2f}–{ratios[-1]:.2f})"


def report(rows: dict[tuple[str, int], list[dict]], args: argparse.Namespace, compiled_missing: str = "") -> str:
    table = []
    med = lambda runs, key: statistics.median(r[key] for r in runs if r[key] is not None)  # noqa: E731
    for c in LEVELS:
        cases = [case for case, _, _ in CONFIGURATIONS]
        best = max(cases, key=lambda case: med(rows[case, c], "qps"))
        mine, theirs = rows[best, c], rows["pytriton", c]
        compiled = rows.get((COMPILED, c))
        table.append([str(c), best.removeprefix("infermux "),
                      *(f"{med(rows[case, c], 'qps'):,.0f}" for case in cases), f"{med(theirs, 'qps'):,.0f}",
                      f"{med(rows['bare loop', c], 'qps'):,.0f}", f"{med(rows['echo', c], 'qps'):,.0f}",
                      f"{5 * med(theirs, 'qps') / med(rows['bare loop', c], 'qps'):.2f} / "
                      f"{5 * med(theirs, 'qps') / med(rows['echo', c], 'qps'):.2f}",
                      ratio_range(mine, theirs),
                      f"{med(compiled, 'qps'):,.0f}" if compiled else "–",
                      ratio_range(compiled, theirs) if compiled else "–",
                      f"{med(mine, 'p50_us'):,.0f}", f"{med(theirs, 'p50_us'):,.0f}",
                      f"{med(mine, 'p99_us'):,.0f}", f"{med(theirs, 'p99_us'):,.0f}",
                      str(sum(r["errors"] for r in mine + theirs))])
    return "\n".join([
        stamp(), "",
        f"Sample classifier, one [1,3,64,64] float32 image a request; {args.rounds} rounds × {args.duration:g} s "
        f"per server and concurrency after {args.warmup} warm-up requests, alternating; medians, and the "
        "per-round QPS ratios' median and range (the better infermux configuration at each c against PyTriton; "
        "p50/p99 are that configuration's). infermux: 1 context, 2 contexts, and 2 contexts batched (max_batch "
        "16, 200 µs), each its own daemon, ipc, its own load generator; beside them on the same socket and load "
        "generator, the bare loop (receive, parse, onnxruntime, reply in one Python thread) and the echo server "
        "(one Python thread answering a fixed reply: no parsing, no compute), and the C bare loop (the bare "
        "loop's receive, parse and reply in C, onnxruntime reached through Python: what a compiled receive loop "
        "would reach, not a part of infermux). \"5 × PyTriton ÷ bare loop\" above "
        "1 means that the ≥ 5× goal asks infermux for more than the bare loop answers; \"÷ echo\" above 1, for "
        "more than the echo server, which does no work, answers on this box with this load generator. PyTriton "
        "(nvidia-pytriton in its own venv on the system Python): 2 instances, dynamic batching up to 16 with "
        "100 µs delay, gRPC on 127.0.0.1, `tritonclient.grpc.aio`. Each side's client is its own, so the "
        "figures include each protocol's client cost.", "",
        markdown_table(["c", "best infermux", "1 context QPS", "2 contexts QPS", "batched QPS", "PyTriton QPS",
                        "bare loop QPS", "echo QPS", "5 × PyTriton ÷ bare loop / ÷ echo",
                        "best infermux ÷ PyTriton", "C bare loop QPS", "C bare loop ÷ PyTriton", "p50 µs infermux",
                        "p50 µs PyTriton", "p99 µs infermux", "p99 µs PyTriton", "errors"], table), "",
        *([f"C bare loop left out: {compiled_missing}.", ""] if compiled_missing else []),
        "Reproduce: `python tests/benchmarks/bench_pytriton.py` (makes ~/.cache/infermux/pytriton-venv first).",
    ])


if __name__ == "__main__":
    sys.exit(main())
