"""Lines' crossings kept across restarts: the file a daemon writes read back into the counts of the
lines still configured; a file it did not write set aside whole, the lines counting from 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infermux.config import CameraConfig
from infermux.config.settings import LineConfig, ZoneConfig
from infermux.events import EventLog
from infermux.pipelines.crossings import NAME, CrossingsFile
from infermux.pipelines.zones import MAX_LABELS, OTHER, ZoneBook

GATE = LineConfig(name="gate", points=((0.1, 0.3), (0.9, 0.3)), in_side="right", margin=0.02)
DOOR = LineConfig(name="door", points=((0.1, 0.6), (0.9, 0.6)), in_side="left", margin=0.02)
YARD = ZoneConfig(name="yard", points=((0.3, 0.5), (0.7, 0.5), (0.7, 0.7), (0.3, 0.7)), inertia=2)


def camera(name: str = "cam", lines: tuple[LineConfig, ...] = (GATE,)) -> CameraConfig:
    return CameraConfig(name=name, url="/dev/video0", pipeline="p", zones=(YARD,), lines=lines)


def test_what_one_book_counted_another_takes_up_through_the_file_and_counts_on(tmp_path: Path) -> None:
    first = ZoneBook([camera(), camera("back")])
    first.crossed("cam", "gate", "in", "car")
    first.crossed("cam", "gate", "in", "car")
    first.crossed("cam", "gate", "out", None)
    first.entered("cam", "yard", "car")  # a zone's objects are not kept: their tracks end with the daemon
    saved = first.changes()
    assert saved == {"cam": {"gate": {"in": {"car": 2}, "out": {"none": 1}}}} and first.changes() is None
    CrossingsFile(tmp_path, EventLog()).save(saved)
    assert (tmp_path / NAME).stat().st_mode & 0o777 == 0o600

    second = ZoneBook([camera(), camera("back")])
    second.restore(CrossingsFile(tmp_path, EventLog()).read())
    assert second.view("cam") == {"zones": {"yard": {}}, "lines": {"gate": {"in": {"car": 2}, "out": {"none": 1}}}}
    assert second.changes() is None  # nothing new to write
    assert second.crossed("cam", "gate", "in", "car") == ("car", 3)
    assert second.changes() == {"cam": {"gate": {"in": {"car": 3}, "out": {"none": 1}}}}


def test_only_the_cameras_and_lines_configured_now_take_up_their_crossings() -> None:
    book = ZoneBook([camera(lines=(DOOR,))])
    book.restore({"cam": {"gate": {"in": {"car": 5}}, "door": {"out": {"car": 1}}}, "gone": {"gate": {"in": {"x": 1}}}})
    assert book.view("cam")["lines"] == {"door": {"in": {}, "out": {"car": 1}}}
    assert book.view("gone") == {}


def test_restored_labels_past_the_cap_count_as_other() -> None:
    book = ZoneBook([camera()])
    labels = {f"l{i}": 1 for i in range(MAX_LABELS + 1)}
    book.restore({"cam": {"gate": {"in": labels}}})
    counted = book.view("cam")["lines"]["gate"]["in"]  # type: ignore[index]
    assert len(counted) == MAX_LABELS + 1 and counted[OTHER] == 1


def test_a_reload_that_removes_a_line_changes_what_is_saved() -> None:
    book = ZoneBook([camera(lines=(GATE, DOOR))])
    book.crossed("cam", "gate", "in", None)
    book.crossed("cam", "door", "in", None)
    book.changes()
    book.apply([camera(lines=(DOOR,))])
    assert book.changes() == {"cam": {"door": {"in": {"none": 1}}}}


@pytest.mark.parametrize("payload", [
    "not json", "[]", json.dumps({"format": 2, "cameras": {}}), json.dumps({"format": 1, "cameras": []}),
    json.dumps({"format": 1, "cameras": {"cam": {"gate": {"sideways": {}}}}}),
    json.dumps({"format": 1, "cameras": {"cam": {"gate": {"in": {"car": -1}}}}}),
    json.dumps({"format": 1, "cameras": {"cam": {"gate": {"in": {"car": True}}}}}),
    json.dumps({"format": 1, "cameras": {"cam": {"gate": {"in": {"car": 1.5}}}}}),
    json.dumps({"format": 1, "cameras": {"": {}}}),
    json.dumps({"format": 1, "cameras": {"cam": {"gate": {"in": {f"l{i}": 1 for i in range(MAX_LABELS + 2)}}}}}),
], ids=["text", "list", "format", "cameras", "direction", "negative", "bool", "fraction", "empty-name", "labels"])
def test_a_file_a_daemon_did_not_write_is_set_aside_and_the_lines_count_from_0(tmp_path: Path, payload: str) -> None:
    (tmp_path / NAME).write_text(payload)
    events = EventLog()
    assert CrossingsFile(tmp_path, events).read() == {}
    assert not (tmp_path / NAME).exists() and len(list(tmp_path.glob(f"{NAME}.unreadable-*"))) == 1
    assert [e.kind for e in events.recent()] == ["state_set_aside"]


def test_a_link_in_place_of_the_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"format": 1, "cameras": {"cam": {"gate": {"in": {"car": 7}}}}}))
    (tmp_path / NAME).symlink_to(target)
    assert CrossingsFile(tmp_path, EventLog()).read() == {}
    CrossingsFile(tmp_path, EventLog()).save({"cam": {"gate": {"in": {"car": 1}}}})
    assert json.loads(target.read_text())["cameras"]["cam"]["gate"]["in"]["car"] == 7  # the target untouched
    assert not (tmp_path / NAME).is_symlink()


def test_without_a_state_directory_nothing_is_read_or_written() -> None:
    kept = CrossingsFile(None, EventLog())
    assert kept.read() == {}
    kept.save({"cam": {"gate": {"in": {"car": 1}}}})  # no file, no error
