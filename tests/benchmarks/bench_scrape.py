"""What a Prometheus scrape costs, hardware series included, and what the probes cost.

    python tests/benchmarks/bench_scrape.py [--scrapes 200] [--no-write]

A daemon serves one hot and one cold model (so /metrics carries a worker's
process series) with `metrics_port` set; the script GETs /metrics, /healthz
and /readyz `--scrapes` times each on one keep-alive-less client, idle daemon,
and reports the median and p99 per request. It also times the hardware reads
alone in this process (/proc/<pid>/stat of the daemon and its worker, as a
scrape does), so the share of the new series can be read off.

Writes the "## Metrics scrape" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402

from support import models  # noqa: E402
from support.harness import DAEMON_HEAD, Daemon, free_port  # noqa: E402
from infermux.admin import hardware  # noqa: E402

MODELS = ('[[models]]\nname = "hot"\nengine = "addone/1/model.onnx"\n'
          '[[models]]\nname = "cold"\nengine = "addone/1/model.onnx"\nplacement = "cold"\npreload = true\n')


def timed_gets(url: str, n: int) -> tuple[list[float], int]:
    """Milliseconds per GET, and the size of the last body."""
    times, size = [], 0
    for _ in range(n):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as reply:
            size = len(reply.read())
        times.append((time.perf_counter() - start) * 1000)
    return times, size


def row(what: str, times: list[float], size: int) -> list[str]:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return [what, f"{statistics.median(times):.2f}", f"{p99:.2f}", f"{size:,}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engines = Path(tmp) / "engines"
        models.add_one(engines / "addone/1/model.onnx", offset=1.0)
        port = free_port()
        workdir = Path(tmp) / "daemon"
        workdir.mkdir()
        daemon = Daemon(workdir, (DAEMON_HEAD + f"metrics_port = {port}\n" + MODELS).format(engines=engines))
        daemon.start()
        try:
            base = f"http://127.0.0.1:{port}"
            timed_gets(base + "/metrics", 10)  # warm-up: first-scrape imports, page cache
            rows = [row(f"GET {path}", *timed_gets(base + path, args.scrapes))
                    for path in ("/metrics", "/healthz", "/readyz")]
            text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
            series = r'infermux_process_cpu_seconds_total\{process="[^"]+",pid="(\d+)"\}'
            pids = [int(p) for p in re.findall(series, text)]
            start = time.perf_counter()
            for _ in range(args.scrapes):
                for pid in pids:
                    hardware.process_sample("x", pid)
            per_scrape_ms = (time.perf_counter() - start) * 1000 / args.scrapes
        finally:
            daemon.stop()
    body = "\n".join([
        stamp(),
        f"Idle daemon, one hot and one cold model (addone), {args.scrapes} sequential GETs per path from one "
        "client, a new connection each. No GPU on this box: the GPU families are declared without samples. "
        "The box is shared with other work: read the ratios, not the absolute figures.",
        "",
        markdown_table(["request", "median ms", "p99 ms", "body bytes"], rows),
        "",
        f"Process series alone ({len(pids)} processes' /proc/<pid>/stat, as one scrape reads them): "
        f"{per_scrape_ms:.3f} ms per scrape.",
        "Reproduce: `python tests/benchmarks/bench_scrape.py`.",
    ])
    print_and_write("Metrics scrape", body, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
