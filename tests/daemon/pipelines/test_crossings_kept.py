"""Lines' crossings on a real daemon outlive its restart: tracking.py's `through_zone` walk sent as camera
`yard`'s frames (tests/support/zones.py's zones, lines and the events it makes), the daemon restarted,
the walk sent again: its crossings count on from the first walk's, from `<state_dir>/crossings.json`;
the yard's objects start again from none (the tracks ended with the daemon)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models, tracking  # noqa: E402
from support.camera_files import cameras  # noqa: E402
from support.harness import Daemon, dealer  # noqa: E402
from support.sinks import events_daemon, jsonl, until_ended  # noqa: E402
from support.tracking import detecting, replay  # noqa: E402
from support.zones import EVENTS, LINES_AFTER, WALKS_DOWN, WALKS_UP, ZONES_AFTER, camera, moves  # noqa: E402


def twice(walk: list[tuple]) -> list[tuple]:
    """A walk's events the second time it is walked: each crossing's count one more."""
    return [(*event[:3], event[3] + 1) if event[0] == "cross" else event for event in walk]


def walk(d: Daemon) -> None:
    with dealer(d.endpoint) as sock:
        assert set(replay(sock, "tracked", tracking.through_zone(), "yard").statuses) == {200}


def test_the_lines_crossings_count_on_across_a_restart_and_the_zones_objects_start_from_none(tmp_path: Path) -> None:
    models.brightness_map(tmp_path / "engines" / "det" / "1" / "model.onnx")
    events = tmp_path / "out" / "events.jsonl"
    text = events_daemon(tmp_path / "engines", detecting("tracked", **EVENTS), jsonl(events),
                         more=camera("yard", "yard.mp4", "tracked", enabled="false"))
    d = Daemon(tmp_path, text).start()
    try:
        walk(d)
        first = until_ended(events, 2)
        assert cameras(d)["yard"]["lines"] == LINES_AFTER
        assert d.stop() == 0, d.log()[-4000:]
        saved = json.loads((d.state_dir / "crossings.json").read_text())
        assert saved == {"format": 1, "cameras": {"yard": {"gate": {"in": {"none": 1}, "out": {"none": 1}},
                                                           "short": {"out": {"none": 1}}}}}
        d.start()
        assert cameras(d)["yard"]["lines"] == LINES_AFTER and cameras(d)["yard"]["zones"] == {"yard": {}}
        walk(d)
        second = until_ended(events, 4)[len(first):]
        assert sorted(moves(second).values()) == sorted([twice(WALKS_DOWN), twice(WALKS_UP)]), moves(second)
        yard = cameras(d)["yard"]
        assert yard["zones"] == ZONES_AFTER
        assert yard["lines"] == {"gate": {"in": {"none": 2}, "out": {"none": 2}}, "short": {"in": {}, "out": {"none": 2}}}
    finally:
        assert d.stop() == 0, d.log()[-4000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]
