"""Client failover across two real daemons: spread, drain, stop, SIGKILL, all down.

Daemon A serves `addone` as y = x + 1, daemon B as y = x + 2, so every reply
says which daemon computed it; each request's x is its own number, so a
reply also proves it answers that request.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from support.harness import DAEMON_HEAD, Daemon
from infermux.client import Client, EndpointsDown, Pipeline, Reply, SharedTensor

MODEL = """
[[models]]
name = "addone"
engine = "addone/{version}/model.onnx"
"""


class Pair:
    """Daemons A (+1) and B (+2); one killed by a test is replaced by a fresh one for the next."""

    def __init__(self, root: Path, engines: Path) -> None:
        self.root, self.engines = root, engines
        self.daemons = [self._start(1), self._start(2)]

    def _start(self, offset: int) -> Daemon:
        workdir = self.root / f"d{offset}-{time.monotonic_ns()}"
        workdir.mkdir()
        return Daemon(workdir, (DAEMON_HEAD + MODEL).format(engines=self.engines, version=offset)).start()

    def alive(self) -> "Pair":
        self.daemons = [d if d.alive() else self._start(i + 1) for i, d in enumerate(self.daemons)]
        return self

    @property
    def endpoints(self) -> list[str]:
        return [d.endpoint for d in self.daemons]

    def kill(self, which: int) -> None:
        daemon = self.daemons[which]
        daemon.signal(signal.SIGKILL)
        assert daemon.proc is not None
        daemon.proc.wait()

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()


@pytest.fixture(scope="module")
def pair_started(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Pair]:
    pair = Pair(tmp_path_factory.mktemp("failover"), engines)
    yield pair
    pair.stop()


@pytest.fixture
def pair(pair_started: Pair) -> Pair:
    return pair_started.alive()


def x_of(n: int) -> np.ndarray:
    return np.full((1, 4), float(n), np.float32)


def served_by(reply: Reply, n: int) -> int:
    """Which daemon (1: A, 2: B) computed the reply to request number `n`; fails on a wrong answer."""
    assert reply.status == 200, reply.header
    offset = float(reply.outputs["y"][0, 0]) - n
    assert offset in (1.0, 2.0) and np.all(reply.outputs["y"] == n + offset), (n, reply.outputs)
    return int(offset)


def test_a_client_with_one_endpoint_keeps_its_single_socket(pair: Pair, tmp_path: Path) -> None:
    a = pair.endpoints[0]
    for endpoint in (a, [a]):
        with Client(endpoint, timeout_s=10) as client:
            assert served_by(client.infer("addone", {"x": x_of(5)}), 5) == 1
        with Pipeline(endpoint) as pipe:
            assert served_by(pipe.result(pipe.submit("addone", {"x": x_of(6)})), 6) == 1
            assert pipe.moved == 0
            with pytest.raises(ValueError, match="has one"):
                pipe.holding(a)
    # No daemon: the plain socket's own error after timeout_s, not a fleet's EndpointsDown.
    with Client(f"ipc://{tmp_path}/none.sock", timeout_s=0.3) as client:
        with pytest.raises(TimeoutError, match="within 0.3 s") as caught:
            client.infer("addone", {"x": x_of(1)})
    assert not isinstance(caught.value, EndpointsDown)


def test_requests_are_spread_over_both_daemons(pair: Pair) -> None:
    with Pipeline(pair.endpoints) as pipe:
        ids = {pipe.submit("addone", {"x": x_of(n)}): n for n in range(20)}
        shares = Counter(served_by(pipe.result(i), n) for i, n in ids.items())
    assert shares == {1: 10, 2: 10}  # least outstanding: submitted before any reply, so in turn
    with Client(pair.endpoints) as client:
        assert [served_by(client.infer("addone", {"x": x_of(n)}), n) for n in range(4)] == [1, 2, 1, 2]


def test_a_draining_daemon_s_requests_move_to_the_other(pair: Pair) -> None:
    a, b = pair.daemons
    try:
        with a.admin() as admin:
            admin.call("drain")
        with Pipeline(pair.endpoints) as pipe:
            ids = {pipe.submit("addone", {"x": x_of(n)}): n for n in range(20)}
            assert {served_by(pipe.result(i), n) for i, n in ids.items()} == {2}
            assert pipe.moved == 10
        with b.admin() as admin:
            admin.call("drain")
        with Pipeline(pair.endpoints) as pipe:  # both drain: the 503 is the answer, no ping-pong
            replies = pipe.gather([pipe.submit("addone", {"x": x_of(n)}) for n in range(4)])
        assert all(r.status == 503 and r.header.get("draining") and r.retry_after_ms for r in replies)
    finally:
        for daemon in (a, b):
            with daemon.admin() as admin:
                admin.call("resume")


def test_a_daemon_that_stops_answering_is_given_up_after_the_bound(pair: Pair) -> None:
    b = pair.daemons[1]
    b.signal(signal.SIGSTOP)  # wedged: its connections stay open, nothing answers
    try:
        with Pipeline(pair.endpoints, failover_s=0.5, timeout_s=20) as pipe:
            ids = {pipe.submit("addone", {"x": x_of(n)}): n for n in range(20)}
            assert len(pipe.holding(b.endpoint)) == 10
            assert {served_by(pipe.result(i), n) for i, n in ids.items()} == {1}
            assert pipe.moved == 10
    finally:
        b.signal(signal.SIGCONT)


def test_cli_infer_takes_several_endpoints(pair: Pair, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "infermux", "infer", "addone", "--shape", "x=1x4", "--json",
                           "-e", pair.endpoints[1], "-e", f"ipc://{tmp_path}/gone.sock"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == 200


def test_sigkill_under_pipelined_load_loses_no_request_and_delivers_none_twice(pair: Pair) -> None:
    """A is stopped, then SIGKILLed 50 replies later: so it certainly dies holding requests it never
    read (killed at once, it may have answered all it held, and then nothing is resent)."""
    total, window, stop_at, kill_at = 600, 32, 100, 150
    numbers: dict[int, int] = {}
    seen: Counter[int] = Counter()
    after_kill: Counter[int] = Counter()
    with Pipeline(pair.endpoints, timeout_s=20) as pipe:
        while len(numbers) < total or pipe.in_flight:
            while len(numbers) < total and pipe.in_flight < window:
                n = len(numbers)
                numbers[pipe.submit("addone", {"x": x_of(n)})] = n
            reply = pipe.next_reply()
            ident = reply.header["id"]
            seen[ident] += 1
            by = served_by(reply, numbers[ident])  # the id kept: the reply answers that request
            replied = sum(seen.values())
            if replied > kill_at:
                after_kill[by] += 1
            if replied == stop_at:
                pair.daemons[0].signal(signal.SIGSTOP)
            if replied == kill_at:
                pair.kill(0)
        pipe.timeout_s = 0.2
        with pytest.raises(TimeoutError):  # nothing more to come: no request was delivered twice
            pipe.next_reply()
        assert pipe.moved > 0
    assert set(seen) == set(numbers) and set(seen.values()) == {1}
    assert set(after_kill) == {2}


def test_every_daemon_down_raises_endpoints_down_naming_them_within_the_bound(pair_started: Pair) -> None:
    pair = pair_started  # as earlier tests left it: a daemon they killed is not started again
    with Client(pair.endpoints, timeout_s=60, failover_s=0.5) as client:
        assert client.infer("addone", {"x": x_of(3)}).status == 200
        for which, daemon in enumerate(pair.daemons):
            if daemon.alive():
                pair.kill(which)
        start = time.monotonic()
        with pytest.raises(EndpointsDown) as caught:
            client.infer("addone", {"x": x_of(4)})
        waited = time.monotonic() - start
    assert waited < 10, waited  # the bound is 2 x failover_s; timeout_s (60) would be much later
    assert set(caught.value.reasons) == set(pair.endpoints)
    assert all(endpoint in str(caught.value) for endpoint in pair.endpoints)
    with Pipeline(pair.endpoints, timeout_s=60, failover_s=0.5) as pipe:
        pipe.submit("addone", {"x": x_of(5)})
        with pytest.raises(EndpointsDown, match="infermux serve"):
            pipe.next_reply()


def test_what_a_fleet_cannot_do_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    a, b = f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"
    with pytest.raises(ValueError, match="given twice"):
        Pipeline([a, a])
    with Pipeline([a, b]) as pipe:
        region = SharedTensor("token", 0, "float32", (1, 4))
        with pytest.raises(ValueError, match="shared-memory regions belong to one daemon"):
            pipe.submit("addone", {"x": region})
        assert pipe.in_flight == 0
    with Client([a, b]) as client:
        with pytest.raises(ValueError, match="one endpoint"):
            client.send_raw([b"{}"])
