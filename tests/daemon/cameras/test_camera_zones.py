"""Zones and lines on a camera the daemon reads itself: tracking.py's `through_zone` walk written as a
video file, read once by camera `yard` (tests/support/zones.py has its zones, lines and the events the
walk makes), through a detector pipeline with a `track` step, its events into a `jsonl` sink."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models, tracking  # noqa: E402
from support.camera_files import cameras, write_frames  # noqa: E402
from support.harness import Daemon  # noqa: E402
from support.sinks import events_daemon, jsonl, until_ended  # noqa: E402
from support.tracking import detecting  # noqa: E402
from support.zones import EVENTS, LINES_AFTER, WALKS_DOWN, WALKS_UP, ZONES_AFTER, camera, moves  # noqa: E402


def config_text(workdir: Path, clip: Path) -> str:
    return events_daemon(workdir / "engines", detecting("tracked", **EVENTS), jsonl(workdir / "out" / "events.jsonl"),
                         more=camera("yard", str(clip), "tracked", loop="false", fps="15"))


def test_a_camera_reading_a_walk_makes_exactly_its_zone_and_line_events_and_counts(tmp_path: Path) -> None:
    seq = tracking.through_zone()
    clip = write_frames(tmp_path / "walk.mp4", (seq.frame(i) for i in range(seq.length)))
    models.brightness_map(tmp_path / "engines" / "det" / "1" / "model.onnx")
    d = Daemon(tmp_path, config_text(tmp_path, clip)).start()
    try:
        events = until_ended(tmp_path / "out" / "events.jsonl", 2, timeout_s=90)
        yard = cameras(d)["yard"]  # its counts are the pipelines' own, as they are now
        assert sorted(moves(events).values()) == sorted([WALKS_DOWN, WALKS_UP]), moves(events)
        assert {e["key"] for e in events} == {"yard"}
        assert yard["zones"] == ZONES_AFTER and yard["lines"] == LINES_AFTER
    finally:
        assert d.stop() == 0, d.log()[-4000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]
