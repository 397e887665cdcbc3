"""The issue's outage through the whole daemon: four cameras' streams making about 50 events a second,
the broker (a real Mosquitto) stopped for 60 s and the daemon restarted halfway through it; once both
are back, every event the daemon made reaches a subscriber, in order per camera, none lost, a repeat
only with its id.

The events are the tracked objects' own (tests/support/senders.py: the tracking sequences' frames
looped per key at a steady frame rate); the daemon's `jsonl` sink writes each one as it is made, the
reference of what must arrive. The subscriber's session is kept by the broker (persistence on,
clean_session off, no bound on the messages queued for it), so what is published while it reconnects
waits for it. test_mqtt_sink.py does the same in a few seconds; this is the minute-long one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")
pytest.importorskip("paho.mqtt", reason="the mqtt sink needs paho-mqtt: pip install -e '.[mqtt]'")

from support import models  # noqa: E402
from support.harness import Daemon  # noqa: E402
from support.senders import Senders, segments  # noqa: E402
from support.sinks import (Mosquitto, Subscriber, arrived_in_order, events_daemon, jsonl, jsonl_events,  # noqa: E402
                           mqtt, sink_states, waiting)
from support.tracking import detecting  # noqa: E402

pytestmark = pytest.mark.timing  # the event rate is the frames' rate on a box shared with others

KEYS = ["cam-0", "cam-1", "cam-2", "cam-3"]
FPS = 7.0  # per camera: about 55 events/s from the four (min_score_gain 0, an update at most every 0.6 s)
RATE = 50.0  # events/s the daemon must make while the cameras send
OUTAGE_S, AROUND_S = 60.0, 4.0


def config_text(workdir: Path, port: int) -> str:
    pipeline = detecting("tracked", min_frames=2, end_after_s=0.5, update_every_s=0.6, min_score_gain=0.0)
    return events_daemon(workdir / "engines", pipeline, jsonl(workdir / "events.jsonl", name="reference", max_mb=1024),
                         mqtt(port, retry_s=0.1, max_retry_s=1.0, ack_timeout_s=5, keepalive_s=5))


def send(d: Daemon, frames: list[bytes], seconds: float) -> tuple[int, float]:
    """The four cameras' frames for `seconds`: (frames sent, seconds they took)."""
    started = time.monotonic()
    senders = Senders(d.endpoint, "tracked", KEYS, frames, FPS)
    time.sleep(seconds)  # the senders pace themselves: this is how long the cameras stream, not a wait for them
    senders.stop()
    assert not senders.failures, senders.failures[:5]
    return senders.sent, time.monotonic() - started


def test_a_minute_long_broker_outage_with_a_daemon_restart_loses_no_event(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "broker", persistent=True).start()
    models.brightness_map(tmp_path / "engines" / "det" / "1" / "model.onnx")
    sub = Subscriber(broker.port, "infermux/#").connected()
    d = Daemon(tmp_path, config_text(tmp_path, broker.port)).start()
    frames = segments(12)
    try:
        streamed = [send(d, frames, AROUND_S)]
        waiting(lambda: len(sub.events()) > 0, "events at the subscriber before the outage")
        broker.stop()
        down = time.monotonic()
        streamed.append(send(d, frames, OUTAGE_S / 2))
        waiting(lambda: (lambda s: s["state"] == "down" and s["backlog"] > 0)(sink_states(d)["broker"]),
                "the broker sink down with events waiting")
        assert d.stop() == 0, d.log()[-4000:]  # the daemon restarts while the broker is away: what waits is on disk
        d.start()
        assert sink_states(d)["broker"]["backlog"] > 0, "the restarted daemon lost its spool"
        streamed.append(send(d, frames, max(1.0, OUTAGE_S - (time.monotonic() - down))))
        broker.start()
        outage_s = time.monotonic() - down
        streamed.append(send(d, frames, AROUND_S))
        waiting(lambda: all(s["backlog"] == 0 and s["state"] == "up" for s in sink_states(d).values())
                and not [p for p in admin_pipelines(d) if p["events"]["objects"]], "every object ended, delivered",
                timeout_s=60)
        made = jsonl_events(tmp_path / "events.jsonl")
        waiting(lambda: {e["id"] for e in sub.events()} >= {e["id"] for e in made}, "every event at the subscriber",
                timeout_s=60)
        got = sub.events()
    finally:
        sub.close()
        stopped = d.stop()
        broker.stop()
    assert stopped == 0 and "Traceback" not in d.log(), d.log()[-6000:]
    rate = len(made) / sum(seconds for _, seconds in streamed)
    figures = f"{len(made)} events, {rate:.0f}/s made, the broker away {outage_s:.0f} s, {len(got)} received"
    print(figures)  # with -s: RESULTS.md quotes it
    assert outage_s >= OUTAGE_S and rate >= RATE, figures
    arrived_in_order(made, got, KEYS)


def admin_pipelines(d: Daemon) -> list[dict[str, Any]]:
    with d.admin() as admin:
        return list(admin.call("pipelines")["pipelines"])
