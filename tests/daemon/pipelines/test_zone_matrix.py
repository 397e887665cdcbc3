"""The feature matrix's zone and line column: tracking.py's `through_zone` walk sent as a camera's frames
through a tracked pipeline whose detector (the model the `track` step follows) is hot or cold, through a
hot swap of that model, drain, and a reload that changes a zone (docs/matrix.md).

One daemon per placement (module-scoped); its cells run in order on it. Each cell walks through its own
camera (disabled: the test sends its frames with the camera's name as their key), so that each starts
from counts of 0; the zones, lines and the events the walk makes are tests/support/zones.py's. In every
cell each frame is answered 200 and each object's events in the `jsonl` file are exactly its walk's
(`new`, `enter`, `cross`, `exit`, `end` with their zones, lines, directions and counts), and admin
`cameras` holds the counts the walk leaves. The shared `cell` fixture fails a cell whose daemon logged a
traceback or counted a 500 while it ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from support import models, tracking
from support.camera_files import cameras
from support.harness import dealer
from support.matrix import WATCHING, Placement, placed_as, placement_daemon, publish_copy, versions
from support.polling import eventually
from support.sinks import events_daemon, jsonl, jsonl_events
from support.tracking import detecting, replay
from support.zones import EVENTS, LINES_AFTER, WALKS_DOWN, WALKS_UP, ZONES_AFTER, camera, moves

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

# Where the tracked pipeline's detector runs: in the daemon, or in a worker process.
zone_placements = pytest.mark.parametrize("placed", ("hot", "cold"), indirect=True)
pytestmark = pytest.mark.timing  # objects end after end_after_s; a watched directory's settle; a worker's start

DETECTOR = "det/1/model.onnx"
CAMERAS = ("served", "swapped", "on-v2", "drained", "reloaded")  # a camera a walk, each cell's own
# The reload's change to camera `reloaded`: its `yard` made larger (the object standing in it stays
# inside) and a zone `porch` added in a corner nobody walks to.
YARD = "points = [[0.05, 0.6], [0.45, 0.6], [0.45, 0.95], [0.05, 0.95]]"
WIDER_YARD = "points = [[0.02, 0.55], [0.48, 0.55], [0.48, 0.98], [0.02, 0.98]]"
PORCH = '\n[[cameras.zones]]\nname = "porch"\npoints = [[0.6, 0.02], [0.95, 0.02], [0.95, 0.12], [0.6, 0.12]]\n'
WALK = tracking.through_zone()
STANDING = 60  # a frame of the walk where object 1 stands in the yard (it stops there from frame 50)


def config_text(placement: str, watched: Path, events: Path, changed: bool = False) -> str:
    """The tracked pipeline on `det` (served from the watched directory), a zoned camera per cell and a
    file sink; `changed`: with the reload's change to camera `reloaded`."""
    zoned = "".join(camera(name, "walk.mp4", "tracked", enabled="false") for name in CAMERAS)
    if changed:
        assert zoned.endswith("\n") and zoned.count(YARD) == len(CAMERAS), "tests/support/zones.py's yard moved"
        last = zoned.rindex(YARD)  # camera `reloaded` is the last one
        zoned = zoned[:last] + WIDER_YARD + zoned[last + len(YARD):] + PORCH
    return events_daemon(watched, detecting("tracked", **EVENTS), jsonl(events), more=zoned,
                         det=placed_as(placement), **WATCHING)


@pytest.fixture(scope="module")
def placed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           engines: Path) -> Iterator[Placement]:
    """A daemon whose tracked pipeline's detector is placed as `request.param` says."""
    workdir = tmp_path_factory.mktemp(f"zone-matrix-{request.param}")
    watched = workdir / "engines"
    models.brightness_map(watched / DETECTOR)
    d = placement_daemon(request.param, workdir, config_text(request.param, watched, workdir / "events.jsonl"))
    try:
        yield Placement(request.param, d, engines, watched)
    finally:
        assert d.stop() == 0, d.log()[-4000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]


def events_file(cell: Placement) -> Path:
    """Where the placement's `jsonl` sink writes (beside its engine directory)."""
    return cell.watched.parent / "events.jsonl"


