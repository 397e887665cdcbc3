"""What an idle daemon costs: CPU, wakeups and threads with every model hot and no traffic.

    python tests/benchmarks/bench_idle.py [--models 1,10,50] [--seconds 30] [--against REV] [--no-write]

For each model count a daemon serves that many hot models (addone, tiny),
with `metrics_port` set, and nothing sends it a request. Three windows are
measured one after the other on the same daemon:

  idle     nothing attached
  console  a stats subscriber like the console's (SUB to every topic, read as it arrives)
  scrape   a GET /metrics every `--scrape-every` seconds (Prometheus' default 15 s)

Each window reads, at its start and end, the daemon's CPU time from
/proc/<pid>/stat (utime + stime, every thread, the ones ended included) and
every thread's voluntary context switches from /proc/<pid>/task/*/status:
a voluntary switch is the thread going to sleep, so their sum over a window
is the number of times the daemon woke. `--against REV` measures the daemon
at git revision REV the same way, in the same run (revision.py).

Writes the "## Idle daemon" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402
from revision import describe, package_env  # noqa: E402

from support import models  # noqa: E402
from support.harness import DAEMON_HEAD, Daemon, free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
MODES = ("idle", "console", "scrape")


@dataclass(frozen=True)
class Reading:
    """One look at the daemon: its CPU seconds so far and each live thread's voluntary switches."""

    when: float
    cpu_s: float
    switches: dict[int, int]


@dataclass(frozen=True)
class Window:
    """What the daemon did between two readings."""

    cpu_share: float  # of one core
    wakeups_per_s: float
    threads: int


def read(pid: int) -> Reading:
    """The daemon's CPU time and its threads' voluntary context switches, now."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15 of stat)
    switches = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended between the listing and the read
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                switches[int(task.name)] = int(line.split()[1])
    return Reading(time.monotonic(), cpu_s, switches)


def between(a: Reading, b: Reading) -> Window:
    """The window from `a` to `b`; a thread that started within it counts from zero."""
    seconds = b.when - a.when
    woke = sum(n - a.switches.get(tid, 0) for tid, n in b.switches.items())
    return Window((b.cpu_s - a.cpu_s) / seconds, woke / seconds, len(b.switches))


class Subscriber:
    """A stats subscriber as the console's feed is: every topic, read as it comes."""

    def __init__(self, endpoint: str) -> None:
        self.messages = 0
        self._stop = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(100):
                self._sock.recv_multipart()
                self.messages += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close(0)


def measure(daemon: Daemon, mode: str, seconds: float, port: int, scrape_every: float) -> Window:
    """One window of `seconds` on `daemon` with `mode`'s company."""
    assert daemon.proc is not None
    pid = daemon.proc.pid
    subscriber = Subscriber(daemon.stats_endpoint) if mode == "console" else None
    if subscriber is not None:
        deadline = time.monotonic() + 10
        while subscriber.messages == 0 and time.monotonic() < deadline:  # subscribed and flowing
            time.sleep(0.05)
    try:
        start = read(pid)
        end_at = start.when + seconds
        next_scrape = start.when
        while (now := time.monotonic()) < end_at:
            if mode == "scrape" and now >= next_scrape:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                    reply.read()
                next_scrape += scrape_every
            time.sleep(max(0.0, min(end_at, next_scrape if mode == "scrape" else end_at) - time.monotonic()))
        return between(start, read(pid))
    finally:
        if subscriber is not None:
            subscriber.close()


def config(count: int, engines: Path, port: int) -> str:
    body = "".join(f'[[models]]\nname = "m{i}"\nengine = "addone/1/model.onnx"\n' for i in range(count))
    return (DAEMON_HEAD + f"metrics_port = {port}\n" + body).format(engines=engines)


def run_one(tmp: Path, engines: Path, count: int, env: dict[str, str] | None, args: argparse.Namespace,
            label: str) -> dict[str, Window]:
    """Every mode's window on one daemon with `count` hot models."""
    port = free_port()
    workdir = tmp / f"{label}-{count}"
    workdir.mkdir()
    daemon = Daemon(workdir, config(count, engines, port), env=env)
    daemon.start(timeout=120 + count * 2)
    try:
        time.sleep(args.settle)  # the start's one-off work (loads, warm-ups, first events) is over
        return {mode: measure(daemon, mode, args.seconds, port, args.scrape_every) for mode in MODES}
    finally:
        daemon.stop()


def rows_of(label: str, results: dict[int, dict[str, Window]]) -> list[list[str]]:
    rows = []
    for count, windows in results.items():
        cells = [f"{windows[m].cpu_share * 100:.2f} %" for m in MODES]
        cells += [f"{windows[m].wakeups_per_s:.1f}" for m in MODES]
        rows.append([label, str(count), *cells, str(windows["idle"].threads)])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="1,10,50", help="hot model counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0, help="each window's length")
    parser.add_argument("--settle", type=float, default=5.0, help="wait after the daemon is ready")
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--against", metavar="REV", help="also measure the daemon at git revision REV")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args()
    counts = [int(c) for c in args.models.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        engines = tmp / "engines"
        models.add_one(engines / "addone/1/model.onnx", offset=1.0)
        builds: list[tuple[str, dict[str, str] | None]] = [("this checkout", None)]
        if args.against:
            builds.append((describe(args.against), package_env(args.against, tmp / "against")))
        for label, env in builds:
            results = {count: run_one(tmp, engines, count, env, args, f"b{len(rows)}") for count in counts}
            rows += rows_of(label, results)
    headers = ["daemon", "hot models", *(f"CPU {m}" for m in MODES), *(f"wakeups/s {m}" for m in MODES),
               "threads"]
    body = "\n".join([
        stamp(),
        f"Every model hot, no request. Windows of {args.seconds:g} s each, one after the other on one daemon: "
        f"`idle` nothing attached, `console` a stats subscriber like the console's, `scrape` a GET /metrics "
        f"every {args.scrape_every:g} s. CPU: the daemon's utime + stime over the window, as a share of one "
        "core; wakeups: voluntary context switches summed over its threads, per second.",
        "",
        markdown_table(headers, rows),
        "",
        f"Reproduce: `python tests/benchmarks/bench_idle.py --seconds {args.seconds:g}"
        + (f" --against {args.against}`." if args.against else "`."),
    ])
    print_and_write("Idle daemon", body, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
