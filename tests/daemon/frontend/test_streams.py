"""Streams: under `queue_policy = "newest_per_key"` a key is a camera, whose newest frame wins.

What the queue holds is made certain by construction, as in the feature matrix: a request that
computes for tens of milliseconds (LONG rows through the slower model, one context) is read first,
and the frames behind it arrive in the same burst on one connection, microseconds apart, so they
are all queued while it runs. A pipeline's frames are held by the gate processor
(tests/support/fakes/plugins/gate_processor.py) until the test opens it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from infermux.client import Reply
from infermux.pipelines.wire import encode_frame
from support.harness import DAEMON_HEAD, Daemon, free_port
from support.metrics import scrape
from support.pipelines import gated_pipeline
from support.polling import eventually

RNG = np.random.default_rng(32)
ROW = RNG.random((1, 512), dtype=np.float32)
LONG = RNG.random((400, 512), dtype=np.float32)  # ~50 ms through the 48-layer model: the burst queues behind it
pytestmark = pytest.mark.timing


def slow(policy: str = "newest_per_key", **settings: object) -> str:
    extra = "".join(f"{k} = {v}\n" for k, v in settings.items())
    return (f'[[models]]\nname = "slow"\nengine = "slower/1/model.onnx"\nqueue_policy = "{policy}"\n'
            f"timeout_ms = 20000\n{extra}")


def behind_a_long_compute(d: Daemon, *frames: tuple[str | None, np.ndarray]) -> list[Reply]:
    """One LONG request without a key, then `frames` ((key, x) each) in the same burst: their replies."""
    with d.pipeline(timeout_s=30) as pipe:
        blocker = pipe.submit("slow", {"x": LONG})
        ids = [pipe.submit("slow", {"x": x}, key=key) for key, x in frames]
        replies = pipe.gather([blocker, *ids])
    assert replies[0].status == 200, replies[0].header
    return replies[1:]


def test_a_newer_frame_replaces_the_queued_one_of_its_stream_with_a_409(make_daemon):
    d = make_daemon(slow())
    older, newer = behind_a_long_compute(d, ("cam1", ROW), ("cam1", ROW * 2))
    assert older.status == 409, older.header
    assert older.superseded_by == newer.header["id"] and older.superseded_by is not None
    assert "superseded by a newer request of key 'cam1'" in older.error and "not computed" in older.error
    assert (older.model, older.version) == ("slow", "1") and not older.outputs
    assert newer.status == 200, newer.header


def test_a_409_is_counted_as_superseded_and_never_as_an_error(make_daemon):
    port = free_port()
    d = make_daemon(slow(), head=DAEMON_HEAD + f"metrics_port = {port}\n")
    statuses = [r.status for r in behind_a_long_compute(d, *[("cam1", ROW * k) for k in range(4)])]
    assert statuses == [409, 409, 409, 200], statuses
    with d.admin() as admin:
        stats = next(v for v in admin.call("models")["models"] if v["name"] == "slow")["stats"]
    assert stats["by_status"] == {"200": 2, "409": 3} and stats["error_qps"] == 0, stats  # the console's ERR%
    samples = scrape(port)
    assert samples['infermux_inference_request_superseded_total{model="slow",version="1"}'] == 3
    failures = {k: v for k, v in samples.items() if k.startswith("infermux_inference_request_failure_total")}
    assert failures and not any(failures.values()) and not any("superseded" in k for k in failures), failures


def test_requests_without_a_key_and_other_keys_are_not_replaced(make_daemon):
    d = make_daemon(slow())
    replies = behind_a_long_compute(d, (None, ROW), (None, ROW), ("cam1", ROW), ("cam2", ROW))
    assert [r.status for r in replies] == [200, 200, 200, 200], [r.header for r in replies]


def test_per_key_depth_keeps_that_many_frames_of_a_stream(make_daemon):
    d = make_daemon(slow(per_key_depth=2))
    replies = behind_a_long_compute(d, *[("cam1", ROW * k) for k in range(4)])
    assert [r.status for r in replies] == [409, 409, 200, 200], [r.header for r in replies]
    ids = [r.header["id"] for r in replies]
    assert [r.superseded_by for r in replies[:2]] == ids[2:]  # each replaced by the frame two after it


def test_under_fifo_a_key_s_frames_all_wait_their_turn(make_daemon):
    d = make_daemon(slow("fifo"))
    replies = behind_a_long_compute(d, *[("cam1", ROW) for _ in range(3)])
    assert [r.status for r in replies] == [200, 200, 200]


def test_every_stream_is_seen_and_its_newest_frame_served(make_daemon):
    d = make_daemon(slow())
    cams = [f"cam{i}" for i in range(4)]
    sent = [(cam, ROW) for _ in range(3) for cam in cams]
    replies = behind_a_long_compute(d, *sent)
    for cam in cams:
        assert [r.status for (key, _), r in zip(sent, replies) if key == cam] == [409, 409, 200], \
            [r.header for r in replies]
    # The four newest frames were served, each stream's once. (Not in a fixed order: on a busy box the
    # long compute can end before the last frames are read, and a lane then takes its turn by its age.)
    served = [key for (key, _), r in zip(sent, replies) if r.status == 200]
    assert sorted(served) == cams


def test_a_reload_switches_the_policy_live(make_daemon):
    d = make_daemon(slow("fifo"))
    replies = behind_a_long_compute(d, ("cam1", ROW), ("cam1", ROW))
    assert [r.status for r in replies] == [200, 200]
    d.config_path.write_text(d.config_path.read_text().replace('queue_policy = "fifo"', 'queue_policy = "newest_per_key"'))
    with d.admin() as admin:
        assert admin.call("reload")["changes"]["changed"] == ["slow:1 ['queue_policy']"]
        assert next(m for m in admin.call("models")["models"])["queue_policy"] == "newest_per_key"
    replies = behind_a_long_compute(d, ("cam1", ROW), ("cam1", ROW))
    assert [r.status for r in replies] == [409, 200]


# -- pipelines ---------------------------------------------------------------------------------------

def frame(value: int) -> np.ndarray:
    return np.full((48, 64, 3), value, np.uint8)


def send_frames(d: Daemon, gate: Path, frames: list[tuple[str | None, int]], queued: int) -> list[Reply]:
    """A first frame the thread holds at the gate, then `frames` ((key, pixel value)); the gate opens
    once the pipeline's queue holds `queued` of them; every reply, the first's first."""
    with d.pipeline(timeout_s=30) as pipe:
        def send(key: str | None, value: int, ident: int) -> int:
            pipe._dealer.send(encode_frame("cams", frame(value), "bgr", width=64, height=48, id=ident, key=key))
            pipe.in_flight += 1
            return ident

        first = send("held", 0, 1)
        eventually(lambda: gate.with_suffix(".entered").exists(), "the first frame at the gate")
        ids = [send(key, value, i + 2) for i, (key, value) in enumerate(frames)]
        eventually(lambda: pipeline_queued(d) == queued, "the frames queued", 8)
        gate.touch()
        return pipe.gather([first, *ids])


def pipeline_queued(d: Daemon) -> int:
    with d.admin() as admin:
        return admin.call("pipelines")["pipelines"][0]["queued"]


def test_a_pipeline_keeps_the_newest_frame_of_each_camera(make_daemon, tmp_path: Path):
    gate = tmp_path / "open"
    d = make_daemon(gated_pipeline(gate, "newest_per_key"))
    replies = send_frames(d, gate, [("cam1", 10), ("cam2", 20), ("cam1", 30), (None, 40), ("cam1", 50)],
                           queued=3)
    first, c1a, c2, c1b, unkeyed, c1c = replies
    assert [r.status for r in replies] == [200, 409, 200, 409, 200, 200], [r.header for r in replies]
    assert (c1a.superseded_by, c1b.superseded_by) == (c1b.header["id"], c1c.header["id"])
    assert c1a.model == "cams" and "version" not in c1a.header
    assert "superseded by a newer request of key 'cam1'" in c1a.error
    with d.admin() as admin:
        frames = admin.call("pipelines")["pipelines"][0]["frames"]
    assert frames["by_status"] == {"200": 4, "409": 2} and frames["error_qps"] == 0, frames
    # `ctl pipelines` and `status`: the superseded frames in the 409 column, none in ERR.
    for argv in (["ctl", "pipelines"], ["status"]):
        out = cli(d, *argv).splitlines()
        head = next(line.split() for line in out if line.startswith("PIPELINE/STEP"))
        row = dict(zip(head, next(line.split() for line in out if line.startswith("cams "))))
        assert (row["RUNS"], row["409"], row["ERR"]) == ("4", "2", "0"), out
    assert "model classifier" in cli(d, "ctl", "pipelines")  # what each step runs
    assert json.loads(cli(d, "ctl", "pipelines", "--json"))["pipelines"][0]["frames"]["by_status"]["409"] == 2


def cli(d: Daemon, *argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "infermux", *argv, "-e", d.admin_endpoint],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stderr, proc.stdout + proc.stderr
    return proc.stdout


def test_a_fifo_pipeline_serves_every_frame(make_daemon, tmp_path: Path):
    gate = tmp_path / "open"
    d = make_daemon(gated_pipeline(gate, "fifo", max_queue=8))
    replies = send_frames(d, gate, [("cam1", 10), ("cam1", 30), ("cam1", 50)], queued=3)
    assert [r.status for r in replies] == [200, 200, 200, 200]


@pytest.mark.parametrize("policy", ["fifo", "newest_per_key"])
def test_a_full_pipeline_queue_makes_room_for_a_camera_holding_less_of_it(make_daemon, tmp_path: Path,
                                                                          policy: str):
    # max_queue 3, filled by cam1 (per_key_depth 3 under newest_per_key, so nothing is superseded):
    # cam2's frame takes the place of one of cam1's, which gets the 429; cam1's next frame finds
    # the queue full with cam1 still holding the most, and gets the 429 itself.
    gate = tmp_path / "open"
    d = make_daemon(gated_pipeline(gate, policy, max_queue=3, **({"per_key_depth": 3} if policy != "fifo" else {})))
    with d.pipeline(timeout_s=30) as pipe:
        def send(key: str, value: int) -> int:
            ident = next(ids)
            pipe._dealer.send(encode_frame("cams", frame(value), "bgr", width=64, height=48, id=ident, key=key))
            pipe.in_flight += 1
            return ident

        ids = iter(range(1, 100))
        held = send("held", 0)
        eventually(lambda: gate.with_suffix(".entered").exists(), "the first frame at the gate")
        sent = [send(key, value) for key, value in (("cam1", 10), ("cam1", 20), ("cam1", 30), ("cam2", 40),
                                                     ("cam1", 50))]
        eventually(lambda: pipeline_frames(d).get("429") == 2, "both refusals (the last frame read)", 8)
        gate.touch()
        replies = pipe.gather([held, *sent])
    statuses = [r.status for r in replies]
    pushed = 3 if policy == "fifo" else 1  # cam1's newest frame under fifo, its oldest under newest_per_key
    assert statuses == [200] + [429 if i == pushed else 200 for i in (1, 2, 3)] + [200, 429], \
        [r.header for r in replies]
    assert "key 'cam1' holds the most of it" in replies[pushed].error, replies[pushed].header
    assert replies[pushed].retry_after_ms >= 1 and "queue is full (3 frames" in replies[5].error
    with d.admin() as admin:
        cams = {s["key"]: s for s in admin.call("streams", model="cams")["streams"]}
    assert (cams["cam1"]["received"], cams["cam1"]["served"], cams["cam1"]["refused"]) == (4, 2, 2)
    assert (cams["cam2"]["received"], cams["cam2"]["served"]) == (1, 1)


def pipeline_frames(d: Daemon) -> dict[str, int]:
    with d.admin() as admin:
        return admin.call("pipelines")["pipelines"][0]["frames"]["by_status"]


def test_equal_rate_keys_are_served_equally_at_a_full_fifo_queue(make_daemon):
    # Six keys send open loop at the same rate, together about twice what the model serves, into a
    # queue that fills. Served in strict turns, each key gets its sixth of the service; when the
    # shortest backlog was served first, some keys got most of their frames through and others few.
    d = make_daemon(slow("fifo", max_queue=24))
    keys = [f"cam{i}" for i in range(6)]
    x = LONG[:25]
    with d.client() as client:  # one compute's time, for the rate
        service_s = min(client.infer("slow", {"x": x}).header["timing_us"]["compute"] for _ in range(5)) / 1e6
    period_s = service_s / 2.5  # one request per period, keys in turn: 2.5x what one context computes
    sent = dict.fromkeys(keys, 0)
    served = dict.fromkeys(keys, 0)
    ids: dict[int, str] = {}

    def take(reply: Reply) -> None:
        assert reply.status in (200, 429), reply.header
        if reply.status == 200:
            served[ids[reply.header["id"]]] += 1

    with d.pipeline(timeout_s=60) as pipe:
        socket = pipe._dealer.socket
        deadline = time.perf_counter() + 4.0
        tick = time.perf_counter()
        n = 0
        while time.perf_counter() < deadline:
            key = keys[n % 6]
            ids[pipe.submit("slow", {"x": x}, key=key, timeout_ms=60_000)] = key
            sent[key] += 1
            n += 1
            tick += period_s
            while socket.poll(max(0, int((tick - time.perf_counter()) * 1000))):  # read while waiting
                take(pipe.next_reply())
        for reply in pipe.replies():
            take(reply)
    mean = sum(served.values()) / len(keys)
    assert sum(served.values()) < sum(sent.values()) * 0.8, (served, sent)  # the queue was full: keys competed
    assert all(abs(n - mean) <= 0.3 * mean for n in served.values()), (served, sent)


@pytest.mark.parametrize("mode", ["inproc", "multiproc"])
def test_admin_set_switches_the_policy_live_in_the_daemon_and_in_a_worker(make_daemon, mode: str):
    d = make_daemon(slow("fifo", mode=f'"{mode}"', preload="true"))
    with d.admin() as admin:
        done = admin.call("set", model="slow", queue_policy="newest_per_key", per_key_depth=2)
        assert done["set"] == {"queue_policy": "newest_per_key", "per_key_depth": 2}
        assert "'queue_policy' must be one of" in admin.call("set", model="slow", queue_policy="lifo",
                                                             check=False)["error"]
    replies = behind_a_long_compute(d, *[("cam1", ROW) for _ in range(3)])
    assert [r.status for r in replies] == [409, 200, 200], [r.header for r in replies]
