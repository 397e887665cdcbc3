"""Tracked objects' lifecycles: new after min_frames, updates on change and rate-bounded, end after silence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.polling import eventually
from support.sinks import valid

from infermux.config import ConfigError, SnapshotConfig, parse
from infermux.pipelines.lifecycle import IDS, Lifecycle, Outlet, seen_at
from infermux.pipelines.seen import seen_of
from infermux.pipelines.snapshots import Snapshots
from infermux.plugins.processors.base import Region
from infermux.config import LifecycleConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def region(track_id: int, score: float = 0.9, label: str | None = None, x: float = 10.0) -> Region:
    box = np.array([[x, 10], [x + 20, 10], [x + 20, 30], [x, 30]], np.float32)
    return Region(box=box, score=score, label=label, track_id=track_id)


def run(life: Lifecycle, clock: Clock, frames: list[list[Region]], dt: float = 0.1) -> list[dict[str, Any]]:
    out = []
    for regions in frames:
        clock.now += dt
        out += life.observe("cam", regions, 1_700_000_000.0 + clock.now, False)
        out += life.sweep()
    return [valid(e) for e in out]


def test_an_object_is_new_after_min_frames_above_min_score_and_ends_after_silence() -> None:
    clock = Clock()
    life = Lifecycle(LifecycleConfig(min_frames=3, min_score=0.5, end_after_s=1.0, update_every_s=10), "p", clock)
    events = run(life, clock, [[region(1, 0.9), region(2, 0.3)]] * 2)
    assert events == []  # seen twice: not yet; a low score never counts
    events = run(life, clock, [[region(1, 0.9), region(2, 0.3)]])
    assert [(e["type"], e["track_id"], e["frames"]) for e in events] == [("new", 1, 3)]
    assert run(life, clock, [[]] * 9) == []  # 0.9 s unseen
    ended = run(life, clock, [[]] * 2)
    assert [(e["type"], e["track_id"]) for e in ended] == [("end", 1)]  # track 2 never was new: no end
    assert ended[0]["first_seen"] < ended[0]["last_seen"] and ended[0]["captured"] is False
    assert life.counts()["objects"] == 0


def test_updates_follow_label_and_score_changes_at_most_once_per_interval() -> None:
    clock = Clock()
    life = Lifecycle(LifecycleConfig(min_frames=1, min_score=0.5, end_after_s=5, update_every_s=1.0,
                                     min_score_gain=0.05), "p", clock)
    assert [e["type"] for e in run(life, clock, [[region(1, 0.6, "car")]])] == ["new"]
    assert run(life, clock, [[region(1, 0.62, "car")]]) == []  # less than min_score_gain better
    assert run(life, clock, [[region(1, 0.7, "car")]]) == []  # a change, but the last event was 0.2 s ago
    late = run(life, clock, [[region(1, 0.7, "car")]] * 9)  # the pending change goes once its second is up
    assert [(e["type"], e["score"]) for e in late] == [("update", 0.7)]
    clock.now += 1.0
    changed = run(life, clock, [[region(1, 0.7, "truck")]])
    assert [(e["type"], e["label"]) for e in changed] == [("update", "truck")]


def test_objects_past_max_objects_are_not_followed_and_counted() -> None:
    clock = Clock()
    life = Lifecycle(LifecycleConfig(min_frames=1, max_objects=2), "p", clock)
    events = run(life, clock, [[region(1), region(2), region(3)]])
    assert sorted(e["track_id"] for e in events) == [1, 2]
    assert life.counts()["not_followed"] == 1


def test_ids_are_unique_and_sort_in_the_order_they_were_made() -> None:
    ids = [IDS.new() for _ in range(2000)]
    assert len(set(ids)) == len(ids) and ids == sorted(ids) and all(len(i) == 26 for i in ids)


def test_a_capture_time_is_taken_in_seconds_or_nanoseconds() -> None:
    assert seen_at(1_700_000_000.5, 0) == (1_700_000_000.5, True)
    assert seen_at(1_700_000_000_500_000_000, 0) == (1_700_000_000.5, True)
    assert seen_at(None, 0)[1] is False and seen_at(float("nan"), 0)[1] is False and seen_at(True, 0)[1] is False


PIPELINE = """
[[pipelines]]
name = "cams"
{events}
[[pipelines.steps]]
processor = "decode"
{track}
"""


@pytest.mark.parametrize("events, track, where, says", [
    ("events = { min_frames = 0 }", 'processor = "track"', "pipelines[0].events.min_frames", "must be >= 1, got 0"),
    ("events = { min_score = 1.5 }", 'processor = "track"', "pipelines[0].events.min_score", "between 0"),
    ("events = { end_after = 1 }", 'processor = "track"', "pipelines[0].events.end_after",
     "unknown field; did you mean `end_after_s`?"),
    ("events = 3", 'processor = "track"', "pipelines[0].events", "must be a table"),
    ("events = {}", 'processor = "normalize"', "pipelines[0].events", "needs a 'track' step"),
])
def test_a_wrong_events_table_is_refused_naming_the_setting(tmp_path: Any, events: str, track: str, where: str,
                                                            says: str) -> None:
    text = PIPELINE.format(events=events, track=f"[[pipelines.steps]]\n{track}\n")
    with pytest.raises(ConfigError) as caught:
        parse(text, tmp_path / "infermux.toml")
    assert caught.value.path == where and says in caught.value.reason, str(caught.value)


SINK = """
[[sinks]]
name = {name}
kind = {kind}
options = {options}
"""


@pytest.mark.parametrize("name, kind, options, where, says", [
    ('"a"', '"smoke"', "{}", "sinks[0].kind", "unknown sink kind"),
    ('"../up"', '"jsonl"', '{ path = "/tmp/x" }', "sinks[0].name", "letters, digits"),
    ('"a"', '"jsonl"', '{ path = "rel" }', "sinks[0].options.path", "absolute"),
    ('"a"', '"mqtt"', "{}", "sinks[0].options.host", "'host' is required"),
    ('"a"', '"mqtt"', '{ host = "h", port = 0 }', "sinks[0].options.port", "'port' must be between"),
    ('"a"', '"webhook"', '{ url = "ftp://x" }', "sinks[0].options.url", "http:// or https://"),
    ('"a"', '"zmq"', '{ bind = "tcp://127.0.0.1:1", colour = 1 }', "sinks[0].options.colour", "unknown option 'colour'"),
    ('"a"', '"zmq"', '{ bind = "tcp://127.0.0.1:1", result = true }', "sinks[0].options.result",
     "did you mean 'results'?"),
    ('"a"', '"jsonl"', '{ path = "/tmp/x" }\nbatchs = 5', "sinks[0].batchs", "did you mean `batch`?"),
    ('"a"', '"jsonl"', '{ path = "/tmp/x" }\nbatch = 0', "sinks[0].batch", "must be >= 1, got 0"),
    ('"a"', '"jsonl"', '{ path = "/tmp/x" }\npipelines = ["cam"]', "sinks[0].pipelines[0]", "unknown pipeline 'cam'"),
])
def test_a_wrong_sink_is_refused_naming_the_setting(tmp_path: Any, name: str, kind: str, options: str, where: str,
                                                    says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(SINK.format(name=name, kind=kind, options=options), tmp_path / "infermux.toml")
    assert caught.value.path == where and says in caught.value.reason, str(caught.value)


def test_two_sinks_of_one_name_are_refused(tmp_path: Any) -> None:
    one = SINK.format(name='"a"', kind='"jsonl"', options='{ path = "/tmp/x" }')
    with pytest.raises(ConfigError, match="already another sink's name"):
        parse(one + one, tmp_path / "infermux.toml")
    assert parse(one, tmp_path / "infermux.toml").sinks[0].options == {"path": "/tmp/x"}


def test_the_best_frame_is_the_highest_score_inside_the_frame_and_later_events_rewrite_it(tmp_path: Path) -> None:
    pytest.importorskip("cv2", reason="snapshots are encoded with OpenCV")
    clock, outlet = Clock(), Outlet()
    outlet.snapshots = Snapshots(SnapshotConfig(), tmp_path)
    life = Lifecycle(LifecycleConfig(min_frames=1, min_score=0.5, end_after_s=1.0, update_every_s=0.0,
                                     min_score_gain=0.05, snapshots=True), "p", clock, outlet=outlet)
    image = np.zeros((40, 60, 3), np.uint8)

    def frame(r: Region) -> list[dict[str, Any]]:
        clock.now += 0.1
        seen = seen_of(image, None, [r], "cam", "p", "rgb", clock.now)
        return [valid(e) for e in life.observe("cam", [r], clock.now, False, frame=seen)]

    try:
        new, = frame(region(1, 0.6, x=10))
        assert new["snapshot"]["box"] == [10, 10, 30, 30]
        edge, = frame(region(1, 0.99, x=0))  # a better score at the frame's edge: an update...
        assert edge["type"] == "update" and edge["snapshot"] == new["snapshot"]  # ... with the frame inside
        assert frame(region(1, 0.8, x=20)) == []  # better inside, but the best score did not rise: no event
        clock.now += 2
        end, = [valid(e) for e in life.sweep()]
        assert end["type"] == "end" and end["snapshot"]["box"] == [20, 10, 40, 30]  # the end writes it
        assert end["snapshot"]["path"] == new["snapshot"]["path"]  # the same files, written over
        eventually(lambda: Path(end["snapshot"]["crop"]).exists(), "the crop written")
    finally:
        outlet.snapshots.stop()
