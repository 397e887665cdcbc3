"""Tracked objects' events on a real daemon, out through real sinks: a file, a PUB socket, HTTP endpoints.

One daemon serves a detector pipeline with a `track` step and `events`
(tests/support/tracking.py's generated sequences, drawn and sent as PNG),
and a plain classifier. Its sinks: `jsonl` into the test's folder, `zmq`
(with each frame's result) to a subscriber of the test's, a webhook whose
endpoint answers 500 twice before 200, and a webhook that never answers
with a spool of 5 events. Every event seen is checked against the shipped
JSON Schema. The expected events are worked out from the replies' track
ids and scores, by the rules docs/events.md states.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import zmq

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models, tracking  # noqa: E402
from support.harness import Daemon, dealer, free_port  # noqa: E402
from support.metrics import scrape  # noqa: E402
from support.sinks import (Endpoint, by_track, events_daemon, jsonl, jsonl_events, publisher,  # noqa: E402
                           sink_states, valid, waiting, webhook)
from support.tracking import Replay, detecting, replay  # noqa: E402

MIN_FRAMES, MIN_SCORE, GAIN, END_AFTER_S = 3, 0.5, 0.02, 3.0


def config_text(workdir: Path, pub: str, hook: str, stuck: str, metrics_port: int) -> str:
    pipeline = detecting("tracked", min_frames=MIN_FRAMES, min_score=MIN_SCORE, min_score_gain=GAIN,
                         end_after_s=END_AFTER_S, update_every_s=0.0)
    return events_daemon(workdir / "engines", pipeline, jsonl(workdir / "out" / "events.jsonl"), publisher(pub),
                         webhook("hook", hook, timeout_s=5, max_retry_s=0.2),
                         webhook("stuck", stuck, timeout_s=0.5, max_events=5), classifier=True,
                         metrics_port=metrics_port)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("object_events")
    models.brightness_map(workdir / "engines" / "det" / "1" / "model.onnx")
    hook, stuck = Endpoint([500, 500, 200]), Endpoint([None])
    pub, port = f"tcp://127.0.0.1:{free_port()}", free_port()
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(pub)  # before the daemon binds: ZeroMQ connects once it does, and no event is missed
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    d = Daemon(workdir, config_text(workdir, pub, hook.url, stuck.url, port)).start()
    assert monitor.poll(30_000), "the subscriber never reached the daemon's PUB socket"
    sub.disable_monitor()
    monitor.close(linger=0)
    seq = tracking.crossing()
    with dealer(d.endpoint) as sock:
        sent = replay(sock, "tracked", seq, "cam-a")
    yield {"daemon": d, "sub": sub, "hook": hook, "stuck": stuck, "replay": sent, "seq": seq, "workdir": workdir,
           "metrics_port": port}
    sub.close(linger=0)
    assert d.stop() == 0, d.log()[-4000:]
    hook.close()
    stuck.close()
    assert "Traceback" not in d.log(), d.log()[-6000:]


def expected(sent: Replay) -> dict[tuple[str, int], list[str]]:
    """Each track's events by docs/events.md's rules, from what the replies said: `new` on its
    MIN_FRAMES-th frame scoring MIN_SCORE or more, an `update` on each frame whose best score
    rose GAIN over the last event's (update_every_s = 0), and its `end`."""
    out: dict[tuple[str, int], list[str]] = {}
    state: dict[int, tuple[int, float, float]] = {}  # track -> hits, best, best at the last event
    for header in sent.headers:
        for region in header["regions"]:
            hits, best, told = state.get(region["track_id"], (0, 0.0, 0.0))
            if region["score"] >= MIN_SCORE:
                hits, best = hits + 1, max(best, region["score"])
            events = out.setdefault(("cam-a", region["track_id"]), [])
            if not events and hits >= MIN_FRAMES:
                events.append("new")
                told = best
            elif events and best >= told + GAIN - 1e-6:
                events.append("update")
                told = best
            state[region["track_id"]] = (hits, best, told)
    return {track: events + ["end"] for track, events in out.items() if events}


def file_events(workdir: Path) -> list[dict[str, Any]]:
    return jsonl_events(workdir / "out" / "events.jsonl")


def all_events(setup: dict[str, Any]) -> list[dict[str, Any]]:
    """The jsonl file's events once every object of the first replay has ended."""
    ends = len(expected(setup["replay"]))
    return waiting(lambda: (lambda e: e if sum(x["type"] == "end" for x in e) >= ends else None)(
        file_events(setup["workdir"])), "every object's end in the jsonl file", timeout_s=60)


def test_each_tracked_object_makes_exactly_its_new_updates_and_end(setup: dict[str, Any]) -> None:
    sent: Replay = setup["replay"]
    assert set(sent.statuses) == {200}, sent.statuses
    want = expected(sent)
    got = all_events(setup)
    assert by_track(got) == want
    assert len({e["id"] for e in got}) == len(got)
    assert len(want) == len(setup["seq"].things), "the crossing's objects are one track each"
    for event in got:
        assert event["pipeline"] == "tracked" and event["captured"] is False and event["zones"] == []
        assert event["first_seen"] <= event["last_seen"] <= event["time"]


def test_the_pub_socket_publishes_each_event_on_its_key_and_type_and_each_result(setup: dict[str, Any]) -> None:
    file = all_events(setup)
    topics: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + 60
    while sum(len(v) for k, v in topics.items() if not k.endswith("/result")) < len(file):
        assert time.monotonic() < deadline, {k: len(v) for k, v in topics.items()}
        topic, data = setup["sub"].recv_multipart()
        topics.setdefault(topic.decode(), []).append(json.loads(data))
    assert {t for t in topics if not t.endswith("/result")} == {f"cam-a/{e['type']}" for e in file}
    published = [e for t, events in topics.items() if not t.endswith("/result") for e in events]
    assert sorted(valid(e)["id"] for e in published) == sorted(e["id"] for e in file)
    results = topics.get("cam-a/result", [])
    assert len(results) == len(setup["replay"].headers)
    assert all(r["pipeline"] == "tracked" and r["key"] == "cam-a" and "regions" in r for r in results)


