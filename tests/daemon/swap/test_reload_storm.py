"""Reloads while serving: SIGHUP and `ctl reload` storms together, under pipelined load, while the
configuration's engine for a model flips between two ONNX files that give different answers.

Every request is answered 200 (none lost, none refused by a switch), every answer comes from one of
the two engines (y = x + 1 or y = x + 2), and once the storms are over the daemon serves what the
file says, with no engine left behind.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support import models
from support.harness import Daemon
from support.load import LoadClient
from support.polling import eventually
from support.publish import write_atomically

ROUNDS = {"hot": 14, "cold": 6}  # per storm; a cold engine change starts a worker, a hot one loads in ms
CLIENTS = 3
OFFSETS = {"a": 1.0, "b": 2.0}  # engine a answers x + 1, engine b x + 2

CONFIG = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engine_dir}"

[[models]]
name = "m"
engine = "{engine}"
{placement}
max_queue = 256
"""
PLACEMENT = {"hot": 'placement = "hot"', "cold": 'placement = "cold"\npreload = true'}


def _events(log: str, kind: str) -> int:
    return len(re.findall(rf"infermux\.\w+: {kind}(?= |$)", log, re.MULTILINE))


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (a daemon's workers)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.parametrize("placement", ["hot", "cold"])
def test_sighup_and_ctl_reload_storms_with_an_engine_change_lose_no_request(tmp_path: Path, placement: str) -> None:
    files = {name: models.add_one(tmp_path / "onnx" / f"{name}.onnx", offset=offset)
             for name, offset in OFFSETS.items()}
    (tmp_path / "engines").mkdir()

    def config(engine: str) -> bytes:
        return CONFIG.format(engine_dir=tmp_path / "engines", engine=files[engine],
                             placement=PLACEMENT[placement]).encode()

    d = Daemon(tmp_path, config("a").decode()).start()
    clients = [LoadClient(d.endpoint, i, "m") for i in range(CLIENTS)]
    written: list[str] = []  # the engines the file named, in the order written
    write_lock = threading.Lock()
    failures: list[str] = []

    def write(engine: str) -> None:
        with write_lock:  # the last name in `written` is what the file holds
            write_atomically(d.config_path, config(engine))
            written.append(engine)

    def storm(trigger, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(ROUNDS[placement]):
                write(rng.choice("ab"))
                trigger()
                time.sleep(rng.uniform(0, 0.05))
        except BaseException as exc:  # reported by the test thread
            failures.append(repr(exc))

    def sighup() -> None:
        d.signal(signal.SIGHUP)

    admin = d.admin(timeout_s=120)

    def ctl() -> None:
        reply = admin.call("reload", check=False)
        if not reply.get("ok"):
            failures.append(f"ctl reload refused: {reply}")

    try:
        for client in clients:
            client.start()
        eventually(lambda: all(len(c.answers) > 20 for c in clients), "the load to run")
        storms = [threading.Thread(target=storm, args=(sighup, 1)), threading.Thread(target=storm, args=(ctl, 2))]
        for thread in storms:
            thread.start()
        for thread in storms:
            thread.join(300)
        # The last word: the file once more, and `infermux ctl reload`, which returns once it is applied.
        write(random.choice("ab"))
        cli = subprocess.run([sys.executable, "-m", "infermux", "ctl", "--admin", d.admin_endpoint, "reload"],
                             capture_output=True, text=True, timeout=120, env={**os.environ})
        assert cli.returncode == 0, cli.stdout + cli.stderr
        # Every reload asked for has run (SIGHUPs close together are one reload).
        eventually(lambda: _events(d.log(), "reloading") == _events(d.log(), "reloaded") + _events(d.log(), "rejected"),
                   "the reloads to finish", 60)
        with d.admin() as probe:
            row = next(m for m in probe.call("models")["models"] if m["name"] == "m")
        final = written[-1]
        assert row["engine"] == str(files[final]) and row["state"] == "ready", (final, row)
        x = np.float32([[1, 2, 3, 4]])
        with d.client() as client:
            reply = client.infer("m", {"x": x})
        assert reply.status == 200 and np.allclose(reply.outputs["y"], x + OFFSETS[final]), (final, reply.header)
    finally:
        admin.close()
        for client in clients:
            client.finish()
    assert not failures, failures
    log = d.log()
    swaps = log.count("swapped model=m")
    seen = set()
    for client in clients:
        assert client.error is None, f"client {client.index}: {client.error!r}\n{log[-3000:]}"
        assert set(client.answers) == set(client.sent), "a request got no answer"
        for ident, (status, version, y, error) in client.answers.items():
            assert status == 200, f"request {ident} of client {client.index}: {status} {error}\n{log[-3000:]}"
            offset = float(np.round(np.mean(y - client.sent[ident])))
            assert offset in OFFSETS.values() and np.allclose(y, client.sent[ident] + offset), (y, client.sent[ident])
            seen.add(offset)
    assert swaps >= 2 and seen == set(OFFSETS.values()), (swaps, seen)  # the load really met engine changes
    if placement == "cold":  # no worker left behind: the version's own, and at most the spare
        eventually(lambda: len(_children(d.proc.pid)) <= 2, "the replaced workers to exit", 30)
    assert d.stop() == 0, log
    print(f"\n{len(written)} writes, {_events(log, 'reloaded')} reloads, {swaps} engine switches, "
          f"{sum(len(c.answers) for c in clients)} requests")
