"""The console's cameras tab against a real daemon reading a generated clip and a URL that never answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from textual.markup import to_content

from support.camera_files import camera, write_clip
from support.harness import DAEMON_HEAD, free_port
from support.pipelines import camera_pipeline
from support.tui_support import screen_text, until

from infermux.tui.app import TopApp
from infermux.tui.feed import Endpoints, LiveFeed
from infermux.tui.views.cameras import CamerasTable, CamerasView

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[processors]'")

MODELS = '[[models]]\nname = "classifier"\nengine = "classifier/1/model.onnx"\n'


async def test_the_cameras_tab_shows_a_streaming_camera_and_a_lost_one_with_its_reason(make_daemon,
                                                                                      tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "front.mp4", 64, 48, frames=30)
    cameras = camera("front", str(clip)) + camera("far", f"rtsp://127.0.0.1:{free_port()}/never", transport="tcp")
    d = make_daemon(MODELS + camera_pipeline("cams") + cameras, head=DAEMON_HEAD)
    app = TopApp(LiveFeed(Endpoints(d.admin_endpoint, d.stats_endpoint)))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("8")
        table = app.cameras_view.query_one(CamerasTable)
        await until(pilot, lambda: sorted(table.keys()) == ["far", "front"], what="both cameras' rows")
        await until(pilot, lambda: table.cell_text("front", "state") == "streaming"
                    and table.cell_text("front", "served") != "0", timeout=30, what="front streaming and served")
        assert table._cells["front"]["state"][1] == "green" and table.cell_text("front", "p99") != "-"
        await until(pilot, lambda: table.cell_text("far", "state") == "lost", timeout=30, what="far lost")
        assert table._cells["far"]["state"][1] == "bold red" and "1 down" in screen_text(app)
        table.select("far")  # its reason in full under the table
        await until(pilot, lambda: "Connection refused" in screen_text(app), what="far's reason under the table")
        assert "far lost:" in screen_text(app)


def test_text_from_a_camera_reaches_the_screen_printable_and_never_as_markup() -> None:
    hostile = {"camera": "c[b]1", "state": "lost", "reason": "454 [red]Not Found[/red]\x1b[2J"}
    (key, cells), = CamerasTable.row_cells([hostile])
    assert key == "c[b]1" and cells["error"][0] == "  454 [red]Not Found[/red]\\x1b[2J"
    line = CamerasView.why_text([hostile], "c[b]1")
    shown = to_content(line).plain  # what Textual draws: the text as it came, printable, and nothing else
    assert "\x1b" not in line and "454 [red]Not Found[/red]\\x1b[2J" in shown and "c[b]1 lost:" in shown
    assert "infermux doctor" in shown  # a lost camera's next step, as `ctl cameras` gives it
    for tail in ("\\", "[", "]", "[b"):  # text that would escape or open the markup after it
        assert tail in to_content(CamerasView.why_text([{**hostile, "reason": f"x {tail}"}], "c[b]1")).plain
    assert CamerasView.why_text([hostile], "other") == ""


async def test_s_on_a_camera_saves_its_newest_frame_and_shows_the_file(make_daemon, tmp_path: Path) -> None:
    import cv2

    clip = write_clip(tmp_path / "door.mp4", 64, 48, frames=30)
    d = make_daemon(MODELS + camera_pipeline("cams") + camera("door", str(clip)), head=DAEMON_HEAD)
    app = TopApp(LiveFeed(Endpoints(d.admin_endpoint, d.stats_endpoint)))
    async with app.run_test(size=(200, 24)) as pilot:  # wide enough for the test's long path on one line
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("8")
        table = app.cameras_view.query_one(CamerasTable)
        await until(pilot, lambda: table.cell_text("door", "served") not in ("", "0"), timeout=30,
                    what="door's frames served")
        table.focus()
        await pilot.press("S")
        await until(pilot, lambda: "snapshot of door: /" in screen_text(app), timeout=30, what="the path shown")
        shown = getattr(app.cameras_view, "_snapshot")
        path = Path(shown.rpartition(": ")[2])
        assert path.parent.name == "door" and path.suffix == ".jpg"
        image = cv2.imread(str(path))
        assert image is not None and image.shape[:2] == (48, 64)
        columns = image.mean(axis=(0, 2))  # the clip's frame: one bright bar on a dark background
        assert columns.max() > 150 and np.median(columns) < 60, columns


def test_a_refused_snapshot_shows_the_daemons_words_escaped() -> None:
    line = CamerasView.snapshot_text("c[b]1", {"ok": False, "error": "camera 'c[b]1' has no frame [red]yet\x1b"})
    assert line.startswith("[red]no snapshot of c\\[b]1:[/]") and "\\[red]yet\\x1b" in line


def test_a_cameras_zone_and_line_counts_are_under_the_table_escaped() -> None:
    counted = {"camera": "front", "state": "streaming", "zones": {"door": {"person": 2, "car": 0}},
               "lines": {"gate": {"in": {"car[b]": 3}, "out": {}}}}
    assert CamerasView.why_text([counted], "front") == ("[dim]front[/] zone door: person 2 · line gate: in "
                                                          "car\\[b] 3 / out 0")
    assert CamerasView.why_text([{**counted, "zones": {}, "lines": {}}], "front") == ""
