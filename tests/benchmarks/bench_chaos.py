"""Chaos under load: faults in the middle of a steady client load.

    python tests/benchmarks/bench_chaos.py [--seconds 8]

Each scenario runs clients against a real daemon, injects one fault, keeps
the load going, and reports requests sent, answered (by status), hung (no
answer within the client's timeout and retries) and wrong (a 200 whose
outputs do not match). Goal: 0 hung, 0 wrong. Writes the table to the
"Chaos" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402

from support.chaos import WATCHED, Load, Tally  # noqa: E402
from support.harness import Daemon  # noqa: E402
from support.publish import publish, write_atomically  # noqa: E402

X = np.ones((1, 4), np.float32)
COLD = """
[[models]]
name = "m"
engine = "m/1/model.onnx"
mode = "multiproc"  # placement = "cold" by its old name, which --against revisions before it read too
preload = true
"""


def check(outputs: dict) -> bool:
    return bool(np.array_equal(outputs["y"], X + 1))


def scenario(work: Path, name: str, fault: Callable[[Daemon, Path], Daemon], seconds: float,
             models: str = "") -> tuple[Tally, float]:
    """Load for `seconds`, the fault half way; returns the tally and the load's wall time."""
    root = work / name / "engines"
    publish(root, "m", 1, offset=1)
    (work / name / "d").mkdir(parents=True)
    daemon = Daemon(work / name / "d", WATCHED.format(root=root) + models).start()
    t0 = time.monotonic()
    with Load(daemon.endpoint, "m", {"x": X}, check, clients=4, hang_s=2, retries=5) as load:
        time.sleep(seconds / 2)
        daemon = fault(daemon, root)
        time.sleep(seconds / 2)
        tally = load.stop()
    elapsed = time.monotonic() - t0
    if daemon.alive():
        daemon.stop()
    return tally, elapsed


def corrupt_engine(daemon: Daemon, root: Path) -> Daemon:
    write_atomically(root / "m" / "2" / "model.onnx", b"\x08 not an onnx model" * 64)
    return daemon


def sigterm(daemon: Daemon, root: Path) -> Daemon:
    daemon.signal(signal.SIGTERM)
    daemon.proc.wait(30)
    return daemon


def restart(daemon: Daemon, root: Path) -> Daemon:
    daemon.stop()
    return Daemon(daemon.workdir, daemon.config_path.read_text()).start()


def kill_worker(daemon: Daemon, root: Path) -> Daemon:
    import os

    with daemon.admin() as admin:
        rows = admin.call("models")["models"]
    pid = next(m["worker"]["pid"] for m in rows if m["name"] == "m" and m.get("worker", {}).get("pid"))
    os.kill(pid, signal.SIGKILL)
    return daemon


SCENARIOS: list[tuple[str, Callable[[Daemon, Path], Daemon], str, str]] = [
    ("corrupt engine dropped into the watched dir", corrupt_engine, "", "old version keeps serving"),
    ("SIGTERM", sigterm, "", "accepted requests answered; later ones hang by design (nobody listens)"),
    ("daemon restarted", restart, "", "clients reconnect and carry on"),
    ("cold worker SIGKILLed", kill_worker, COLD, "in-flight get 503 at once; next request restarts it"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="load per scenario")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, fault, models, expect) in enumerate(SCENARIOS):
            print(f"[{i + 1}/{len(SCENARIOS)}] {name} ...", file=sys.stderr, flush=True)
            tally, elapsed = scenario(Path(tmp), f"s{i}", fault, args.seconds, models)
            status = ", ".join(f"{code}: {n}" for code, n in sorted(tally.by_status.items()))
            rows.append([name, f"{tally.sent:,}", f"{tally.answered:,}", status, str(tally.hung), str(tally.wrong),
                         f"{elapsed:.1f}", expect])
            print(f"    {tally.as_row()}", file=sys.stderr)
    table = markdown_table(["fault", "sent", "answered", "by status", "hung", "wrong", "s", "expected"], rows)
    body = "\n".join([
        stamp(), "",
        f"4 clients, each one request at a time (2 s timeout, up to 5 resends on a fresh socket), "
        f"{args.seconds:.0f} s of load per scenario with the fault half way; tiny add-one model.", "",
        table, "",
        "hung = no answer after every resend; wrong = a 200 whose outputs do not match the model. "
        "After SIGTERM nothing restarts the daemon, so requests sent after its socket closed cannot be "
        "answered: those count as hung by design; every request the daemon read was answered.",
        "Reproduce: `python tests/benchmarks/bench_chaos.py`.",
    ])
    print_and_write("Chaos", body, write=True)


if __name__ == "__main__":
    main()
