"""Zones and lines on tracked objects: enter and exit with inertia, crossings with a dead band, the
events a lifecycle makes of them in order, and the counts they leave."""

from __future__ import annotations

from typing import Any

import numpy as np

from support.sinks import valid

from infermux.config import CameraConfig, LifecycleConfig
from infermux.config.settings import LineConfig, ZoneConfig
from infermux.pipelines.lifecycle import Lifecycle
from infermux.pipelines.zones import MAX_LABELS, OTHER, ZoneBook
from infermux.plugins.processors.base import Region

SIZE = (200, 100)  # the frame: 200 x 100 pixels
ZONE = ZoneConfig(name="yard", points=((0.3, 0.5), (0.7, 0.5), (0.7, 0.7), (0.3, 0.7)), inertia=2)
# Eastward at a third of the height, from x = 0.1 to 0.9; its right (below it on the image) is `in`.
LINE = LineConfig(name="gate", points=((0.1, 0.3), (0.9, 0.3)), in_side="right", margin=0.02)


def camera(zones: tuple[ZoneConfig, ...] = (ZONE,), lines: tuple[LineConfig, ...] = (LINE,)) -> CameraConfig:
    return CameraConfig(name="cam", url="/dev/video0", pipeline="p", zones=zones, lines=lines)


class Scene:
    """A lifecycle on camera `cam` and a clock; `at(...)` shows it a frame of objects standing at points."""

    def __init__(self, book: ZoneBook | None = None, **settings: Any) -> None:
        self.now = 100.0
        self.book = book or ZoneBook([camera()])
        config = LifecycleConfig(**{"min_frames": 1, "end_after_s": 1.0, "update_every_s": 0.0, **settings})
        self.life = Lifecycle(config, "p", lambda: self.now, zones=self.book)

    def at(self, *objects: tuple[int, float, float], label: str = "person", score: float = 0.9) -> list[dict]:
        """A frame 0.1 s on, each object (track id, x, y: its box's bottom centre in fractions)."""
        self.now += 0.1
        regions = [region(track_id, x, y, label, score) for track_id, x, y in objects]
        events = self.life.observe("cam", regions, 1_700_000_000.0 + self.now, False, SIZE)
        return [valid(e) for e in events + self.life.sweep()]

    def path(self, track_id: int, points: list[tuple[float, float]], **kw: Any) -> list[dict]:
        return [e for x, y in points for e in self.at((track_id, x, y), **kw)]

    def quiet(self, seconds: float = 1.5) -> list[dict]:
        self.now += seconds
        return [valid(e) for e in self.life.sweep()]


def region(track_id: int, x: float, y: float, label: str, score: float) -> Region:
    px, py = x * SIZE[0], y * SIZE[1]
    box = np.array([[px - 5, py - 10], [px + 5, py - 10], [px + 5, py], [px - 5, py]], np.float32)
    return Region(box=box, score=score, label=label, track_id=track_id)


def kinds(events: list[dict]) -> list[tuple]:
    out: list[tuple] = []
    for e in events:
        extra = (e["zone"], e["count"]) if "zone" in e else (e["line"], e["direction"], e["count"]) if "line" in e else ()
        out.append((e["type"], *extra))
    return out


DOWN = [(0.5, y / 100) for y in range(10, 95, 5)]  # straight down the middle: past the line, through the zone


def test_an_object_walking_through_crosses_in_enters_exits_and_ends_with_exact_events_and_counts() -> None:
    scene = Scene(min_frames=3)
    events = scene.path(1, DOWN) + scene.quiet()
    # new at y=0.2 (3rd frame); the line's band is 0.28-0.32, so y=0.35 decides `in`; the zone is entered on
    # the 2nd frame inside (0.6) and exited on the 2nd outside (0.8) (inertia 2); each change of zones: an update.
    assert kinds(events) == [("new",), ("cross", "gate", "in", 1), ("enter", "yard", 1), ("update",),
                             ("exit", "yard", 0), ("update",), ("end",)]
    assert events[2]["zones"] == ["yard"] and events[3]["zones"] == ["yard"] and events[4]["zones"] == []
    assert scene.book.view("cam") == {"zones": {"yard": {"person": 0}},
                                      "lines": {"gate": {"in": {"person": 1}, "out": {}}}}


def test_walking_back_up_crosses_out() -> None:
    scene = Scene()
    events = scene.path(1, [(0.5, 0.45), (0.5, 0.4), (0.5, 0.25), (0.5, 0.2)])
    assert kinds(events) == [("new",), ("cross", "gate", "out", 1)]
    assert scene.book.view("cam")["lines"] == {"gate": {"in": {}, "out": {"person": 1}}}


