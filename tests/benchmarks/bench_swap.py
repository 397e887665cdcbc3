"""How long a hot swap takes, and what it does to latency under load.

    python tests/benchmarks/bench_swap.py [--swaps 10] [--concurrency 4] [--steady 6] [--no-write]

The sample classifier ([1,3,64,64] conv) is served from a watched engine
directory. A load generator in its own process keeps `concurrency` requests
in flight on one DEALER the whole time and records, per reply, when it was
sent, its round trip and the version that answered. After a steady phase,
the script publishes new versions the documented way (version folder built
under a hidden name, then renamed into place), `--gap` seconds apart:

- swap time: rename → the first reply from the new version, seen by the
  load generator (under load) and by a 1 ms polling client (idle daemon);
- p99 during swaps: replies sent within `--window` s after a rename (which
  covers detect, load, warm-up, take-over and the old version's drain: see
  the `took_ms` and drain lines of the daemon log) against the steady p99.

Writes the "## Hot swap" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402

from support.harness import Daemon  # noqa: E402
from infermux.client import Client  # noqa: E402
from infermux.protocol import encode_request, parse_header  # noqa: E402

ROOT = HERE.parents[1]
ENGINE = ROOT / "engines" / "classifier" / "1" / "model.onnx"
IMAGE = {"images": np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)}

CONFIG = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
log_level = "info"
"""


def publish(root: Path, version: int) -> int:
    """Stage `cls/.<v>.tmp/model.onnx`, rename the folder to `cls/<v>`; returns the rename's monotonic ns."""
    staged = root / "cls" / f".{version}.tmp"
    staged.mkdir(parents=True)
    shutil.copyfile(ENGINE, staged / "model.onnx")
    at = time.monotonic_ns()
    os.rename(staged, root / "cls" / str(version))
    return at


def load_generator(endpoint: str, concurrency: int, duration_s: float, out: "multiprocessing.Queue") -> None:
    """Closed loop on one DEALER: (sent ns, round trip ns, version, status) for every reply."""
    frames = encode_request("cls", IMAGE, id=0)
    header, tensors = parse_header(frames[0]), [bytes(f) for f in frames[1:]]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(endpoint)
    sent: dict[int, int] = {}
    rows: list[tuple[int, int, int, int]] = []
    ident, in_flight = 0, 0
    deadline = time.monotonic_ns() + int(duration_s * 1e9)

    def submit() -> None:
        nonlocal ident, in_flight
        ident += 1
        header["id"] = ident
        sent[ident] = time.monotonic_ns()
        sock.send_multipart([b"", json.dumps(header).encode(), *tensors])
        in_flight += 1

    for _ in range(concurrency):
        submit()
    while in_flight:
        reply = sock.recv_multipart()
        now = time.monotonic_ns()
        in_flight -= 1
        h = json.loads(reply[1])
        t0 = sent.pop(h["id"])
        rows.append((t0, now - t0, int(h.get("version") or 0), int(h["status"])))
        if now < deadline:
            submit()
    sock.close(0)
    out.put(np.array(rows, dtype=np.int64))


def idle_swap_ms(daemon: Daemon, root: Path, version: int) -> float:
    """Publish with no load; poll every ms until the new version answers."""
    with Client(daemon.endpoint) as client:
        at = publish(root, version)
        while client.infer("cls", IMAGE).version != str(version):
            time.sleep(0.001)
        return (time.monotonic_ns() - at) / 1e6


def p99_us(latencies_ns: np.ndarray) -> float:
    return float(np.percentile(latencies_ns, 99)) / 1000 if len(latencies_ns) else float("nan")


