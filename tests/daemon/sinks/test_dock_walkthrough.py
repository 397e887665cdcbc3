"""docs/events.md's "Try it" walk-through, run as written: its commands, in a folder laid out as a fresh
clone is. The suite stands in for two of its lines: its own environment for the install, and a
Mosquitto of the test's own on a free port for the one `apt install mosquitto` starts on 1883 (the
page's configuration and `mosquitto_sub` are pointed at that port; nothing else changes).

PP-OCR's text detector comes from rapidocr-onnxruntime's wheel (engines/fetch_ppocr.py), the clips
from examples/dock_clips.py. What the page promises: every camera's events reach the subscriber, a
parcel that crosses the scanner and stops in the bay makes `new`, `cross` (in), `enter` and the one
behind it `new`, `cross` and no `enter`; the counts come as retained topics; `ctl snapshot` writes the
frame with its boxes drawn, and each object's snapshot has its box drawn where the event says."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from support.drawn_boxes import green_share, jpeg
from support.polling import eventually
from support.sinks import Mosquitto, valid
from support import system_packages
from support.harness import REPO
from support.walkthrough import argv as local, block, clone_of

pytest.importorskip("rapidocr_onnxruntime", reason="the detector comes from rapidocr-onnxruntime")
pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[cameras]'")
pytest.importorskip("av", reason="the cameras need PyAV: pip install -e '.[cameras]'")
pytest.importorskip("paho.mqtt", reason="the mqtt sink needs paho-mqtt: pip install -e '.[mqtt]'")
pytestmark = pytest.mark.slow

CAMERAS = [f"dock-{n}" for n in range(1, 5)]
FILES = ("engines/fetch_ppocr.py", "examples/dock_clips.py", "etc/infermux/examples/dock.toml")


def argv(command: str, port: int) -> list[str]:
    """A page command as the suite runs it; `mosquitto_sub` asks the test's broker."""
    words = local(command)
    return words + ["-p", str(port)] if words[0] == "mosquitto_sub" else words


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    system_packages.require({"mosquitto_sub": "mosquitto-clients"})
    broker = Mosquitto(tmp_path / "broker").start()
    yield broker
    broker.stop()


def test_the_dock_walkthrough_runs_as_the_page_says(tmp_path: Path, broker: Mosquitto) -> None:
    apt, install, fetch, clips, serve, subscribe, snapshot = block(REPO / "docs/events.md", "## Try it")
    clone = clone_of(tmp_path / "clone", FILES)
    assert "mosquitto mosquitto-clients" in apt and "[onnx,tui,cameras,mqtt]" in install
    config = clone / "etc/infermux/examples/dock.toml"
    assert "port = 1883" in config.read_text()
    config.write_text(config.read_text().replace("port = 1883", f"port = {broker.port}"))
    # Where this box's defaults would be /run and ~/.local/state: another daemon of the suite may hold those.
    env = {**os.environ, "RUNTIME_DIRECTORY": str(clone / "run"), "STATE_DIRECTORY": str(clone / "state")}
    for step in (fetch, clips):
        done = subprocess.run(argv(step, broker.port), cwd=clone, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    events, topics = served_and_heard(clone, env, serve, subscribe, snapshot, broker.port)
    for camera in CAMERAS:
        lives = lifecycles([e for e in events if e["key"] == camera])
        assert ["new", "cross:scanner:in", "enter:bay"] in [life[:3] for life in lives], (camera, lives)
        assert any(life[:2] == ["new", "cross:scanner:in"] and "enter:bay" not in life for life in lives), lives
        assert f"infermux/{camera}/lines/scanner/in/parcel" in topics, sorted(topics)
        assert f"infermux/{camera}/zones/bay/parcel" in topics, sorted(topics)
    ends = [e for e in events if e["type"] == "end" and "snapshot" in e]  # an object's files hold its final best frame
    assert {e["key"] for e in ends} == set(CAMERAS), ends
    for event in ends:
        x0, y0, x1, y1 = event["snapshot"]["box"]
        assert green_share(jpeg(event["snapshot"]["path"]), (x0, y0, x1, y1)) > 0.8, event


def served_and_heard(clone: Path, env: dict[str, str], serve: str, subscribe: str, snapshot: str,
                     port: int) -> tuple[list[dict[str, Any]], set[str]]:
    """The daemon and the subscriber as the page starts them, until each camera's parcels made their
    events; the page's `ctl snapshot` meanwhile. The events heard (each checked against the schema)
    and the topics."""
    log = clone / "serve.log"
    heard = clone / "heard.txt"
    with open(heard, "w") as out:
        subscriber = subprocess.Popen(argv(subscribe, port), cwd=clone, stdout=out, stderr=subprocess.STDOUT)
    with open(log, "w") as out:
        daemon = subprocess.Popen(argv(serve, port), cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        eventually(lambda: every_camera_parked(heard), "every camera's first parcel in the bay", timeout_s=150)
        drawn_snapshot(clone, env, snapshot, port)
        eventually(lambda: every_camera_parked(heard, ended=True), "every camera's parcels gone at the loop",
                   timeout_s=90)
    finally:
        daemon.terminate()
        daemon.wait(30)
        subscriber.terminate()
        subscriber.wait(10)
    assert daemon.returncode == 0 and "Traceback" not in log.read_text(), log.read_text()[-3000:]
    messages = [line.split(" ", 1) for line in heard.read_text().splitlines() if " " in line]
    events = [valid(json.loads(payload)) for topic, payload in messages if topic.endswith("/events")]
    return events, {topic for topic, _ in messages}


def every_camera_parked(heard: Path, ended: bool = False) -> bool:
    """Whether each camera's events so far show a parcel that entered the bay (and, `ended`, its end)."""
    events = [json.loads(line.split(" ", 1)[1]) for line in heard.read_text().splitlines()
              if re.match(r"infermux/dock-\d/events ", line)]
    done = {e["key"] for e in events if e["type"] == ("end" if ended else "enter") and "bay" in
            (e["zones"] if ended else [e.get("zone")])}
    return done == set(CAMERAS)


def drawn_snapshot(clone: Path, env: dict[str, str], snapshot: str, port: int) -> None:
    """The page's `ctl snapshot`, until the newest frame has boxes (not at the moment a clip loops):
    the copy it wrote holds green boxes."""
    def boxes() -> Path | None:
        done = subprocess.run(argv(snapshot, port), cwd=clone, env=env, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
        found = re.search(r", (\d+) boxes?\)", done.stdout)
        assert found, done.stdout
        return clone / "dock-1.jpg" if int(found.group(1)) > 0 else None

    copy = eventually(boxes, "a snapshot of dock-1 with boxes", timeout_s=30)
    image = jpeg(str(copy))
    green = (image[:, :, 1] > 150) & (image[:, :, 0] < 110) & (image[:, :, 2] < 110)
    assert green.sum() > 200, "the snapshot's boxes are not drawn"


def lifecycles(events: list[dict[str, Any]]) -> list[list[str]]:
    """Each object's events in order, as `type` or `type:zone` / `type:line:direction`."""
    lives: dict[int, list[str]] = {}
    for e in events:
        where = f":{e['zone']}" if "zone" in e else f":{e['line']}:{e['direction']}" if "line" in e else ""
        lives.setdefault(e["track_id"], []).append(e["type"] + where)
    return list(lives.values())

