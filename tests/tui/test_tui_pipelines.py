"""The console's pipelines tab against a real daemon serving a small pipeline (decode → resize → normalize →
the classifier → classify), and its empty state on a daemon without pipelines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support.harness import DAEMON_HEAD, Daemon  # noqa: E402
from support.tui_support import screen_text, until  # noqa: E402

from infermux.pipelines.wire import send_frame  # noqa: E402
from infermux.tui.app import TopApp  # noqa: E402
from infermux.tui.feed import Endpoints, LiveFeed, StaticFeed  # noqa: E402
from infermux.tui.views.pipelines import PipelinesTable  # noqa: E402

CLASSIFY = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"

[[pipelines]]
name = "classify"
[[pipelines.steps]]
processor = "decode"
[[pipelines.steps]]
processor = "resize"
options = {{ size = [64, 64] }}
[[pipelines.steps]]
processor = "normalize"
[[pipelines.steps]]
name = "net"
model = "classifier"
[[pipelines.steps]]
processor = "classify"
options = {{ k = 2 }}
"""
STEPS = ["decode", "resize", "normalize", "net", "classify"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("tui-pipelines"), (DAEMON_HEAD + CLASSIFY).format(engines=engines)).start()
    yield d
    d.stop()


def frames(d: Daemon, good: int, bad: int) -> None:
    """`good` PNG frames that classify, then `bad` bytes that do not decode (400 at the decode step)."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.endpoint)
    image = cv2.imencode(".png", np.full((32, 48, 3), 90, np.uint8))[1].tobytes()
    try:
        for _ in range(good):
            reply = send_frame(sock, "classify", image, "png")
            assert reply.status == 200 and len(reply.header["classes"][0]) == 2, reply.header
        for _ in range(bad):
            assert send_frame(sock, "classify", b"not a png", "png").status == 400
    finally:
        sock.close()


async def test_the_pipelines_tab_shows_frames_by_status_and_each_steps_runs(daemon: Daemon) -> None:
    await asyncio.to_thread(frames, daemon, 3, 1)
    app = TopApp(LiveFeed(Endpoints(daemon.admin_endpoint, daemon.stats_endpoint)))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("6")
        table = app.pipelines_view.query_one(PipelinesTable)
        await until(pilot, lambda: table.keys() == ["classify", *(f"classify/{s}" for s in STEPS)],
                    what="a row for the pipeline and one per step")
        await until(pilot, lambda: table.cell_text("classify", "errors") == "1", what="the frame that failed")
        assert table.cell_text("classify", "ok") == "3"
        assert table.cell_text("classify", "detail").startswith("200:3 400:1  queue 0/2")
        assert table.cell_text("classify/decode", "ok") == "3" and table.cell_text("classify/decode", "errors") == "1"
        assert table.cell_text("classify/net", "ok") == "3" and table.cell_text("classify/net", "errors") == "0"
        assert table.cell_text("classify/net", "detail") == "→ classifier"
        await asyncio.to_thread(frames, daemon, 2, 0)  # inside the statistics window: latencies show
        await until(pilot, lambda: table.cell_text("classify", "ok") == "5", what="the two frames more")
        assert table.cell_text("classify/net", "p50") != "-" and table.cell_text("classify/net", "p99") != "-"
        await asyncio.to_thread(frames, daemon, 0, 1)  # the same undecodable bytes: refused from memory
        await until(pilot, lambda: table.cell_text("classify", "errors") == "2", what="the frame refused again")
        assert table.cell_text("classify", "detail").endswith("queue 0/2  refused again 1")
        assert table.cell_text("classify/decode", "errors") == "1"  # the step did not run again
        text = screen_text(app)
        assert "1 pipeline ·" in text and "  net" in text and app.focused is table
        await pilot.press("enter")  # a pipeline row is not a model version: no detail screen
        assert app.screen is app.main


async def test_without_pipelines_the_tab_says_how_to_add_one() -> None:
    app = TopApp(StaticFeed({"time": 0.0, "daemon": {}, "models": [], "pipelines": []}))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("6")
        await until(pilot, lambda: "no pipelines" in screen_text(app), what="the empty state")
        assert "[[pipelines]]" in screen_text(app)
        assert app.pipelines_view.query_one(PipelinesTable).keys() == []


async def test_a_track_step_shows_its_tracks_and_a_reinferred_step_how_often_it_reused() -> None:
    steps = {"track": {"processor": "track", "served": 9, "tracking": {"streams": 3, "tracks": 12}},
             "cls": {"model": "classifier", "for_each": "regions", "served": 9,
                     "reinfer": {"computed": 20, "reused": 76, "skipped": 4, "streams": 3, "tracks": 12}}}
    pipeline = {"name": "cams", "queued": 0, "workers": 2, "frames": {"served": 9}, "steps": steps}
    app = TopApp(StaticFeed({"time": 0.0, "daemon": {}, "models": [], "pipelines": [pipeline]}))
    async with app.run_test(size=(100, 24)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("6")
        table = app.pipelines_view.query_one(PipelinesTable)
        await until(pilot, lambda: table.keys() == ["cams", "cams/track", "cams/cls"], what="the rows")
        assert table.cell_text("cams/track", "detail") == "track · 12 tracks/3 streams"
        assert table.cell_text("cams/cls", "detail") == "→ classifier · each region · reused 76%, skipped 4"


async def test_superseded_frames_are_counted_in_their_own_column_never_as_errors() -> None:
    # Under newest_per_key a 409 is the policy working: a camera's newer frame replaced a waiting one.
    frames = {"served": 40, "by_status": {"200": 40, "409": 2325, "400": 1}}
    pipeline = {"name": "cams", "queued": 0, "workers": 2, "frames": frames, "steps": {}}
    app = TopApp(StaticFeed({"time": 0.0, "daemon": {}, "models": [], "pipelines": [pipeline]}))
    async with app.run_test(size=(120, 24)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("6")
        table = app.pipelines_view.query_one(PipelinesTable)
        await until(pilot, lambda: table.keys() == ["cams"], what="the pipeline's row")
        assert table.cell_text("cams", "errors") == "1"  # the 400 alone
        assert table.cell_text("cams", "superseded") == "2325"
        assert "409:2325" in table.cell_text("cams", "detail")


def test_a_pipelines_row_counts_the_regions_it_dropped_for_boxes_that_are_not_numbers() -> None:
    snapshot = {"pipelines": [{"name": "cams", "queued": 0, "workers": 2, "dropped_regions": 3,
                               "frames": {"served": 5, "by_status": {"200": 5}}, "steps": {}}]}
    rows = dict(PipelinesTable.row_cells(snapshot))
    assert rows["cams"]["detail"][0].endswith("queue 0/2  NaN boxes 3")
    del snapshot["pipelines"][0]["dropped_regions"]
    assert "NaN" not in dict(PipelinesTable.row_cells(snapshot))["cams"]["detail"][0]
