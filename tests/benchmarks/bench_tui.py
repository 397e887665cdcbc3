"""CPU cost of `infermux top` against a real daemon with 20 models under traffic.

    python tests/benchmarks/bench_tui.py [--duration 20] [--models 20] [--no-write]

The console runs headless (Textual's run_test, 80×24) in this process; the
daemon and a load generator run in their own processes, so this process's
CPU time is the console's. Target: under 5 % of one core at four
snapshots a second. Writes the "## Console CPU" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
TESTS = BENCHMARKS.parent
sys.path[:0] = [str(BENCHMARKS), str(TESTS)]

from support import models  # noqa: E402
from support.harness import DAEMON_HEAD, Daemon  # noqa: E402
from results import markdown_table, print_and_write, stamp  # noqa: E402

from infermux.tui.app import TopApp  # noqa: E402
from infermux.tui.feed import Endpoints, LiveFeed  # noqa: E402

# Round-robin requests over every model at about `rate` per second, forever.
LOAD = """
import sys, time, numpy as np
from infermux.client import Client
endpoint, n, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
x = np.ones((1, 4), np.float32)
with Client(endpoint) as c:
    i = 0
    while True:
        t = time.monotonic()
        c.infer(f"m{i % n:02d}", {"x": x})
        i += 1
        time.sleep(max(0.0, 1 / rate - (time.monotonic() - t)))
"""


def config(n: int, engines: Path) -> str:
    body = "".join(f'\n[[models]]\nname = "m{i:02d}"\nengine = "addone/1/model.onnx"\n' for i in range(n))
    return DAEMON_HEAD.format(engines=engines) + body


async def measure(app: TopApp, duration: float, press: tuple[str, ...] = ()) -> tuple[float, float]:
    """(CPU % of one core, snapshots shown per second) over `duration` seconds."""
    async with app.run_test(size=(80, 24)) as pilot:
        while app.snapshots_seen < 2:
            await pilot.pause(0.05)
        if press:
            await pilot.press(*press)
        await pilot.pause(2.0)  # settle: first layout, history filling
        seen0, cpu0, wall0 = app.snapshots_seen, time.process_time(), time.monotonic()
        await asyncio.sleep(duration)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        return 100 * cpu / wall, (app.snapshots_seen - seen0) / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds measured per view")
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second over all models")
    parser.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md alone")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        engines = root / "engines"
        models.add_one(engines / "addone/1/model.onnx", offset=1.0)
        (root / "d").mkdir()
        daemon = Daemon(root / "d", config(args.models, engines)).start()
        load = subprocess.Popen([sys.executable, "-c", LOAD, daemon.endpoint, str(args.models), str(args.rate)])
        try:
            rows = []
            for label, press in (("models table", ()), ("model detail", ("enter",))):
                feed = LiveFeed(Endpoints(daemon.admin_endpoint, daemon.stats_endpoint))
                cpu, rate = asyncio.run(measure(TopApp(feed), args.duration, press))
                rows.append([label, f"{rate:.1f}", f"{cpu:.1f} %"])
                print(f"{label}: {cpu:.2f} % of one core, {rate:.2f} snapshots/s", flush=True)
        finally:
            load.kill()
            load.wait()
            daemon.stop()

    load_avg = os.getloadavg()[0]
    body = "\n".join([
        stamp(),
        f"`infermux top` headless (Textual run_test, 80×24) against a real daemon with {args.models} "
        f"add_one models, {args.rate:.0f} requests/s spread over all of them from another process; "
        f"process CPU time over {args.duration:.0f} s per view, after 2 s to settle. "
        f"1-min load average {load_avg:.2f} at the end.",
        "",
        markdown_table(["view", "snapshots/s", "CPU (one core)"], rows),
        "",
        "Target: under 5 % of one core at 4 snapshots/s. A table row is redrawn only when one of its "
        "cells changed; hidden tabs are not updated. Reproduce: `python tests/benchmarks/bench_tui.py`.",
    ])
    print_and_write("Console CPU", body, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
