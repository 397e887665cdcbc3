"""Zones and lines on a real daemon: a generated walk (tests/support/tracking.py `through_zone`) sent as
camera `yard`'s frames through a detector pipeline with a `track` step; its events out through a
`jsonl` file and a real Mosquitto, its counts in `ctl cameras`, /metrics and MQTT's retained topics.
The walk, its zones and lines and the events it makes: tests/support/zones.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")
pytest.importorskip("paho.mqtt", reason="the mqtt sink needs paho-mqtt 2.x: pip install -e '.[mqtt]'")

from support import models, tracking  # noqa: E402
from support.harness import Daemon, dealer, free_port  # noqa: E402
from support.metrics import scrape  # noqa: E402
from support.sinks import (Mosquitto, Subscriber, events_daemon, jsonl, mqtt, sink_states,  # noqa: E402
                           until_ended, waiting)
from support.tracking import detecting, replay  # noqa: E402
from support.zones import EVENTS, LINES_AFTER, WALKS_DOWN, WALKS_UP, ZONES_AFTER, camera, moves  # noqa: E402

from infermux.cameras.table import table  # noqa: E402


def config_text(workdir: Path, broker: int, metrics_port: int) -> str:
    # Its frames are the test's, sent with its name as their key: `enabled = false`, it reads nothing.
    yard = camera("yard", "yard.mp4", "tracked", enabled="false")
    return events_daemon(workdir / "engines", detecting("tracked", **EVENTS), jsonl(workdir / "out" / "events.jsonl"),
                         mqtt(broker), more=yard, metrics_port=metrics_port)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("zone_events")
    models.brightness_map(workdir / "engines" / "det" / "1" / "model.onnx")
    broker = Mosquitto(workdir / "mosquitto").start()
    port = free_port()
    d = Daemon(workdir, config_text(workdir, broker.port, port)).start()
    with dealer(d.endpoint) as sock:
        sent = replay(sock, "tracked", tracking.through_zone(), "yard")
    yield {"daemon": d, "broker": broker, "replay": sent, "workdir": workdir, "metrics_port": port}
    assert d.stop() == 0, d.log()[-4000:]
    broker.stop()
    assert "Traceback" not in d.log(), d.log()[-6000:]


def ended(setup: dict[str, Any]) -> list[dict[str, Any]]:
    return until_ended(setup["workdir"] / "out" / "events.jsonl", 2)


def test_each_object_makes_exactly_the_zone_and_line_events_its_walk_implies(setup: dict[str, Any]) -> None:
    assert set(setup["replay"].statuses) == {200}, setup["replay"].statuses
    got = ended(setup)
    by_track = moves(got)
    assert sorted(by_track.values()) == sorted([WALKS_DOWN, WALKS_UP]), by_track
    down = next(e for e in got if e["type"] == "enter")
    assert down["zones"] == ["yard"] and down["key"] == "yard" and down["counted"] == "none"
    last = [e for e in got if e["track_id"] == down["track_id"]][-1]
    assert last["type"] == "end" and last["zones"] == ["yard"]  # it ended where it stood


def test_the_counts_are_in_ctl_cameras_and_in_prometheus(setup: dict[str, Any]) -> None:
    ended(setup)
    with setup["daemon"].admin() as admin:
        entry = waiting(lambda: (lambda c: c if c.get("zones") == ZONES_AFTER else None)(
            admin.call("cameras")["cameras"][0]), "the yard's count back to 0")
    assert entry["lines"] == LINES_AFTER
    assert "  line gate: in none 1 / out none 1" in table([entry]).splitlines()
    samples = scrape(setup["metrics_port"])
    assert samples['infermux_line_crossings_total{camera="yard",line="gate",direction="in",label="none"}'] == 1
    assert samples['infermux_line_crossings_total{camera="yard",line="short",direction="out",label="none"}'] == 1
    assert samples['infermux_zone_objects{camera="yard",zone="yard",label="none"}'] == 0


def test_mqtt_has_the_events_and_the_counts_retained(setup: dict[str, Any]) -> None:
    got = ended(setup)
    late = Subscriber(setup["broker"].port, "infermux/yard/#")  # after the events: only what is retained
    try:
        retained = waiting(lambda: (lambda m: m if len(m) >= 4 else None)(
            {t: p for t, p, _ in list(late.messages) if "/events" not in t}), "the retained counts")
    finally:
        late.close()
    assert retained == {"infermux/yard/zones/yard/none": b"0", "infermux/yard/lines/gate/in/none": b"1",
                        "infermux/yard/lines/gate/out/none": b"1", "infermux/yard/lines/short/out/none": b"1"}
    assert got  # (the events themselves came through the broker: the sink delivered them, acknowledged)
    broker = waiting(lambda: (lambda s: s if s["delivered"] >= len(got) else None)(
        sink_states(setup["daemon"])["broker"]), "the mqtt sink's deliveries")
    assert broker["state"] == "up" and broker["dropped"] == 0


def test_a_reload_changes_the_zones_and_lines_and_keeps_the_counts_of_those_that_stay(setup: dict[str, Any]) -> None:
    ended(setup)
    d: Daemon = setup["daemon"]
    text = d.config_path.read_text()
    changed = text.replace('name = "yard"\npoints', 'name = "porch"\npoints', 1)
    changed = changed[:changed.index('[[cameras.lines]]\nname = "short"')] + changed[changed.index("[[sinks]]"):]
    assert changed.count("[[cameras.lines]]") == 1 and 'name = "porch"' in changed
    d.config_path.write_text(changed)
    with d.admin() as admin:
        admin.call("reload")
        entry = admin.call("cameras")["cameras"][0]
    assert entry["zones"] == {"porch": {}}
    assert entry["lines"] == {"gate": LINES_AFTER["gate"]}  # counted since the daemon started, kept
