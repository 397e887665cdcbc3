"""Hostile clients against one daemon while well-behaved clients keep measuring.

    python tests/benchmarks/bench_hostile.py [--seconds 4] [--no-write]

One daemon runs under `prlimit --nofile=1024:2700` (systemd's default
soft limit, which the daemon raises to the hard one; 2700 leaves room
for the connection guard's lead, docs/security.md) with a metrics port. Each scenario starts an attacker, and two
well-behaved clients send requests meanwhile; their answered share and
p99 are compared with a run without attacker just before it (the box is
shared: a baseline taken once drifts). The daemon's RSS and open
descriptors are read before and after each scenario. Goal: 100 % answered
and p99 within 2x of the baseline. Writes the "Hostile clients"
section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, process_cpu_s, stamp, write_section  # noqa: E402

from support.harness import Daemon  # noqa: E402
from infermux.client import Client  # noqa: E402

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
watch = false
metrics_port = {port}

[[models]]
name = "fast512"
engine = "fast512/1/model.onnx"
max_queue = 100000

[[models]]
name = "cold"
engine = "fast512/1/model.onnx"
mode = "multiproc"  # placement = "cold" by its old name, which --against revisions before it read too
preload = true
max_queue = 1000
"""
X = np.ones((1, 512), np.float32)
CLIENTS = 2