def took_ms(log: str) -> list[int]:
    return [int(line.rsplit("took_ms=", 1)[1].split()[0]) for line in log.splitlines()
            if "swapped model=cls" in line and "took_ms=" in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--swaps", type=int, default=10)
    parser.add_argument("--idle-swaps", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--steady", type=float, default=6.0, help="seconds of load before the first swap")
    parser.add_argument("--gap", type=float, default=2.0, help="seconds between swaps")
    parser.add_argument("--window", type=float, default=1.0, help="seconds after a rename counted as 'during'")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-swap-"))
    root = work / "engines"
    (root / "cls" / "1").mkdir(parents=True)
    shutil.copyfile(ENGINE, root / "cls" / "1" / "model.onnx")
    (root / "cls" / "model.toml").write_text("max_queue = 256\n")
    daemon = Daemon(work, CONFIG.format(root=root)).start()
    try:
        idle = [idle_swap_ms(daemon, root, v) for v in range(2, 2 + args.idle_swaps)]
        time.sleep(1.0)
        first = 2 + args.idle_swaps
        queue: multiprocessing.Queue = multiprocessing.Queue()
        duration = args.steady + args.swaps * args.gap + 1.0
        gen = multiprocessing.Process(target=load_generator,
                                      args=(daemon.endpoint, args.concurrency, duration, queue))
        start = time.monotonic_ns()
        gen.start()
        time.sleep(args.steady)
        renames = []
        for i in range(args.swaps):
            renames.append((first + i, publish(root, first + i)))
            time.sleep(args.gap)
        rows = queue.get(timeout=duration + 60)
        gen.join()
        log = daemon.log()
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)

    sent, rtt, version, status = rows.T
    window = int(args.window * 1e9)
    during = np.zeros(len(rows), dtype=bool)
    loaded_swaps = []
    for v, at in renames:
        during |= (sent >= at) & (sent < at + window)
        served = sent[(version == v)] + rtt[(version == v)]
        loaded_swaps.append((served.min() - at) / 1e6 if len(served) else float("nan"))
    # Steady: after a 2 s warm-up until the first rename, and between one swap's window and the next rename,
    # so both sides of the comparison share the same minutes of a shared box.
    steady = (sent >= start + int(2e9)) & (sent < renames[0][1])
    for (_, at), (_, next_at) in zip(renames, renames[1:] + [(0, start + int(duration * 1e9))]):
        steady |= (sent >= at + window) & (sent < next_at)
    errors = int((status != 200).sum())
    steady_p99, swap_p99 = p99_us(rtt[steady]), p99_us(rtt[during])
    steady_p50, swap_p50 = (float(np.median(rtt[m])) / 1000 for m in (steady, during))
    work_ms = took_ms(log)

    def med(xs: list[float]) -> str:
        return f"{np.median(xs):.0f}"

    table = markdown_table(
        ["", "swaps", "median ms", "p90 ms", "max ms"],
        [["swap time, idle daemon (1 ms poll)", str(len(idle)), med(idle),
          f"{np.percentile(idle, 90):.0f}", f"{max(idle):.0f}"],
         [f"swap time, under load (c={args.concurrency})", str(len(loaded_swaps)), med(loaded_swaps),
          f"{np.percentile(loaded_swaps, 90):.0f}", f"{max(loaded_swaps):.0f}"],
         ["of which load + warm-up + take-over (daemon `took_ms`)", str(len(work_ms)), med(work_ms),
          f"{np.percentile(work_ms, 90):.0f}", f"{max(work_ms):.0f}"]])
    latency = markdown_table(
        ["phase", "requests", "p50 µs", "p99 µs"],
        [["steady (before the swaps and between windows)", f"{int(steady.sum()):,}", f"{steady_p50:.0f}", f"{steady_p99:.0f}"],
         [f"within {args.window:g} s after a rename", f"{int(during.sum()):,}", f"{swap_p50:.0f}",
          f"{swap_p99:.0f}"]])
    ratio = swap_p99 / steady_p99
    body = f"""{stamp()}
1-min load average {load_before:.2f} before the run, {os.getloadavg()[0]:.2f} after (the box is shared).

The sample classifier ([1,3,64,64] conv, 1 context) served from a watched engine_dir; each new
version published by renaming a staged version folder into place (docs/hot-swap.md).
{len(rows):,} requests under load, {errors} not 200.

{table}

{latency}

p99 during swaps / steady p99: **{ratio:.2f}×** (goal ≤ 2×).
Swap time = rename → first reply from the new version as a client sees it: inotify event, debounce
(`watch_debounce_s` 0.05), onnxruntime session, warm-up, take-over. The old version drains after that.
Reproduce: `python tests/benchmarks/bench_swap.py`.
"""
    print_and_write("Hot swap", body, write=not args.no_write)
    print("swap ms, idle:", [round(x) for x in idle], "loaded:", [round(x) for x in loaded_swaps])
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
