"""Faults under load: every request is answered, none hangs, the daemon carries on.

Short versions of tests/benchmarks/bench_chaos.py (which runs them longer
and writes the figures to RESULTS.md).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from support.chaos import WATCHED, Load
from support.harness import Daemon
from support.publish import publish, write_atomically

pytestmark = pytest.mark.timing  # load, kills and swaps racing each other: tests/stress.sh runs them

X = np.ones((1, 4), np.float32)


def adds(offset: float):
    return lambda outputs: bool(np.array_equal(outputs["y"], X + offset))


def start(workdir: Path, root: Path) -> Daemon:
    workdir.mkdir(exist_ok=True)
    return Daemon(workdir, WATCHED.format(root=root)).start()


def test_corrupt_engine_dropped_in_under_load(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    d = start(tmp_path / "d", root)
    try:
        with Load(d.endpoint, "m", {"x": X}, adds(1), clients=3) as load:
            load.wait_for(100)
            write_atomically(root / "m" / "2" / "model.onnx", b"\x08 not an onnx model" * 64)
            d.wait_for("failed model=m version=2", 15)
            load.wait_for(100)
            tally = load.stop()
    finally:
        assert d.stop() == 0
    assert tally.hung == 0 and tally.wrong == 0
    assert dict(tally.by_status) == {200: tally.answered}, tally.as_row()


def test_sigterm_under_load_answers_every_request(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    d = start(tmp_path / "d", root)
    with Load(d.endpoint, "m", {"x": X}, adds(1), clients=4, hang_s=5) as load:
        load.wait_for(200)
        d.signal(signal.SIGTERM)
        assert d.proc.wait(20) == 0, d.log()
        tally = load.stop()
    # Requests sent after the socket closed stay queued in the clients and time out: those are
    # not accepted ones. Every request the daemon read was answered (200, or 503 while draining).
    assert set(tally.by_status) <= {200, 503}, tally.as_row()
    assert tally.answered >= 200 and tally.wrong == 0
    assert tally.hung <= 4  # at most the one request per client that was sent after the close


def test_daemon_restarted_while_clients_keep_sending(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    d = start(tmp_path / "d", root)
    with Load(d.endpoint, "m", {"x": X}, adds(1), clients=3, hang_s=2, retries=5) as load:
        load.wait_for(100)
        assert d.stop() == 0
        time.sleep(0.5)  # clients keep sending into the void: their sockets queue and reconnect
        again = Daemon(tmp_path / "d", d.config_path.read_text()).start()
        try:
            load.wait_for(100)
            tally = load.stop()
        finally:
            assert again.stop() == 0
    assert tally.hung == 0 and tally.wrong == 0, tally.as_row()
    assert set(tally.by_status) <= {200, 503}, tally.as_row()