class Stop(Protocol):
    """When an attacker stops: a multiprocessing.Event, since each attacker is a process."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def well_behaved(endpoint: str, stop: threading.Event, latencies: list[float], failures: list[int]) -> None:
    """One client in a loop: each request answered 200 within 5 s counts, with its latency."""
    with Client(endpoint, timeout_s=5) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                ok = client.infer("fast512", {"x": X}).status == 200
            except TimeoutError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - start)
            else:
                failures.append(1)


def measure(endpoint: str, seconds: float, attack: Callable[[Stop], None] | None) -> dict:
    stop = threading.Event()
    latencies: list[float] = []
    failures: list[int] = []
    threads = [threading.Thread(target=well_behaved, args=(endpoint, stop, latencies, failures))
               for _ in range(CLIENTS)]
    # The attacker is a process of its own, as on a real box: a thread here would also take
    # the GIL from the well-behaved clients' timing, which is this process's fault, not the daemon's.
    forked = multiprocessing.get_context("fork")
    attacker_stop = forked.Event()
    attacker = forked.Process(target=attack, args=(attacker_stop,), daemon=True) if attack else None
    if attacker:
        attacker.start()
    for t in threads:
        t.start()
    time.sleep(seconds)
    attacker_cpu = process_cpu_s(attacker.pid) / seconds if attacker and attacker.pid else 0.0
    stop.set()
    attacker_stop.set()
    for t in threads:
        t.join()
    if attacker:
        attacker.join(30)
    total = len(latencies) + len(failures)
    return {"answered": 100.0 * len(latencies) / max(1, total), "requests": total, "attacker_cpu": attacker_cpu,
            "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else float("nan")}


def proc_facts(pid: int) -> tuple[float, int]:
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS"))
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd"))


# -- attackers -------------------------------------------------------------------------

def non_reader(endpoint: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        sock = zmq.Context().socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.RCVHWM, 1), (zmq.RCVBUF, 4096), (zmq.SNDHWM, 0)):
            sock.setsockopt(option, value)
        sock.connect(endpoint)
        header = json.dumps({"model": "fast512", "id": 0,
                             "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512]}]}).encode()
        for _ in range(30000):
            sock.send_multipart([b"", header, X.tobytes()])
        stop.wait()
        sock.close()
    return attack


def connection_flood(path: str, count: int = 1100) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        conns = []
        for _ in range(count):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(path)
            except OSError:
                conn.close()
                continue
            conns.append(conn)
        stop.wait()
        for conn in conns:
            conn.close()
    return attack


def metrics_flood(port: int, count: int = 1100) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        conns = []
        for _ in range(count):
            conn = socket.socket()
            conn.setblocking(False)
            conn.connect_ex(("127.0.0.1", port))
            conns.append(conn)
        stop.wait()
        for conn in conns:
            conn.close()
    return attack


def empty_packets(path: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        while not stop.is_set():
            fds = [os.memfd_create("x") for _ in range(4)]
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.connect(path)
                socket.send_fds(sock, [b""], fds)
                sock.recv(16)
            for fd in fds:
                os.close(fd)
    return attack


def nested_admin(endpoint: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        sock = zmq.Context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        while not stop.is_set():
            sock.send_multipart([b"", b'{"cmd": ' + b"[" * 20000 + b"]" * 20000 + b"}"])
            sock.poll(5000)
            if sock.poll(0):
                sock.recv_multipart()
        sock.close()
    return attack


def many_frames(endpoint: str) -> Callable[[Stop], None]:
    """One message of 40 frames of 1 MB each after another: each is read whole, then refused."""
    def attack(stop: Stop) -> None:
        sock = zmq.Context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        header = json.dumps({"model": "fast512", "id": 0,
                             "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512]}]}).encode()
        frame = bytes(1_000_000)
        while not stop.is_set():
            sock.send_multipart([b"", header, *([frame] * 40)])
            if sock.poll(5000):
                sock.recv_multipart()
        sock.close()
    return attack


def cpu_hog() -> Callable[[Stop], None]:
    """Not a client at all: a process that only burns a core. What any local process can do to the
    others' p99 on a 2-core box; the reference for the attackers' own CPU use."""
    def attack(stop: Stop) -> None:
        while not stop.is_set():
            for _ in range(100_000):
                pass
    return attack


def stopped_worker(daemon: Daemon) -> Callable[[Stop], None]:
    """The cold model's worker SIGSTOPped while requests with a 300 ms deadline keep coming for it."""
    def attack(stop: Stop) -> None:
        with daemon.admin() as admin:
            pid = next(m for m in admin.call("models")["models"] if m["name"] == "cold")["worker"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            with Client(daemon.endpoint, timeout_s=5) as client:
                while not stop.is_set():
                    try:
                        client.infer("cold", {"x": X}, timeout_ms=300)  # 504 at its deadline
                    except TimeoutError:
                        pass
        finally:
            os.kill(pid, signal.SIGCONT)
    return attack


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--no-write", action="store_true", help="print the table, leave RESULTS.md alone")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of windows per scenario (the median is shown)")
    parser.add_argument("--only", default="", help="run only the scenarios whose name contains this")
    args = parser.parse_args()
    from support import models

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models.add_one(work / "engines/fast512/1/model.onnx", width=512, offset=0.0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (work / "d").mkdir()
        daemon = Daemon(work / "d", HEAD.format(engines=work / "engines", port=port),
                        prefix=["prlimit", "--nofile=1024:2700", "--"]).start()
        try:
            rows = run_scenarios(daemon, port, args.seconds, args.only, args.rounds)
        finally:
            daemon.stop()
    table = markdown_table(["scenario", "answered %", "p99 ms", "p99 ms, none just before", "p99 vs none (median)",
                            "each round's ratio", "attacker's own CPU, cores", "RSS MiB before → after",
                            "fds before → after"], rows)
    body = "\n".join([stamp(), "", "Daemon under `prlimit --nofile=1024:2700` (soft raised to hard at start); 2 well-behaved clients, "
                      f"{args.seconds:g} s with the attacker, each after {args.seconds:g} s without it "
                      f"(the \"none just before\" column, what its ratio is against), {args.rounds} such "
                      "rounds per scenario: the row is the round with the median ratio. Each attacker is a "
                      "process of its own; its CPU use is the last column but two. On the 2-core box "
                      "(figures noisy).", "", table])
    print(body)
    if not args.no_write:
        write_section("Hostile clients", body)
    return 0


def run_scenarios(daemon: Daemon, port: int, seconds: float, only: str = "", rounds: int = 3) -> list[list[str]]:
    regions = str(daemon.run_dir / "regions.sock")
    scenarios: list[tuple[str, Callable[[Stop], None] | None]] = [
        ("none (baseline)", None),
        ("reference: a process that only burns one core", cpu_hog()),
        ("30,000 pipelined requests, replies never read", non_reader(daemon.endpoint)),
        ("1,100 idle connections to infer.sock", connection_flood(daemon.endpoint[len("ipc://"):])),
        ("1,100 idle connections to the metrics port", metrics_flood(port)),
        ("empty packets with 4 fds on regions.sock", empty_packets(regions)),
        ("nested-JSON admin requests", nested_admin(daemon.admin_endpoint)),
        ("40 × 1 MB frames per message, in a loop", many_frames(daemon.endpoint)),
        ("cold model's worker SIGSTOPped, 300 ms requests to it", stopped_worker(daemon)),
    ]
    measure(daemon.endpoint, seconds, None)  # warm-up: the first seconds' p99 is the caches', not the daemon's
    return [one_scenario(daemon, name, attack, seconds, rounds) for name, attack in scenarios if only in name]


def one_scenario(daemon: Daemon, name: str, attack: Callable[[Stop], None] | None, seconds: float,
                 rounds: int) -> list[str]:
    """`rounds` pairs of (without attacker, with it): the box is shared, so each attacked window is
    compared with one just before it; the row shows the round with the median ratio."""
    assert daemon.proc is not None
    rss0, fds0 = proc_facts(daemon.proc.pid)
    pairs = []
    for _ in range(rounds if attack else 1):
        base = measure(daemon.endpoint, seconds, None) if attack else None
        result = measure(daemon.endpoint, seconds, attack)
        if not daemon.alive():
            raise SystemExit(f"the daemon died in scenario {name!r}:\n{daemon.log()[-3000:]}")
        base = base or result
        pairs.append((result["p99_ms"] / base["p99_ms"] if base["p99_ms"] else float("nan"), base, result))
    time.sleep(0.5)  # let the daemon close what the attacker left, for the "after" figures
    rss1, fds1 = proc_facts(daemon.proc.pid)
    ratios = sorted(ratio for ratio, _, _ in pairs)
    ratio, base, result = sorted(pairs, key=lambda pair: pair[0])[len(pairs) // 2]
    answered = min(r["answered"] for _, _, r in pairs)
    requests = sum(r["requests"] for _, _, r in pairs)
    return [name, f"{answered:.1f} ({requests})", f"{result['p99_ms']:.2f}", f"{base['p99_ms']:.2f}",
            f"{ratio:.2f}x", " / ".join(f"{r:.2f}" for r in ratios), f"{result['attacker_cpu']:.2f}",
            f"{rss0:.0f} → {rss1:.0f}", f"{fds0} → {fds1}"]


if __name__ == "__main__":
    sys.exit(main())
