"""The mqtt sink against a real Mosquitto: QoS 1 events, and none lost through a broker outage and a restart.

The broker (Debian's `mosquitto`, on a free port, persistence on so that the
test's subscriber keeps its session across the broker's restart) is
stopped while cameras send; the daemon is restarted during the outage; then
the broker comes back. Every event the daemon made (its `jsonl` sink writes
each one, as the reference) must reach the subscriber, in order per camera,
with repeats only of the same id. The outage is a few seconds here; the
minute-long one at 50 events/s is test_mqtt_outage.py's (the hub's alone:
bench_events.py --outage).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")
pytest.importorskip("paho.mqtt", reason="the mqtt sink needs paho-mqtt: pip install -e '.[mqtt]'")

from support import models, tracking  # noqa: E402
from support.harness import Daemon, dealer  # noqa: E402
from support.sinks import (Mosquitto, Subscriber, arrived_in_order, events_daemon, jsonl, jsonl_events,  # noqa: E402
                           mqtt, sink_states, waiting)
from support.tracking import detecting, replay  # noqa: E402


def config_text(workdir: Path, port: int) -> str:
    pipeline = detecting("tracked", min_frames=2, end_after_s=1.0, update_every_s=0.2)
    return events_daemon(workdir / "engines", pipeline, jsonl(workdir / "events.jsonl", name="reference"),
                         mqtt(port, retry_s=0.1, max_retry_s=0.5, ack_timeout_s=2, keepalive_s=5))


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("mqtt_sink")
    broker = Mosquitto(workdir / "broker", persistent=True).start()
    models.brightness_map(workdir / "engines" / "det" / "1" / "model.onnx")
    sub = Subscriber(broker.port, "infermux/#").connected()
    d = Daemon(workdir, config_text(workdir, broker.port)).start()
    yield {"daemon": d, "broker": broker, "sub": sub, "workdir": workdir}
    sub.close()
    assert d.stop() == 0, d.log()[-4000:]
    broker.stop()
    assert "Traceback" not in d.log(), d.log()[-6000:]


def reference(workdir: Path) -> list[dict[str, Any]]:
    return jsonl_events(workdir / "events.jsonl")


def send(d: Daemon, key: str, seq: tracking.Sequence, frames: int) -> None:
    with dealer(d.endpoint) as sock:
        assert set(replay(sock, "tracked", seq, key, frames=frames).statuses) == {200}


def objects(d: Daemon) -> int:
    with d.admin() as admin:
        return next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "tracked")["events"]["objects"]


def test_events_reach_a_subscriber_at_qos_1_with_the_availability_topic(rig: dict[str, Any]) -> None:
    send(rig["daemon"], "cam-a", tracking.crossing(), 20)
    made = waiting(lambda: reference(rig["workdir"]), "events in the reference file")
    sub: Subscriber = rig["sub"]
    waiting(lambda: len(sub.events()) >= len(made), "the events at the subscriber")
    assert {qos for topic, _, qos in sub.messages if topic.endswith("/events")} == {1}
    assert {topic for topic, _, _ in sub.messages if topic.endswith("/events")} == {"infermux/cam-a/events"}
    # A key holding MQTT's wildcards and a level separator: escaped in the topic, as sent in the event.
    send(rig["daemon"], "gate #2/a+b", tracking.crossing(), 12)
    odd = waiting(lambda: [e for e in sub.events() if e["key"] == "gate #2/a+b"], "the odd key's events")
    assert {t for t, p, _ in sub.messages if t.endswith("/events") and json.loads(p)["key"] == "gate #2/a+b"} == \
        {"infermux/gate %232%2Fa%2Bb/events"}, odd
    assert ("infermux/available", b"online") in {(t, p) for t, p, _ in sub.messages}


def test_no_event_is_lost_through_a_broker_outage_and_a_daemon_restart(rig: dict[str, Any]) -> None:
    d, broker, sub, workdir = rig["daemon"], rig["broker"], rig["sub"], rig["workdir"]
    broker.stop()
    send(d, "cam-b", tracking.stop_and_go(), 25)
    send(d, "cam-c", tracking.pillar(), 25)
    waiting(lambda: (lambda s: s["state"] == "down" and s["backlog"] > 0)(sink_states(d)["broker"]),
            "the broker sink down with events waiting")
    assert d.stop() == 0  # the daemon restarts while the broker is away: what waits is on disk
    d.start()
    assert sink_states(d)["broker"]["backlog"] > 0, "the restarted daemon lost its spool"
    send(d, "cam-b", tracking.stop_and_go(), 10)
    broker.start()
    waiting(lambda: objects(d) == 0, "every object ended (end_after_s)")  # no event is made after this
    done = waiting(lambda: (lambda s: s if all(x["backlog"] == 0 and x["state"] == "up" for x in s.values()) else None)(
        sink_states(d)), "both spools delivered", timeout_s=60)
    assert done["broker"]["delivered"] > 0
    made = reference(workdir)
    waiting(lambda: {e["id"] for e in sub.events()} >= {e["id"] for e in made}, "every event at the subscriber",
            timeout_s=60)
    arrived_in_order(made, sub.events(), ["cam-a", "cam-b", "cam-c"])
