"""The console's streams tab against a real daemon: a camera's row, live, and red once it stops sending."""

from __future__ import annotations

import asyncio

import numpy as np

from support.harness import DAEMON_HEAD
from support.tui_support import screen_text, until

from infermux.tui.app import TopApp
from infermux.tui.feed import Endpoints, LiveFeed
from infermux.tui.views.streams import StreamsTable

FAST = '[[models]]\nname = "fast"\nengine = "fast512/1/model.onnx"\nqueue_policy = "newest_per_key"\n'
ROW = np.ones((1, 512), np.float32)


def send(d, key: str, n: int) -> None:
    with d.client() as client:
        for _ in range(n):
            assert client.infer("fast", {"x": ROW}, key=key).status == 200


async def test_the_streams_tab_follows_a_camera_and_shows_it_red_when_it_stops(make_daemon) -> None:
    d = make_daemon(FAST, head=DAEMON_HEAD + "stream_silent_s = 1.0\n")
    await asyncio.to_thread(send, d, "gate-1", 20)
    app = TopApp(LiveFeed(Endpoints(d.admin_endpoint, d.stats_endpoint)))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("7")
        table = app.streams_view.query_one(StreamsTable)
        await until(pilot, lambda: table.keys() == ["fast/gate-1"], what="the camera's row")
        await until(pilot, lambda: table.cell_text("fast/gate-1", "seen").startswith("SILENT"),
                    what="the camera silent")
        assert table._cells["fast/gate-1"]["key"][1] == "bold red" and "1 silent" in screen_text(app)
        assert table.cell_text("fast/gate-1", "received") == "20" and table.cell_text("fast/gate-1", "drop") == "0%"
        await asyncio.to_thread(send, d, "gate-1", 3)  # it sends again: no longer red
        await until(pilot, lambda: not table.cell_text("fast/gate-1", "seen").startswith("SILENT"),
                    what="the camera back")
        assert table.cell_text("fast/gate-1", "received") == "23"


def test_frames_the_client_replaced_count_in_the_drop_share_of_what_the_camera_took() -> None:
    from infermux.tui.views.streams import drop_share

    camera = {"fps_in": 1.0, "fps_dropped": 0.0, "fps_replaced_by_client": 14.0}  # 15 taken, 1 sent, served
    assert drop_share(camera) == (14.0, 15.0)
    (_, cells), = StreamsTable.row_cells([{"model": "ocr", "key": "door", **camera}])
    assert cells["drop"][0] == "93%"
    assert drop_share({"fps_in": 10.0, "fps_dropped": 2.0}) == (2.0, 10.0)  # a daemon before the field: as it was
