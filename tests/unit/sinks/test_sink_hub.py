"""The sinks' hub: events to each sink's spool, delivered by its thread; a sink that cannot start stays out."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from support.polling import eventually
from support.sinks import valid

from infermux.events import EventLog
from infermux.pipelines.lifecycle import IDS
from infermux.config import SinkConfig
from infermux.sinks.hub import Hub


def event(key: str, n: int) -> dict:
    return valid({"id": IDS.new(), "type": "new", "time": 1.0, "pipeline": "p", "key": key, "track_id": n,
                  "label": None, "score": 0.9, "box": [[0, 0], [1, 0], [1, 1], [0, 1]], "first_seen": 1.0,
                  "last_seen": 1.0, "frames": 1, "zones": [], "captured": False})


def test_a_sink_takes_only_the_pipelines_it_names_and_writes_them_in_order(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sinks = (SinkConfig("all", "jsonl", {"path": str(out / "all.jsonl")}),
             SinkConfig("some", "jsonl", {"path": str(out / "some.jsonl")}, pipelines=("q",)))
    hub = Hub(sinks, tmp_path / "state", EventLog())
    sent = [event("cam", i + 1) for i in range(50)]
    for i, one in enumerate(sent):
        hub.publish("q" if i % 2 else "p", one)
    lines = lambda name: (out / name).read_text().splitlines() if (out / name).exists() else []  # noqa: E731
    eventually(lambda: len(lines("all.jsonl")) == 50 and len(lines("some.jsonl")) == 25, "both files written")
    assert [json.loads(line)["id"] for line in lines("all.jsonl")] == [e["id"] for e in sent]
    assert [json.loads(line)["id"] for line in lines("some.jsonl")] == [e["id"] for e in sent[1::2]]
    # The file is written before the sink's thread counts what it acknowledged: wait for the count.
    view = eventually(lambda: (lambda v: v if (v["all"]["delivered"], v["some"]["delivered"]) == (50, 25) else None)(
        {s["name"]: s for s in hub.view()}), "the deliveries counted")
    assert view["all"]["state"] == "up" and view["all"]["backlog"] == view["some"]["backlog"] == 0
    hub.stop()


def test_events_published_from_several_threads_reach_every_sink_in_one_order(tmp_path: Path) -> None:
    """A stream's events come from its pipeline's threads and from the thread that ends unseen objects:
    whatever the interleaving, each sink gets them in the same order (the order "in order" means)."""
    out = tmp_path / "out"
    hub = Hub(tuple(SinkConfig(n, "jsonl", {"path": str(out / f"{n}.jsonl")}) for n in ("a", "b", "c")),
              tmp_path / "state", EventLog())
    batches = [[event("cam", t * 1000 + i + 1) for i in range(400)] for t in range(4)]
    threads = [threading.Thread(target=lambda b=b: [hub.publish("p", e) for e in b]) for b in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = lambda name: [json.loads(line)["id"] for line in (out / name).read_text().splitlines()]  # noqa: E731
    eventually(lambda: all((out / f"{n}.jsonl").exists() and len(ids(f"{n}.jsonl")) == 1600 for n in "abc"),
               "every sink's file written")
    assert ids("a.jsonl") == ids("b.jsonl") == ids("c.jsonl")
    hub.stop()


def test_a_sink_whose_spool_cannot_be_made_stays_out_and_says_why(tmp_path: Path) -> None:
    blocked = tmp_path / "state"
    blocked.write_text("a file where the spools' folder should be")
    events = EventLog()
    hub = Hub((SinkConfig("files", "jsonl", {"path": str(tmp_path / "x.jsonl")}),), blocked, events)
    assert hub.view() == []
    (failed,) = events.recent(kinds=frozenset({"sink_failed"}))
    assert failed.detail["sink"] == "files" and "state_dir" in failed.detail["error"]
    hub.publish("p", event("cam", 1))  # nothing to append to: no error either
    hub.stop()


def test_the_syncer_makes_each_spools_cursor_durable_while_the_sinks_run(tmp_path: Path) -> None:
    hub = Hub((SinkConfig("files", "jsonl", {"path": str(tmp_path / "out.jsonl")}),), tmp_path / "state", EventLog())
    for i in range(20):
        hub.publish("p", event("cam", i + 1))
    segment = tmp_path / "state" / "files" / "1.seg"
    cursor = tmp_path / "state" / "files" / "cursor"
    # The cursor reaches the segment's end once the events were delivered and a sync ran, the hub still running.
    eventually(lambda: cursor.read_bytes()[8:16] == segment.stat().st_size.to_bytes(8, "little"),
               "the cursor synced past the delivered events")
    assert hub.view()[0]["delivered"] == 20
    hub.stop()


def test_a_pub_sink_that_is_up_gets_each_event_on_the_publishing_thread_in_order(tmp_path: Path) -> None:
    import zmq

    from support.harness import free_port

    bind = f"tcp://127.0.0.1:{free_port()}"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.connect(bind)
    hub = Hub((SinkConfig("pub", "zmq", {"bind": bind}),), tmp_path / "state", EventLog())
    try:
        runner = hub.runners["pub"]
        eventually(lambda: (hub.publish("p", event("probe", 1)), sub.poll(50))[1], "the subscriber connected")
        eventually(lambda: runner.state == "up", "the sink up")
        sub.recv_multipart()
        while sub.poll(200):  # the probes' other events
            sub.recv_multipart()
        sent, waited = [event("cam", i + 1) for i in range(200)], 0
        for one in sent:
            hub.publish("p", one)
            waited += runner.spool.backlog()[0]  # 0: delivered before publish returned
        # The sink's own thread delivers one only where it held the sink at that moment (its idle look).
        assert waited <= 10, f"{waited} of 200 events were left to the sink's thread"
        got = [json.loads(sub.recv_multipart()[1])["id"] for _ in sent]
        assert got == [e["id"] for e in sent]
    finally:
        hub.stop()
        sub.close(linger=0)