def test_a_webhook_answering_500_gets_every_event_after_its_retries(setup: dict[str, Any]) -> None:
    file = all_events(setup)
    hook: Endpoint = setup["hook"]
    waiting(lambda: len(hook.bodies) >= len(file), "the webhook's deliveries", timeout_s=60)
    assert [e["id"] for e in hook.bodies[:len(file)]] == [e["id"] for e in file]  # in order, once each
    assert hook.posts >= len(file) + 2  # the two 500s were retried
    # counted once the answer is back: after the endpoint kept the body
    hooked = waiting(lambda: (lambda s: s if s["delivered"] >= len(file) else None)(
        sink_states(setup["daemon"])["hook"]), "the webhook's deliveries counted")
    assert hooked["state"] == "up"


def test_a_webhook_that_never_answers_fills_its_spool_and_no_client_waits_for_it(setup: dict[str, Any]) -> None:
    d: Daemon = setup["daemon"]
    stuck = waiting(lambda: (lambda s: s if s["dropped"] > 0 and s["state"] == "down" else None)(
        sink_states(d)["stuck"]), "the stuck sink's spool to overflow")
    assert stuck["backlog"] == 5 and stuck["oldest_age_s"] is not None and "timed out" in stuck["last_error"]
    # More frames make more events for the stuck spool, which drops its oldest; clients are answered as ever.
    started = time.monotonic()
    with dealer(d.endpoint) as sock:
        again = replay(sock, "tracked", tracking.stop_and_go(), "cam-b", frames=20)
    with d.client() as client:
        replies = [client.infer("classifier", {"images": np.zeros((1, 3, 64, 64), np.float32)}) for _ in range(20)]
    assert set(again.statuses) == {200} and {r.status for r in replies} == {200}
    assert time.monotonic() - started < 30  # not one 0.5 s webhook timeout per frame
    with d.admin() as admin:  # said by the sink's thread between two tries (each up to its timeout)
        events = waiting(lambda: admin.call("events", kind="sink_dropped")["events"], "a sink_dropped event")
    assert events[0]["sink"] == "stuck" and events[0]["dropped"] > 0, events


def test_ctl_sinks_and_prometheus_show_each_sink(setup: dict[str, Any]) -> None:
    d: Daemon = setup["daemon"]
    shown = subprocess.run([sys.executable, "-m", "infermux", "ctl", "sinks", "--config", str(d.config_path),
                            "--runtime-dir", str(d.run_dir)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[0]: line.split() for line in shown.stdout.splitlines()[1:] if not line.startswith(" ")}
    assert lines["hook"][2] == "up" and lines["stuck"][2] == "down" and lines["stuck"][3] == "5", shown.stdout
    assert "last error:" in shown.stdout
    samples = scrape(setup["metrics_port"])
    assert samples['infermux_sink_up{sink="hook",kind="webhook"}'] == 1
    assert samples['infermux_sink_up{sink="stuck",kind="webhook"}'] == 0
    assert samples['infermux_sink_backlog_events{sink="stuck",kind="webhook"}'] == 5
    assert samples['infermux_sink_dropped_total{sink="stuck",kind="webhook"}'] > 0
    assert samples['infermux_pipeline_events_total{pipeline="tracked",type="new"}'] >= 2


def test_a_reload_that_changes_one_sink_leaves_the_others_and_its_spool(setup: dict[str, Any]) -> None:
    d: Daemon = setup["daemon"]
    with d.admin() as admin:
        before = {s["name"]: s for s in admin.call("sinks")["sinks"]}
        text = d.config_path.read_text().replace("max_retry_s = 0.1\n", "max_retry_s = 0.2\n")
        assert text != d.config_path.read_text()
        d.config_path.write_text(text)
        reloaded = time.time()
        admin.call("reload", check=True)
        after = {s["name"]: s for s in admin.call("sinks")["sinks"]}
        changed = [e for e in admin.call("events", limit=1000)["events"] if e["kind"] in ("sink_added", "sink_removed", "sink_changed") and e["time"] >= reloaded]
    assert [(e["kind"], e["sink"]) for e in changed] == [("sink_changed", "stuck")]
    for name in ("files", "pub", "hook"):  # the same runner: its counts went on, not from zero
        assert after[name]["delivered"] >= before[name]["delivered"] and after[name]["state"] == "up", name
    assert after["stuck"]["backlog"] == 5  # its successor took its spool
    made = len(file_events(setup["workdir"]))
    with dealer(d.endpoint) as sock:
        assert set(replay(sock, "tracked", tracking.crossing(), "cam-c", frames=12).statuses) == {200}
    waiting(lambda: len(file_events(setup["workdir"])) > made, "events after the reload in the file")


def test_the_stats_stream_carries_the_sinks_for_the_console(setup: dict[str, Any]) -> None:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"snapshot")
    sub.connect(setup["daemon"].stats_endpoint)
    try:
        assert sub.poll(20_000), "no snapshot on the stats stream"
        snapshot = json.loads(sub.recv_multipart()[1])
    finally:
        sub.close()
    sinks = {s["name"]: s for s in snapshot["sinks"]}
    assert set(sinks) == {"files", "pub", "hook", "stuck"} and sinks["hook"]["state"] == "up"
    assert sinks["stuck"]["backlog"] == 5
