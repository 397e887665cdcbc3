"""Per-stream accounting against a real daemon: admin `streams`, the `stream_silent` event and Prometheus.

Each test compares what the daemon counted per (model, key) with what the client saw: every reply's
status, counted per key here, must be the daemon's received/served/superseded/refused split.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections import Counter

import numpy as np
import pytest
import zmq

from infermux.client import Reply
from infermux.pipelines.wire import encode_frame
from support.harness import DAEMON_HEAD, free_port
from support.polling import eventually
from support.stats_stream import event_of, subscribed

RNG = np.random.default_rng(2)
ROW = RNG.random((1, 512), dtype=np.float32)
LONG = RNG.random((400, 512), dtype=np.float32)  # ~50 ms through the 48-layer model
KIND = {200: "served", 409: "superseded", 429: "refused", 503: "refused", 504: "refused"}


def head(**settings: object) -> str:
    return DAEMON_HEAD + "".join(f"{k} = {v}\n" for k, v in settings.items())


def slow(name: str = "slow", mode: str = "inproc", **settings: object) -> str:
    extra = "".join(f"{k} = {v}\n" for k, v in settings.items())
    return (f'[[models]]\nname = "{name}"\nengine = "slower/1/model.onnx"\nmode = "{mode}"\npreload = true\n'
            f'queue_policy = "newest_per_key"\ntimeout_ms = 20000\n{extra}')


def streams(d) -> dict[tuple[str, str], dict]:
    with d.admin() as admin:
        return {(s["model"], s["key"]): s for s in admin.call("streams")["streams"]}


def tally(sent: list[tuple[str, str | None]], replies: list[Reply]) -> dict[tuple[str, str], Counter]:
    """Per (model, key) sent: how many requests, and the replies by what they count as."""
    seen: dict[tuple[str, str], Counter] = {}
    for (model, key), reply in zip(sent, replies):
        if key is None:
            continue
        counts = seen.setdefault((model, key), Counter())
        counts["received"] += 1
        counts[KIND.get(reply.status, "failed")] += 1
    return seen


@pytest.mark.parametrize("mode", ["inproc", "multiproc"])
def test_each_stream_counts_what_became_of_its_requests(make_daemon, mode: str) -> None:
    d = make_daemon(slow(mode=mode, max_queue=2))
    plan: list[tuple[str, str | None, np.ndarray, int | None]] = [
        ("slow", None, LONG, None),  # computed first, while the rest queue
        *[("slow", "cam1", ROW, None) for _ in range(3)],  # two superseded, one served
        ("slow", "cam2", ROW, 5),  # late behind the long one: 504
        ("slow", "cam3", ROW, None), ("slow", "cam4", ROW, None),  # one of them finds the queue full
        ("slow", "cam1", np.ones((1, 7), np.float32), None),  # wrong shape: 400, "failed"
        ("ghost", "cam1", ROW, None),  # no such model: not a stream
    ]
    with d.pipeline(timeout_s=30) as pipe:
        ids = [pipe.submit(model, {"x": x}, key=key, timeout_ms=ms) for model, key, x, ms in plan]
        replies = pipe.gather(ids)
    seen = tally([(m, k) for m, k, _, _ in plan], replies)
    counted = streams(d)
    assert set(counted) == {k for k in seen if k[0] == "slow"}
    for name, counts in seen.items():
        if name[0] != "slow":
            continue
        view = counted[name]
        assert {k: view[k] for k in ("received", "served", "superseded", "refused", "failed")} == \
            {k: counts[k] for k in ("received", "served", "superseded", "refused", "failed")}, (name, view)
        assert view["received"] == view["served"] + view["superseded"] + view["refused"] + view["failed"]
    assert counted[("slow", "cam1")]["superseded"] >= 1 and counted[("slow", "cam1")]["failed"] == 1
    served = [r.header["timing_us"]["total"] / 1000 for (m, k, _, _), r in zip(plan, replies)
              if k == "cam1" and r.status == 200]
    age = counted[("slow", "cam1")]["age_ms"]  # receipt to reply: the reply's own total, and its sending
    assert served[0] - 0.5 <= age["p50"] <= served[0] + 50 and age["p99"] >= age["p50"]


def test_a_pipeline_s_streams_are_counted_as_the_pipeline_s(make_daemon) -> None:
    d = make_daemon('[[models]]\nname = "classifier"\nengine = "classifier/1/model.onnx"\n'
                    '[[pipelines]]\nname = "cams"\nqueue_policy = "newest_per_key"\n'
                    '[[pipelines.steps]]\nprocessor = "decode"\n'
                    '[[pipelines.steps]]\nprocessor = "resize"\noptions = {{ mode = "stretch", size = [64, 64] }}\n'
                    '[[pipelines.steps]]\nprocessor = "normalize"\n'
                    '[[pipelines.steps]]\nmodel = "classifier"\n')
    frame = np.zeros((48, 64, 3), np.uint8)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(d.endpoint)
    try:
        for i in range(6):
            sock.send_multipart([b"", *encode_frame("cams", frame, "bgr", width=64, height=48, id=i,
                                                    key=f"cam{i % 2}")])
        statuses = Counter()
        for _ in range(6):
            assert sock.poll(10_000)
            statuses[json.loads(sock.recv_multipart()[1])["status"]] += 1
    finally:
        sock.close(0)
    counted = streams(d)
    assert set(counted) == {("cams", "cam0"), ("cams", "cam1")}  # the classifier's steps carry no key
    assert sum(s["received"] for s in counted.values()) == 6
    assert sum(s["served"] for s in counted.values()) == statuses[200]
    assert sum(s["superseded"] for s in counted.values()) == statuses[409]


def test_a_stream_that_stops_sending_raises_an_event_and_shows_silent(make_daemon) -> None:
    d = make_daemon('[[models]]\nname = "fast"\nengine = "fast512/1/model.onnx"\n',
                    head=head(stream_silent_s=0.5))
    stats = subscribed(d)
    try:
        with d.client() as client:
            for _ in range(3):
                assert client.infer("fast", {"x": ROW}, key="gate-3").status == 200
            assert client.infer("fast", {"x": ROW}, key="one-off").status == 200  # one request: not a stream
            event = eventually(lambda: event_of(stats, "stream_silent"), "a stream_silent event")
            assert (event["model"], event["key"]) == ("fast", "gate-3") and event["silent_s"] >= 0.5
            views = streams(d)
            assert views[("fast", "gate-3")]["silent"] and not views[("fast", "one-off")]["silent"]
            assert views[("fast", "gate-3")]["last_seen_s"] >= 0.5
            assert client.infer("fast", {"x": ROW}, key="gate-3").status == 200
        assert not streams(d)[("fast", "gate-3")]["silent"]
        with d.admin() as admin:
            kinds = [(e["kind"], e.get("key")) for e in admin.call("events")["events"] if e["kind"].startswith("stream")]
        assert kinds == [("stream_silent", "gate-3"), ("stream_resumed", "gate-3")]
        assert "stream_silent model=fast key=gate-3" in d.log()
    finally:
        stats.close(0)


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("infermux_stream")}


def test_prometheus_names_the_busiest_keys_and_bounds_what_it_tracks(make_daemon) -> None:
    port = free_port()
    d = make_daemon('[[models]]\nname = "fast"\nengine = "fast512/1/model.onnx"\n',
                    head=head(metrics_port=port, stream_metrics_keys=2, stream_max_keys=8))
    with d.client() as client:
        for key, n in (("a", 6), ("b", 5), ("c", 2)):
            for _ in range(n):
                client.infer("fast", {"x": ROW}, key=key)
        first = scrape(port)
        for i in range(40):  # forty more cameras, one request each: only 8 streams are tracked, and the
            client.infer("fast", {"x": ROW}, key=f"extra{i}")  # least recently seen are forgotten (not a, b)
            for key in ("a", "b"):
                client.infer("fast", {"x": ROW}, key=key)
    second = scrape(port)
    named = lambda key: f'infermux_stream_requests_total{{model="fast",key="{key}"}}'  # noqa: E731
    assert (first[named("a")], first[named("b")], first[named("other")]) == (6, 5, 2)
    assert (second[named("a")], second[named("b")], second[named("other")]) == (46, 45, 42)
    keys = {k.split('key="')[1].split('"')[0] for k in second if 'key="' in k}
    assert keys == {"a", "b", "other"}  # bounded, whatever the clients send
    assert second['infermux_streams{model="fast"}'] == 8
    assert second['infermux_stream_served_total{model="fast",key="other"}'] == 42
    assert second['infermux_stream_age_seconds_count{model="fast",key="a"}'] == 46
    with d.admin() as admin:
        reply = admin.call("streams")
    assert reply["tracked"] == 8 and reply["max_keys"] == 8 and len(reply["streams"]) == 8


def test_ctl_streams_prints_a_line_per_stream(make_daemon) -> None:
    d = make_daemon('[[models]]\nname = "fast"\nengine = "fast512/1/model.onnx"\n')
    with d.client() as client:
        for key in ("gate-1", "gate-1", "dock-2"):
            client.infer("fast", {"x": ROW}, key=key)
    proc = subprocess.run([sys.executable, "-m", "infermux", "ctl", "streams", "-e", d.admin_endpoint],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    head, dock, gate, tail = proc.stdout.splitlines()
    assert head.split()[:4] == ["MODEL/KEY", "RECEIVED", "SERVED", "409"]
    assert dock.split()[:6] == ["fast/dock-2", "1", "1", "0", "0", "0"]
    assert gate.split()[:3] == ["fast/gate-1", "2", "2"] and "s ago" in gate
    assert tail == "2 streams tracked (at most 1024)"