def walk(cell: Placement, name: str, before: Callable[[int], None] | None = None) -> None:
    """The walk's frames sent as camera `name`'s, each answered 200."""
    with dealer(cell.daemon.endpoint) as sock:
        sent = replay(sock, "tracked", WALK, name, before=before)
    assert set(sent.statuses) == {200}, sent.statuses


def walked(cell: Placement, name: str, zones: dict[str, Any] = ZONES_AFTER) -> list[dict[str, Any]]:
    """Once both objects of camera `name`'s walk have ended: their events are exactly the walk's, and the
    camera's counts in admin `cameras` those it leaves (`zones`). Returns the events."""
    events = eventually(lambda: (lambda e: e if sum(x["type"] == "end" for x in e) >= 2 else None)(
        [e for e in jsonl_events(events_file(cell)) if e["key"] == name]), f"camera {name}'s objects ended", 30)
    assert sorted(moves(events).values()) == sorted([WALKS_DOWN, WALKS_UP]), moves(events)
    counts = eventually(lambda: (lambda c: c if c.get("zones") == zones else None)(cameras(cell.daemon)[name]),
                        f"camera {name}'s zone counts back to {zones}", 10)
    assert counts["lines"] == LINES_AFTER, counts
    return events


# -- the cells, in the order they run on each placement's daemon ------------------------------------


@zone_placements
def test_a_walk_makes_its_zone_and_line_events_where_the_tracker_s_model_is_placed(cell: Placement) -> None:
    walk(cell, "served")
    walked(cell, "served")
    assert versions(cell.daemon, "det")["1"]["placement"] == cell.where


@zone_placements
def test_a_walk_makes_its_zone_and_line_events_across_a_hot_swap_of_the_tracker_s_model(cell: Placement) -> None:
    def publish(i: int) -> None:
        if i == 20:  # before either object crosses a line: the crossings come from whichever version
            publish_copy(cell.watched / DETECTOR, cell.watched, "det", 2)

    walk(cell, "swapped", before=publish)
    walked(cell, "swapped")
    eventually(lambda: (v := versions(cell.daemon, "det").get("2")) and v["state"] == "ready", "det v2 ready", 30)
    walk(cell, "on-v2")  # every frame now on v2: the same events from its boxes
    walked(cell, "on-v2")
    assert versions(cell.daemon, "det")["2"]["stats"]["by_status"].get("200", 0) >= WALK.length


@zone_placements
def test_objects_ending_while_drained_exit_their_zone_and_resume_serves_again(cell: Placement) -> None:
    d = cell.daemon
    walk(cell, "drained")  # object 1 stands in the yard at the walk's end: its exit comes with its end
    drained = d.ctl("drain")
    try:
        assert drained.returncode == 0, drained.stdout + drained.stderr
        walked(cell, "drained")  # the objects end while drained; the yard's count back to 0
    finally:
        resumed = d.ctl("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with dealer(d.endpoint) as sock:
        assert set(replay(sock, "tracked", tracking.crossing(), "after-drain", frames=4).statuses) == {200}


@zone_placements
def test_a_reload_that_changes_a_zone_under_a_standing_object_keeps_its_events_and_counts(cell: Placement) -> None:
    d = cell.daemon
    before = {name: (c["zones"], c["lines"]) for name, c in cameras(d).items() if name != "reloaded"}

    def reload(i: int) -> None:
        if i == STANDING:  # object 1 inside the yard, counted there
            d.config_path.write_text(config_text(cell.name, cell.watched, events_file(cell), changed=True))
            with d.admin() as admin:
                admin.call("reload", check=True)
            assert cameras(d)["reloaded"]["zones"] == {"porch": {}, "yard": {"none": 1}}

    walk(cell, "reloaded", before=reload)
    # no exit and enter again for the larger yard; the lines' counts kept; the porch there, empty
    walked(cell, "reloaded", zones={**ZONES_AFTER, "porch": {}})
    after = {name: (c["zones"], c["lines"]) for name, c in cameras(d).items() if name != "reloaded"}
    assert after == before  # the other cameras' zones and counts as they were
