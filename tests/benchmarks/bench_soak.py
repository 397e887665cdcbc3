"""Soak: a long mixed load, sampling the daemon's resources.

    python tests/benchmarks/bench_soak.py [--minutes 10]

Traffic: a hot model, a cold model whose worker unloads when idle (the
load on it comes in bursts with pauses longer than `idle_unload_s`), and a
hot model swapped to a new version every 20 s through the watched engine
directory. Cold requests are 80 KB, so they cross in shared-memory slots.
A client registers a shared-memory region every 2 s, sends requests with
their inputs and outputs in it to the hot and the cold model, checks the
outputs, and closes it (regions.py). Every 10 s: the daemon's RSS, open
file descriptors, threads, the /dev/shm segments named for infermux, and
the clients' regions the daemon still maps. Goal: RSS growth < 5 % after
warm-up (the first sample after the first minute), the rest flat. Writes
the "Soak" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402

from support.chaos import Load  # noqa: E402
from support.harness import Daemon  # noqa: E402
from support.publish import publish  # noqa: E402

X = np.ones((1, 4), np.float32)
WIDE = np.ones((1, 20_000), np.float32)  # 80 KB: over the inline limit, so it crosses in shared memory
CONFIG = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
watch_settle_s = 0.3

[[models]]
name = "hot"
engine = "hot/1/model.onnx"
contexts = 2

[[models]]
name = "cold"
engine = "cold/1/model.onnx"
placement = "cold"
idle_unload_s = 3
"""


def sample(pid: int) -> dict[str, int]:
    """RSS, fds and threads of `pid`, and infermux's shared-memory segments."""
    status = Path(f"/proc/{pid}/status").read_text()
    field = lambda name: int(next(line.split()[1] for line in status.splitlines() if line.startswith(name)))  # noqa: E731
    return {"rss_kib": field("VmRSS:"), "threads": field("Threads:"),
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "shm": sum(1 for p in Path("/dev/shm").iterdir() if p.name.startswith("infermux-")),
            "regions": Path(f"/proc/{pid}/maps").read_text().count("/memfd:soak")}


def any_output(outputs: dict) -> bool:
    return "y" in outputs


