"""An idle daemon sleeps, and what must stay on time still does.

With every model hot and no traffic the daemon wakes about once a second
(docs/performance.md, "What wakes an idle daemon"); the figures are
tests/benchmarks/bench_idle.py's. These tests start the real daemon and
check the contract around that: it does not wake on timers while nobody
asks, a subscriber still gets its snapshots, a silent stream is still
reported on time, health answers, and a worker that hangs is still caught
within worker_hang_s. The systemd watchdog's test is in test_supervisor.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from support.metrics import probe
from support.harness import DAEMON_HEAD, Daemon, free_port
from support.polling import eventually
from support.stats_stream import event_of, subscribed
from support.workers import start as start_cold, until_200
from infermux.execution.streams import CHECK_S
from infermux.workers import slots as shm

HOT_MODELS = 20
ROW = np.ones((1, 4), dtype=np.float32)


def hot(count: int) -> str:
    return "".join(f'[[models]]\nname = "m{i}"\nengine = "addone/1/model.onnx"\n' for i in range(count))


def voluntary_switches(pid: int) -> int:
    """Voluntary context switches summed over the process's live threads: each is a thread going to sleep."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        total += next(int(line.split()[1]) for line in status.splitlines()
                      if line.startswith("voluntary_ctxt_switches:"))
    return total


def wakeups_per_s(d: Daemon, seconds: float) -> float:
    assert d.proc is not None
    before, began = voluntary_switches(d.proc.pid), time.monotonic()
    time.sleep(seconds)  # the window measured; the verdict is the caller's bound
    return (voluntary_switches(d.proc.pid) - before) / (time.monotonic() - began)


@pytest.mark.timing
def test_an_idle_daemon_with_many_hot_models_hardly_wakes(make_daemon) -> None:
    d = make_daemon(hot(HOT_MODELS), head=DAEMON_HEAD + f"metrics_port = {free_port()}\n")
    # Once the start's own work is over (loads, warm-ups), under ten a second: the frontend's
    # once-a-second turn and libzmq's own. Timers polled every 20-100 ms made it ninety.
    eventually(lambda: wakeups_per_s(d, 2.0) < 10, "the idle daemon to wake under ten times a second", 60)


@pytest.mark.timing
def test_a_subscriber_gets_snapshots_while_the_daemon_is_idle_and_more_under_traffic(make_daemon) -> None:
    d = make_daemon(hot(2))
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"snapshot")
    sub.connect(d.stats_endpoint)
    try:
        assert sub.poll(10_000), "no snapshot after subscribing"
        sub.recv_multipart()
        arrived = []
        until = time.monotonic() + 4.0
        while (left := until - time.monotonic()) > 0:
            if sub.poll(int(left * 1000) + 1):
                sub.recv_multipart()
                arrived.append(time.monotonic())
        gaps = np.diff(arrived)
        # Idle: one a second, well within the console's 2 s before it calls the link down.
        assert len(arrived) >= 3 and gaps.max() < 2.0, gaps
        with d.client() as client:
            for _ in range(3):
                assert client.infer("m0", {"x": ROW}).status == 200

        def shows_the_requests() -> bool:
            while sub.poll(100):
                body = json.loads(sub.recv_multipart()[1])
                if body["daemon"]["requests"] >= 3:
                    return True
            return False

        eventually(shows_the_requests, "a snapshot counting the requests", 10)
    finally:
        sub.close(0)


@pytest.mark.timing
def test_a_stream_that_stops_is_reported_silent_on_time_by_an_idle_daemon(make_daemon) -> None:
    silent_s = 1.0
    d = make_daemon(hot(1), head=DAEMON_HEAD + f"stream_silent_s = {silent_s}\n")
    events = subscribed(d)
    try:
        with d.client() as client:
            for _ in range(3):
                assert client.infer("m0", {"x": ROW}, key="door").status == 200
        event = eventually(lambda: event_of(events, "stream_silent"), "a stream_silent event", 15)
        # silent_s in the event is how long the stream had been quiet when the check saw it: the loop
        # woke for it within CHECK_S, not at its next idle turn.
        assert event["key"] == "door" and silent_s <= event["silent_s"] <= silent_s + CHECK_S + 0.5, event
    finally:
        events.close(0)


def test_an_idle_daemon_answers_its_health_probes(make_daemon) -> None:
    port = free_port()
    make_daemon(hot(HOT_MODELS), head=DAEMON_HEAD + f"metrics_port = {port}\n")
    answers = []
    for _ in range(6):  # across several of the loop's idle turns
        answers.append(probe(port, "/healthz"))
        time.sleep(0.5)
    assert [(status, body.strip()) for status, body in answers] == [(200, "alive")] * 6
    assert probe(port, "/readyz")[0] == 200


@pytest.mark.timing
def test_a_worker_that_hangs_while_the_daemon_idles_is_killed_within_its_hang_time(make_daemon) -> None:
    hang_s = 1.0
    d = start_cold(make_daemon, '[[models]]\nname = "c"\nengine = "fast512/1/model.onnx"\nplacement = "cold"\n'
                   'preload = true\n', hang=hang_s)
    with d.admin() as admin:
        pid = next(m for m in admin.call("models")["models"] if m["name"] == "c")["worker"]["pid"]
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        d.wait_for(f"crashed model=c version=1 pid={pid}", timeout=30)
        seen_after = time.monotonic() - stopped
    finally:
        if shm.pid_alive(pid):
            os.kill(pid, signal.SIGCONT)
    assert "hung (no heartbeat for" in d.log()
    assert seen_after < hang_s + 3.0, seen_after  # the watcher looks every 0.1 s while a worker runs
    with d.client() as client:
        assert until_200(client, "c", np.ones((1, 512), dtype=np.float32)).status == 200
