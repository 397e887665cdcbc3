"""Cold models in worker processes, end to end with real daemons and real workers."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support.harness import Daemon
from support.polling import eventually
from support.workers import head, start, stop_clean, until_200, worker
from infermux.client import Reply
from infermux.workers import lane, slots as shm

X_SLOT = np.random.default_rng(5).random((64, 512), dtype=np.float32)  # 128 KB: through a slot
X_INLINE = X_SLOT[:2]  # 4 KB: inline in the pipe message


def cold(name: str, engine: str = "fast512/1/model.onnx", **fields: object) -> str:
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"').replace("True", "true").replace("False", "false")
                    for k, v in fields.items())
    return f'[[models]]\nname = "{name}"\nengine = "{engine}"\nplacement = "cold"\n{extra}'


def row(d: Daemon, name: str) -> dict:
    with d.admin() as admin:
        return next(m for m in admin.call("models")["models"] if m["name"] == name)


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    """Process `pid` has exited (or is a zombie) within `timeout_s`; fails the test otherwise."""
    return eventually(lambda: not shm.pid_alive(pid) or _zombie(pid), f"process {pid} to exit", timeout_s)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_first_request_gets_503_then_200_with_the_hot_outputs(make_daemon) -> None:
    d = start(make_daemon, cold("c") + '[[models]]\nname = "h"\nengine = "fast512/1/model.onnx"\n')
    with d.client() as client:
        first = client.infer("c", {"x": X_SLOT})
        assert first.status == 503 and first.retry_after_ms >= 50 and "loading" in first.error
        served = until_200(client, "c", X_SLOT)
        hot = client.infer("h", {"x": X_SLOT})
        # Later requests of the same shapes are computed straight into their slot (slotoutputs.py).
        again = [(client.infer("c", {"x": X_SLOT * k}), client.infer("h", {"x": X_SLOT * k})) for k in (2, 3, 4)]
        small, small_hot = client.infer("c", {"x": X_INLINE}), client.infer("h", {"x": X_INLINE})
    assert served.status == 200 and (served.model, served.version) == ("c", "1")
    assert set(served.header["timing_us"]) == {"queue", "compute", "total"}
    np.testing.assert_array_equal(served.outputs["y"], hot.outputs["y"])
    for cold_reply, hot_reply in again:
        assert cold_reply.status == 200, cold_reply.header
        np.testing.assert_array_equal(cold_reply.outputs["y"], hot_reply.outputs["y"])
    np.testing.assert_array_equal(small.outputs["y"], small_hot.outputs["y"])
    info = worker(d, "c")
    assert info["pid"] != d.proc.pid and info["state"] == "ready" and info["rss_bytes"] > 10 << 20
    assert row(d, "c")["placement"] == "cold" and row(d, "h").get("worker") is None
    assert f"worker_started model=c version=1 pid={info['pid']}" in d.log()
    stop_clean(d)
    assert gone(info["pid"])


def test_messages_too_big_for_the_fast_lane_take_the_zeromq_pipe(make_daemon) -> None:
    # Tensors up to 1 MiB inline in the message: a 128 KB request and its 128 KB reply do not fit
    # one packet of the fast lane (lane.MAX_PACKET), so both travel through the ZeroMQ pipes.
    d = start(make_daemon, cold("c", preload=True) + '[[models]]\nname = "h"\nengine = "fast512/1/model.onnx"\n',
              env={"INFERMUX_WORKER_INLINE_BYTES": str(1 << 20)})
    assert X_SLOT.nbytes > lane.MAX_PACKET
    with d.client() as client:
        for k in (1, 2, 3):
            served, hot = until_200(client, "c", X_SLOT * k), client.infer("h", {"x": X_SLOT * k})
            assert served.status == 200, served.header
            np.testing.assert_array_equal(served.outputs["y"], hot.outputs["y"])
    assert worker(d, "c")["slots"] == 0  # nothing went through shared memory
    stop_clean(d)


def test_outputs_whose_shape_follows_the_data_are_served_right_as_it_changes(make_daemon) -> None:
    # NonZero's output is [2, count]: the worker learns one shape, the next request's differs, the
    # backend refuses the slot arrays and the request is computed the ordinary way instead.
    d = start(make_daemon, cold("nz", "nonzero/1/model.onnx", preload=True))
    rng = np.random.default_rng(7)
    with d.client() as client:
        for density in (0.5, 0.5, 0.1, 0.9, 0.1, 0.0):
            x = (rng.random((1, 20000)) < density).astype(np.float32)  # 80 KB: through a slot
            reply = until_200(client, "nz", x)
            assert reply.status == 200, reply.header
            np.testing.assert_array_equal(reply.outputs["y"], np.stack(np.nonzero(x)))
    assert "Traceback" not in d.log()
    stop_clean(d)


def test_errors_and_fallback_headers_come_back_as_from_a_hot_model(make_daemon) -> None:
    d = start(make_daemon, cold("r", "reshaper/1/model.onnx", preload=True)
              + '[[models]]\nname = "late"\nengine = "fast512/1/model.onnx"\nfallback = "c"\n'
                'backend = "slow_load:SlowLoadBackend"\n[models.options]\nload_delay_s = 30\n'
              + cold("c", preload=True), wait_ready=False)
    d.wait_for("loaded model=c ")
    d.wait_for("loaded model=r ")
    x = np.zeros((1, 4), np.float32)
    with d.client() as client:
        bad = client.infer("r", {"x": x, "shape": np.array([3, 5], np.int64)})
        good = client.infer("r", {"x": x, "shape": np.array([2, 2], np.int64)})
        wrong = client.infer("c", {"x": np.zeros((1, 5), np.float32)})
        stand_in = client.infer("late", {"x": X_SLOT})
    assert bad.status == 500 and "backend error" in bad.error and bad.model == "r"
    assert good.status == 200 and good.outputs["y"].shape == (2, 2)
    assert wrong.status == 400 and "dimension 1 must be 512" in wrong.error
    assert stand_in.status == 200 and stand_in.model == "c"
    assert stand_in.fallback == {"from": "late", "reason": "not_ready"}
    np.testing.assert_array_equal(stand_in.outputs["y"], X_SLOT)
    stop_clean(d)


@pytest.mark.timing
def test_sigkill_answers_every_request_in_flight_at_once_and_the_next_restarts(make_daemon) -> None:
    d = start(make_daemon, cold("s", "slower/1/model.onnx", preload=True, max_queue=64, timeout_ms=20000)
              + '[[models]]\nname = "h"\nengine = "fast512/1/model.onnx"\n')
    pid = worker(d, "s")["pid"]
    # Over 100 ms each on the 2-core box (48 layers): the 23 after the first take seconds, so at
    # least 10 are still in flight at the kill even if this test is held off the CPU for a while.
    big = np.ones((256, 512), np.float32)
    with d.pipeline(timeout_s=8) as pipe:
        ids = [pipe.submit("s", {"x": big}) for _ in range(24)]
        first = pipe.next_reply()
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        replies, arrived = [first], []
        for _ in ids[1:]:
            replies.append(pipe.next_reply())
            arrived.append(time.monotonic() - killed)
    statuses = [r.status for r in replies]
    assert set(statuses) <= {200, 503} and statuses.count(503) >= 10, statuses
    assert max(arrived) < 5.0, arrived  # at once: not after worker_hang_s (10 s) or the deadline (20 s)
    # In flight at the kill: "crashed"; one the daemon read only after it is told the model is loading.
    crashed = [r for r in replies if r.status == 503 and "crashed (killed by SIGKILL)" in r.error]
    assert len(crashed) >= 10, [r.error for r in replies if r.status == 503]
    failed = crashed[0]
    assert failed.retry_after_ms >= 100
    assert failed.model == "s"
    with d.client() as client:
        assert client.infer("h", {"x": X_INLINE}).status == 200  # hot models never notice
        again = until_200(client, "s", X_INLINE)
    assert again.status == 200 and worker(d, "s")["pid"] != pid
    log = d.log()
    assert f"crashed model=s version=1 pid={pid} exit=\"killed by SIGKILL\"" in log
    stop_clean(d)


@pytest.mark.slow
@pytest.mark.timing
def test_three_crashes_within_a_minute_mark_the_model_failed(make_daemon) -> None:
    d = start(make_daemon, cold("c", preload=True))
    with d.client() as client:
        for crash in range(3):
            assert until_200(client, "c", X_INLINE).status == 200
            info = worker(d, "c")
            os.kill(info["pid"], signal.SIGKILL)
            assert gone(info["pid"])
            d.wait_for(f"crashed model=c version=1 pid={info['pid']}")
        eventually(lambda: row(d, "c")["state"] == "failed", "the model marked failed")
        reply = client.infer("c", {"x": X_INLINE})
    assert reply.status == 503 and "crashed 3 times" in reply.error and reply.retry_after_ms
    assert row(d, "c")["state"] == "failed"
    with d.admin() as admin:
        admin.call("load", model="c")  # an operator's load forgives the crashes
    with d.client() as client:
        assert client.infer("c", {"x": X_INLINE}).status == 200
    stop_clean(d)


@pytest.mark.timing
def test_a_hung_worker_is_killed_and_replaced(make_daemon) -> None:
    d = start(make_daemon, cold("c", preload=True), hang=0.5)
    pid = worker(d, "c")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        d.wait_for(f"crashed model=c version=1 pid={pid}", timeout=30)
    finally:
        if shm.pid_alive(pid):
            os.kill(pid, signal.SIGCONT)
    assert "hung (no heartbeat for" in d.log()
    with d.client() as client:
        assert until_200(client, "c", X_SLOT).status == 200
    assert worker(d, "c")["pid"] != pid
    stop_clean(d)


@pytest.mark.timing
def test_idle_unload_stops_the_process_and_the_next_request_restarts_it(make_daemon) -> None:
    # Idle for 3 s, not 0.5: the worker must still be there when the test asks for its pid.
    d = start(make_daemon, cold("c", idle_unload_s=3.0))
    with d.client() as client:
        assert until_200(client, "c", X_SLOT).status == 200
        pid = worker(d, "c")["pid"]
        assert gone(pid, timeout_s=30)
        d.wait_for(f"worker_stopped model=c version=1 pid={pid} reason=idle")
        d.wait_for("unloaded model=c version=1")
        assert row(d, "c")["state"] == "unloaded" and row(d, "c").get("worker") is None
        assert client.infer("c", {"x": X_SLOT}).status == 503
        assert until_200(client, "c", X_SLOT).status == 200
    assert worker(d, "c")["pid"] != pid
    stop_clean(d)


@pytest.mark.timing
def test_spare_worker_makes_a_cold_start_cost_the_load_alone(make_daemon) -> None:
    d = start(make_daemon, cold("c"))
    d.wait_for("spare_started")
    spare = int(d.log().split("spare_started pid=")[1].split()[0])
    with d.client() as client:
        assert until_200(client, "c", X_INLINE).status == 200
    assert worker(d, "c")["pid"] == spare
    eventually(lambda: d.log().count("spare_started pid=") == 2, "a new spare after the first was taken")
    stop_clean(d)


@pytest.mark.timing
def test_memory_budget_stops_the_least_recently_used_idle_worker_then_refuses(make_daemon, tmp_path) -> None:
    huge = tmp_path / "huge.onnx"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)  # sparse: its size says 1 GiB, which is all the estimate reads
    d = start(make_daemon, cold("a") + cold("b") + cold("c") + cold("huge", str(huge)))
    with d.client() as client:
        assert until_200(client, "a", X_INLINE).status == 200
        assert until_200(client, "b", X_INLINE).status == 200
        assert client.infer("a", {"x": X_INLINE}).status == 200  # a is now used more recently than b
        a_pid, b_pid = worker(d, "a")["pid"], worker(d, "b")["pid"]
        # A budget that holds a and b but not a third worker (whatever a worker weighs on this box),
        # applied live by `reload`.
        a_bytes, b_bytes = row(d, "a")["memory_bytes"], row(d, "b")["memory_bytes"]
        d.config_path.write_text(d.config_path.read_text().replace(
            'memory_budget = "80%"', f"memory_budget = {a_bytes + b_bytes + b_bytes // 2}"))
        with d.admin() as admin:
            admin.call("reload")
        assert until_200(client, "c", X_INLINE).status == 200
        d.wait_for("evicted model=b version=1")
        assert gone(b_pid) and shm.pid_alive(a_pid)
        assert row(d, "b")["state"] == "unloaded" and row(d, "a")["state"] == "ready"
        def refusal() -> Reply | None:  # the first may still say "loading"
            reply = client.infer("huge", {"x": X_INLINE})
            return reply if "memory budget" in (reply.error or "") else None

        refused = eventually(refusal, "huge refused for the memory budget")
    assert refused.status == 503 and "memory budget" in refused.error and "huge:1 needs about" in refused.error
    assert "refused model=huge version=1" in d.log()
    assert row(d, "a")["state"] == "ready" and row(d, "c")["state"] == "ready"  # nothing evicted in vain
    stop_clean(d)


@pytest.mark.timing
def test_promote_and_demote_under_load_lose_no_request(make_daemon) -> None:
    d = start(make_daemon, cold("m", preload=True))
    replies: list = []
    stop = threading.Event()

    def load() -> None:
        with d.pipeline() as pipe:
            while not stop.is_set():
                ids = [pipe.submit("m", {"x": X_SLOT if i % 2 else X_INLINE}) for i in range(8)]
                replies.extend(pipe.gather(ids))

    clients = [threading.Thread(target=load) for _ in range(2)]
    for t in clients:
        t.start()
    # Each step waits for 40 more replies, not a fixed time: under load on every placement, however
    # slowly a busy box serves them.
    def served_40_more() -> None:
        target = len(replies) + 40
        eventually(lambda: len(replies) >= target, "40 more replies")

    try:
        served_40_more()
        old_pid = worker(d, "m")["pid"]
        with d.admin() as admin:
            promoted = admin.call("promote", model="m")
            assert row(d, "m")["placement"] == "hot" and row(d, "m").get("worker") is None
            served_40_more()
            demoted = admin.call("demote", model="m")
        served_40_more()
    finally:
        stop.set()
        for t in clients:
            t.join()
    assert "now hot" in promoted["message"] and "now cold" in demoted["message"]
    assert gone(old_pid)
    statuses = {r.status for r in replies}
    assert statuses == {200}, [r.header for r in replies if r.status != 200][:3]
    assert len(replies) > 100
    assert row(d, "m")["placement"] == "cold" and worker(d, "m")["pid"] != old_pid
    with d.admin() as admin:
        again = admin.call("demote", model="m", check=False)
    assert not again["ok"] and "already cold" in again["error"]
    stop_clean(d)


@pytest.mark.timing
def test_daemon_sigkill_leaves_no_worker_and_no_shared_memory(make_daemon) -> None:
    d = start(make_daemon, cold("c", preload=True))
    with d.client() as client:
        assert client.infer("c", {"x": X_SLOT}).status == 200
    daemon_pid, pid = d.proc.pid, worker(d, "c")["pid"]
    assert shm.leftovers(daemon_pid)  # the request went through a slot
    d.signal(signal.SIGKILL)
    d.proc.wait()
    assert gone(pid, timeout_s=30)
    eventually(lambda: shm.leftovers(daemon_pid) == [], "no shared memory left behind", 30)


@pytest.mark.timing
def test_a_new_daemon_sweeps_segments_a_killed_one_left(make_daemon, tmp_path) -> None:
    import subprocess
    import sys

    # A directory of its own (INFERMUX_SHM_DIR): in /dev/shm any other daemon starting on
    # the box meanwhile (another test run) may sweep the stale segment before this one does.
    private = tmp_path / "shm"
    private.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = private / f"{shm.PREFIX}{dead}-1-0"
    stale.write_bytes(b"\0" * 64)
    d = start(make_daemon, cold("c"), env={"INFERMUX_SHM_DIR": str(private)})
    assert not stale.exists()
    assert "swept model" not in d.log() and "swept segments=1 " in d.log()
    pid = d.proc.pid
    assert d.stop() == 0, d.log()
    assert [p.name for p in private.iterdir() if p.name.startswith(f"{shm.PREFIX}{pid}-")] == []


@pytest.mark.timing
def test_admin_settings_reach_the_worker_and_it_batches_and_honours_deadlines(make_daemon) -> None:
    # inline_max_us = 0: the worker's I/O thread computes nothing itself, so every request meets the
    # batcher; with it on, a request finding no other in the pipe runs alone at once (inline.py), and
    # whether 24 pipelined requests ever overlap there depends on how busy the box is.
    no_inline = head() + "inline_max_us = 0\n"
    # A 2 s delay (far longer than a stalled client) and 24 requests of 2 rows over two contexts of
    # 8 rows: the batches fill, and at worst the last of each context waits the delay out.
    d = make_daemon(cold("c", preload=True, batch_delay_us=2_000_000, timeout_ms=20000)
                    + cold("s", "slow/1/model.onnx", preload=True, timeout_ms=20000), head=no_inline)
    with d.admin() as admin:
        admin.call("set", model="c", contexts=2, max_batch=8)
    assert row(d, "c")["contexts"] == 2 and row(d, "c")["max_batch"] == 8
    with d.pipeline(timeout_s=30) as pipe:
        replies = pipe.gather([pipe.submit("c", {"x": X_INLINE}) for _ in range(24)])
    assert all(r.status == 200 for r in replies)
    assert max(r.header.get("batch", 1) for r in replies) > 1  # merged inside the worker
    np.testing.assert_array_equal(replies[0].outputs["y"], X_INLINE)
    big = np.ones((400, 512), np.float32)
    with d.pipeline(timeout_s=30) as pipe:
        # Four long computes ahead of the 5 ms request: it waits behind a few hundred ms even if
        # this client is held off the CPU for a while after the first.
        first = [pipe.submit("s", {"x": big}) for _ in range(4)]
        stale = pipe.submit("s", {"x": big[:1]}, timeout_ms=5)
        *done, late = pipe.gather([*first, stale])
    assert [r.status for r in done] == [200] * 4
    assert late.status == 504 and "not computed" in late.error, late.header
    stop_clean(d)


def test_sigterm_answers_what_the_workers_hold_then_stops_them(make_daemon) -> None:
    d = start(make_daemon, cold("s", "slow/1/model.onnx", preload=True, timeout_ms=20000))
    pid = worker(d, "s")["pid"]
    with d.pipeline(timeout_s=15) as pipe:
        ids = [pipe.submit("s", {"x": np.ones((128, 512), np.float32)}) for _ in range(8)]
        first = pipe.next_reply()
        d.signal(signal.SIGTERM)
        replies = [first, *pipe.replies()]
    assert len(replies) == len(ids) and {r.status for r in replies} <= {200, 503}
    assert sum(r.status == 200 for r in replies) >= 2  # accepted work is finished, not dropped
    daemon_pid = d.proc.pid
    assert d.proc.wait(20) == 0, d.log()
    assert gone(pid) and shm.leftovers(daemon_pid) == []


# -- a cold placement answers what a hot one does -----------------------------------------

HOT_H = '[[models]]\nname = "h"\nengine = "fast512/1/model.onnx"\n'


def test_a_cold_model_with_a_fallback_is_served_itself_once_its_worker_is_up(make_daemon) -> None:
    # The router asks a fallback model's placement for its expected wait (deadline fallback):
    # a cold one used to fail that with a 500 on every request once its worker was up.
    d = start(make_daemon, cold("c", preload=True, fallback="h") + HOT_H)
    with d.client() as client:
        replies = [client.infer("c", {"x": X_INLINE * k}) for k in (1, 2, 3)]
    for k, reply in zip((1, 2, 3), replies):
        assert reply.status == 200 and reply.model == "c" and reply.fallback is None, reply.header
        np.testing.assert_array_equal(reply.outputs["y"], X_INLINE * k)
    stop_clean(d)


def test_a_cold_model_learns_its_time_per_row_from_requests_that_ran_alone(make_daemon) -> None:
    # The worker used to report a request that ran alone as one row: the daemon then took a whole
    # 64-row compute for the time of one row, and a burst's expected wait (Retry-After, the deadline
    # fallback) came out 64 times too long.
    d = start(make_daemon, cold("c", preload=True))
    with d.client() as client:
        replies = [until_200(client, "c", X_SLOT) for _ in range(3)]
    assert all(r.status == 200 and "batch" not in r.header for r in replies), [r.header for r in replies]
    per_row = row(d, "c")["stats"]["service_time_us"]
    fastest = min(r.header["timing_us"]["compute"] for r in replies)
    assert per_row is not None and per_row * len(X_SLOT) <= 4 * max(fastest, 1), (per_row, fastest)
    stop_clean(d)


def test_a_full_cold_queue_answers_429_with_a_retry_time(make_daemon) -> None:
    # The worker is stopped (SIGSTOP), so nothing it holds can be answered before the rest
    # arrive: max_queue + contexts requests are in flight, every later one finds the queue full.
    d = start(make_daemon, cold("s", preload=True, max_queue=2, timeout_ms=20000))
    pid = worker(d, "s")["pid"]
    with d.pipeline(timeout_s=15) as pipe:
        os.kill(pid, signal.SIGSTOP)
        try:
            ids = [pipe.submit("s", {"x": X_INLINE}) for _ in range(8)]
            refused = [pipe.next_reply() for _ in range(5)]
        finally:
            os.kill(pid, signal.SIGCONT)
        served = list(pipe.replies())
    assert [r.status for r in refused] == [429] * 5, [r.header for r in refused]
    assert all(r.retry_after_ms >= 1 and "queue is full" in r.error for r in refused)
    assert [r.status for r in served] == [200] * 3 and len(ids) == 8
    assert "Traceback" not in d.log()
    stop_clean(d)


def _kill_under_load(d: Daemon, pipe, pid: int) -> list[int]:
    """Statuses of requests sent while worker `pid` is killed, up to the first 200 from its successor.

    Every request read after the death gets a 503 until a new worker is up (it starts on that
    demand), and each reply sends one more: so a 503 and then a 200 come, certainly."""
    statuses: list[int] = []
    killed_at = None
    for _ in range(16):
        pipe.submit("c", {"x": X_INLINE})
    while killed_at is None or 503 not in statuses[killed_at:] or statuses[-1] != 200:
        reply = pipe.next_reply()
        statuses.append(reply.status)
        assert reply.status in (200, 503) and (reply.status == 200 or reply.retry_after_ms > 0), reply.header
        if len(statuses) == 40:
            os.kill(pid, signal.SIGKILL)
            killed_at = len(statuses)
            for _ in range(200):  # a burst, so that many arrive while the proxy learns of the death
                pipe.submit("c", {"x": X_INLINE})
        pipe.submit("c", {"x": X_INLINE})
    statuses += [r.status for r in pipe.replies()]
    return statuses


def test_requests_while_a_worker_dies_get_503_with_a_retry_time_or_200(make_daemon) -> None:
    # Those that reach the proxy between the worker's death and the moment the proxy sees it
    # (the lane and the pipe refuse them) used to get a 500. Twice: a third crash within a
    # minute would mark the version failed.
    d = start(make_daemon, cold("c", preload=True, max_queue=512))
    for _ in range(2):
        pid = worker(d, "c")["pid"]
        with d.pipeline(timeout_s=15) as pipe:
            statuses = _kill_under_load(d, pipe, pid)
        assert set(statuses) == {200, 503}, statuses
        # The last 200 may be the dead worker's, forwarded after the first 503s: the new one may
        # still be starting when the replies are in.
        eventually(lambda: (worker(d, "c") or {}).get("pid") not in (None, pid), "a new worker", timeout_s=60)
    assert "Traceback" not in d.log()
    stop_clean(d)


def _batches(d: Daemon, n: int) -> list[int]:
    """The batch each of `n` pipelined one-row requests to "c" ran in (1: alone)."""
    with d.pipeline(timeout_s=30) as pipe:
        replies = pipe.gather([pipe.submit("c", {"x": X_INLINE[:1] * k}) for k in range(n)])
    assert all(r.status == 200 for r in replies), [r.header for r in replies]
    for k, reply in enumerate(replies):
        np.testing.assert_array_equal(reply.outputs["y"], X_INLINE[:1] * k)
    return [r.header.get("batch", 1) for r in replies]


def test_preferred_batch_set_live_or_by_reload_changes_how_the_worker_batches(make_daemon) -> None:
    # A batch waits up to batch_delay_us (10 s) for max_batch rows unless it reaches the largest
    # preferred size, which goes at once: so the sizes the worker runs say which preferred sizes
    # it was told. The I/O thread computes nothing itself (inline_max_us = 0): every request
    # meets the batcher.
    no_inline = head() + "inline_max_us = 0\n"
    model = cold("c", preload=True, max_batch=8, batch_delay_us=10_000_000, timeout_ms=60000)
    d = make_daemon(model + 'preferred_batch = [4]\n', head=no_inline)
    assert _batches(d, 4) == [4] * 4
    with d.admin() as admin:
        admin.call("set", model="c", preferred_batch=[2])
    assert row(d, "c")["preferred_batch"] == [2]
    assert _batches(d, 4) == [2] * 4
    d.config_path.write_text(d.config_path.read_text().replace("preferred_batch = [4]", "preferred_batch = [3]"))
    with d.admin() as admin:
        admin.call("reload")
    assert row(d, "c")["preferred_batch"] == [3]
    assert _batches(d, 6) == [3] * 6
    stop_clean(d)


@pytest.mark.parametrize("way, path", [(-1.0, "the fast lane"), (-2.0, "the ZeroMQ pipe")])
def test_a_worker_that_sends_a_malformed_message_is_stopped_and_restarted(make_daemon, way, path) -> None:
    # tests/support/fakes/plugins/garbling.py: on this input the worker sends a message that does not decode (a
    # truncated REPLY on the lane, read by the frontend; a BEAT that is not JSON on the pipe, read by
    # the proxy's reader thread) and never answers. The daemon says so in one line, stops the worker
    # as a crash, answers what it held 503 with a retry time, and the next request starts a new one.
    d = start(make_daemon, cold("c", preload=True, backend="garbling:GarblingBackend")
              + '[[models]]\nname = "h"\nengine = "fast512/1/model.onnx"\n')
    with d.client(timeout_s=30) as client:
        until_200(client, "c", X_INLINE)
        pid = worker(d, "c")["pid"]
        marked = X_INLINE.copy()
        marked.flat[0] = way
        refused = client.infer("c", {"x": marked})
        assert client.infer("h", {"x": X_INLINE}).status == 200  # the rest of the daemon carries on
        served = until_200(client, "c", X_INLINE)
    assert refused.status == 503 and refused.retry_after_ms, (path, refused.header)
    assert "sent a malformed message" in refused.error, refused.error
    assert served.status == 200 and worker(d, "c")["pid"] != pid
    log = d.log()
    assert f"crashed model=c version=1 pid={pid}" in log
    assert f"worker {pid} (model=c version=1) sent a malformed message" in log, log
    assert "Traceback" not in log, log
    stop_clean(d)


def test_a_worker_whose_answer_to_load_does_not_decode_fails_the_load_saying_why(make_daemon) -> None:
    # The load waits for STAGE, READY or ERROR; a READY that is not JSON fails it as a load error
    # would (the worker stopped, the version failed with the reason), not the loader thread.
    d = start(make_daemon, cold("c", backend="garbling:GarblingBackend") + "[models.options]\ngarble_load = true\n")
    with d.client() as client:
        first = client.infer("c", {"x": X_INLINE})
        eventually(lambda: row(d, "c")["state"] == "failed", "the load fails")
        again = client.infer("c", {"x": X_INLINE})
    assert first.status == 503 and again.status == 503, (first.header, again.header)
    assert "READY does not decode" in row(d, "c")["reason"], row(d, "c")
    eventually(lambda: "worker_stopped model=c version=1" in d.log(), "the worker is stopped")
    assert "Traceback" not in d.log(), d.log()
    stop_clean(d)