def test_a_box_standing_on_the_line_and_jitter_within_the_margin_cross_nothing() -> None:
    scene = Scene(end_after_s=100)
    standing = scene.path(1, [(0.5, 0.3), (0.5, 0.31), (0.5, 0.29)] * 5)
    assert kinds(standing) == [("new",)]
    # from above, onto the line and jittering on it: no side decided but the first, no crossing
    jitter = scene.path(2, [(0.5, 0.2)] + [(0.5, 0.315), (0.5, 0.285)] * 10)
    assert kinds(jitter) == [("new",)]


def test_jitter_past_the_margin_is_crossings_each_way_and_only_the_last_side_counts() -> None:
    scene = Scene()
    events = scene.path(1, [(0.5, 0.25), (0.5, 0.35), (0.5, 0.25), (0.5, 0.35)])
    assert kinds(events) == [("new",), ("cross", "gate", "in", 1), ("cross", "gate", "out", 1),
                             ("cross", "gate", "in", 2)]


def test_going_round_the_end_of_a_line_is_no_crossing() -> None:
    scene = Scene()
    events = scene.path(1, [(0.95, 0.2), (0.95, 0.4), (0.5, 0.4)])
    assert kinds(events) == [("new",)]


def test_one_frame_on_a_zone_edge_is_no_entry_with_inertia() -> None:
    scene = Scene()
    events = scene.path(1, [(0.5, 0.45), (0.5, 0.55), (0.5, 0.45), (0.5, 0.55), (0.5, 0.45)])
    assert kinds(events) == [("new",)]


def test_an_object_that_vanishes_in_a_zone_exits_it_before_its_end() -> None:
    scene = Scene()
    events = scene.path(1, [(0.5, 0.6)] * 3) + scene.quiet()
    assert kinds(events) == [("new",), ("enter", "yard", 1), ("update",), ("exit", "yard", 0), ("end",)]
    assert events[-1]["zones"] == ["yard"] and events[-2]["zones"] == []  # the end says where it was last seen


def test_what_an_object_did_before_its_new_follows_the_new() -> None:
    scene = Scene(min_frames=3, min_score=0.5)
    early = scene.path(1, [(0.5, 0.2), (0.5, 0.4), (0.5, 0.55), (0.5, 0.6)], score=0.3)  # crossed, entered, unsure
    assert early == []
    events = scene.path(1, [(0.5, 0.6)] * 3)
    assert kinds(events) == [("new",), ("enter", "yard", 1), ("cross", "gate", "in", 1)]
    assert events[0]["zones"] == ["yard"]


def test_counts_are_per_label_and_past_max_labels_count_as_other() -> None:
    scene = Scene(end_after_s=100)
    for n in range(MAX_LABELS + 2):
        scene.at((n + 1, 0.5, 0.6), label=f"thing{n}")
        scene.at((n + 1, 0.5, 0.6), label=f"thing{n}")
    zone = scene.book.view("cam")["zones"]["yard"]
    assert len(zone) == MAX_LABELS + 1 and zone[OTHER] == 2 and sum(zone.values()) == MAX_LABELS + 2


def test_a_reload_that_removes_a_zone_makes_its_objects_exit_and_its_counts_go() -> None:
    book = ZoneBook([camera()])
    scene = Scene(book)
    assert kinds(scene.path(1, [(0.5, 0.6)] * 2)) == [("new",), ("enter", "yard", 1), ("update",)]
    book.apply([camera(zones=())])
    assert kinds(scene.at((1, 0.5, 0.6))) == [("exit", "yard", 0), ("update",)]
    assert book.view("cam") == {"zones": {}, "lines": {"gate": {"in": {}, "out": {}}}}
    assert kinds(scene.path(2, [(0.5, 0.6)] * 3)) == [("new",)]
    book.apply([camera()])
    assert kinds(scene.path(2, [(0.5, 0.6)] * 2)) == [("enter", "yard", 1), ("update",)]
    book.apply([])  # the camera gone: its object exits, and nothing is counted for it any more
    assert kinds(scene.at((2, 0.5, 0.6))) == [("exit", "yard", 0), ("update",)]
    assert book.view("cam") == {} and book.of("cam") is None and book._counts == {}


def test_a_stream_without_zones_or_a_frame_of_unknown_size_makes_no_zone_events() -> None:
    scene = Scene()
    scene.now += 0.1
    events = scene.life.observe("other", [region(1, 0.5, 0.6, "car", 0.9)] * 1, 1.0, False, SIZE)
    events += scene.life.observe("cam", [region(2, 0.5, 0.6, "car", 0.9)], 1.0, False, None)
    events += scene.life.observe("cam", [region(2, 0.5, 0.6, "car", 0.9)], 1.1, False, None)
    assert [e["type"] for e in events] == ["new", "new"]