def cold_bursts(endpoint: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Bursts of requests to the cold model with idle gaps, so its worker unloads and restarts."""
    from infermux.client import Client

    with Client(endpoint, timeout_s=10, retries=2) as client:
        while not stop.is_set():
            until = time.monotonic() + 4
            while time.monotonic() < until and not stop.is_set():
                reply = client.infer("cold", {"x": WIDE})
                counts[str(reply.status)] = counts.get(str(reply.status), 0) + 1
                if reply.status == 503:
                    time.sleep((reply.retry_after_ms or 50) / 1000)
            stop.wait(6)  # longer than idle_unload_s


def region_clients(endpoint: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Every 2 s: a region registered, 20 requests each to hot and cold with inputs and outputs in
    it, the outputs checked, the region closed."""
    from infermux.client import Client, SharedMemory

    with Client(endpoint, timeout_s=10, retries=2) as client:
        while not stop.wait(2):
            with SharedMemory.beside(endpoint, 1 << 20, "soak") as shm:
                for model, x in (("hot", X), ("cold", WIDE)):
                    xin = shm.ndarray(x.shape, x.dtype)
                    out = shm.ndarray(x.shape, x.dtype, offset=512 * 1024)
                    xin[:] = x
                    for _ in range(20):
                        reply = client.infer(model, {"x": shm.ref(xin)}, output_regions={"y": shm.ref(out)})
                        ok = reply.status == 200 and bool(np.array_equal(out, x + 1))
                        key = str(reply.status) if not ok and reply.status != 200 else ("ok" if ok else "wrong")
                        counts[key] = counts.get(key, 0) + 1
                    del xin, out, reply
                counts["regions"] = counts.get("regions", 0) + 1


def swapper(root: Path, stop: threading.Event, every_s: float, swaps: list[int]) -> None:
    version = 1
    while not stop.wait(every_s):
        version += 1
        publish(root, "swapped", version, offset=1)
        swaps.append(version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "engines"
        for name in ("hot", "swapped"):
            publish(root, name, 1, offset=1)
        publish(root, "cold", 1, offset=1, width=WIDE.shape[1])
        (Path(tmp) / "d").mkdir()
        daemon = Daemon(Path(tmp) / "d", CONFIG.format(root=root)).start()
        stop = threading.Event()
        cold_counts: dict[str, int] = {}
        region_counts: dict[str, int] = {}
        swaps: list[int] = []
        extras = [threading.Thread(target=cold_bursts, args=(daemon.endpoint, stop, cold_counts), daemon=True),
                  threading.Thread(target=swapper, args=(root, stop, 20.0, swaps), daemon=True),
                  threading.Thread(target=region_clients, args=(daemon.endpoint, stop, region_counts), daemon=True)]
        samples: list[tuple[float, dict[str, int]]] = []
        t0 = time.monotonic()
        with Load(daemon.endpoint, "hot", {"x": X}, any_output, clients=2, hang_s=5, retries=2) as hot, \
             Load(daemon.endpoint, "swapped", {"x": X}, any_output, clients=1, hang_s=5, retries=2) as swapped:
            for t in extras:
                t.start()
            while time.monotonic() - t0 < args.minutes * 60:
                samples.append((time.monotonic() - t0, sample(daemon.proc.pid)))
                s = samples[-1][1]
                print(f"[{samples[-1][0]:5.0f}s] rss {s['rss_kib'] / 1024:.1f} MiB fds {s['fds']} threads "
                      f"{s['threads']} shm {s['shm']} regions {s['regions']} hot {hot.tally.answered} "
                      f"swaps {len(swaps)}",
                      file=sys.stderr, flush=True)
                time.sleep(10)
            stop.set()
            hot_tally, swapped_tally = hot.stop(), swapped.stop()
        for t in extras:
            t.join(15)
        unloads = daemon.log().count("worker_stopped")
        daemon.stop()
    report(args.minutes, samples, hot_tally, swapped_tally, cold_counts, len(swaps), unloads, region_counts)


def report(minutes, samples, hot, swapped, cold, swaps, unloads, regions) -> None:
    warm = next((s for t, s in samples if t >= 60), samples[0][1])
    last = samples[-1][1]
    peak = {k: max(s[k] for t, s in samples if t >= 60) if len(samples) > 6 else last[k] for k in last}
    growth = (last["rss_kib"] - warm["rss_kib"]) / warm["rss_kib"] * 100
    rows = [[k, str(warm[k]), str(last[k]), str(peak[k])] for k in ("rss_kib", "fds", "threads", "shm", "regions")]
    body = "\n".join([
        stamp(), "",
        f"{minutes:.0f} minutes: 2 clients on a hot model, 1 on a model swapped to a new version every 20 s "
        f"({swaps} swaps), bursts on a cold model with `idle_unload_s = 3` ({unloads} worker stops), and "
        f"{regions.get('regions', 0)} shared-memory regions registered, used by 40 requests each and closed; "
        "`regions` counts the clients' regions the daemon still maps (it samples between them, mostly).", "",
        markdown_table(["resource", "after 1 min", "at the end", "peak after 1 min"], rows), "",
        f"RSS growth after warm-up: **{growth:+.1f} %** (goal < 5 %).",
        f"Requests: hot {hot.answered:,} answered / {hot.hung} hung / {hot.wrong} wrong, by status "
        f"{dict(hot.by_status)}; swapped {swapped.answered:,} answered / {swapped.hung} hung, by status "
        f"{dict(swapped.by_status)}; cold by status {cold}; with shared memory {regions}.",
        "Reproduce: `python tests/benchmarks/bench_soak.py --minutes 10`.",
    ])
    print_and_write("Soak", body, write=True)


if __name__ == "__main__":
    main()
