"""The console's sinks panel (under the pipelines tab) against a real daemon whose tracked objects' events
go to a file and to a webhook nobody listens on; hidden on a daemon without sinks."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models, tracking  # noqa: E402
from support.harness import Daemon, dealer, free_port  # noqa: E402
from support.sinks import events_daemon, jsonl, webhook  # noqa: E402
from support.tracking import detecting, replay  # noqa: E402
from support.tui_support import screen_text, until  # noqa: E402

from infermux.tui.app import TopApp  # noqa: E402
from infermux.tui.feed import Endpoints, LiveFeed, StaticFeed  # noqa: E402
from infermux.tui.views.sinks import SinksPanel, SinksTable  # noqa: E402


def config_text(workdir: Path) -> str:
    return events_daemon(workdir / "engines", detecting("tracked", min_frames=2, end_after_s=1.0),
                         jsonl(workdir / "events.jsonl"),
                         webhook("hook", f"http://127.0.0.1:{free_port()}/nobody", timeout_s=0.5, max_events=4,
                                 retry_s=0.1, max_retry_s=0.2))


async def test_the_sinks_panel_shows_a_sink_up_and_one_down_with_its_backlog_and_oldest(tmp_path: Path) -> None:
    models.brightness_map(tmp_path / "engines" / "det" / "1" / "model.onnx")
    d = Daemon(tmp_path, config_text(tmp_path)).start()
    try:
        with dealer(d.endpoint) as sock:
            assert set(replay(sock, "tracked", tracking.crossing(), "cam-a", frames=20).statuses) == {200}
        app = TopApp(LiveFeed(Endpoints(d.admin_endpoint, d.stats_endpoint)))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
            await pilot.press("6")
            panel = app.pipelines_view.query_one(SinksPanel)
            table = panel.query_one(SinksTable)
            await until(pilot, lambda: sorted(table.keys()) == ["files", "hook"], what="both sinks' rows")
            await until(pilot, lambda: table.cell_text("files", "state") == "up"
                        and table.cell_text("files", "delivered") != "0", timeout=30, what="the file sink up")
            await until(pilot, lambda: table.cell_text("hook", "state") == "down"
                        and table.cell_text("hook", "backlog") == "4", timeout=30, what="the webhook down, full")
            assert panel.display and table._cells["hook"]["state"][1] == "bold red"
            assert table.cell_text("hook", "bound") == "4" and table.cell_text("hook", "oldest") != "-"
            assert table._cells["hook"]["backlog"][1] == "yellow"  # over 80% of its bound, as the alert says
            assert table.cell_text("files", "oldest") == "-" and table.cell_text("files", "backlog") == "0"
            await until(pilot, lambda: "1 down" in screen_text(app), what="the head counting the sink down")
            assert "Connection" in table.cell_text("hook", "error")  # refused: at 100 columns the error shows
    finally:
        assert d.stop() == 0, d.log()[-4000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]


async def test_without_sinks_the_panel_is_hidden_and_the_pipelines_keep_the_tab() -> None:
    app = TopApp(StaticFeed({"time": 0.0, "daemon": {}, "models": [], "pipelines": []}))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("6")
        await until(pilot, lambda: "no pipelines" in screen_text(app), what="the empty state")
        assert not app.pipelines_view.query_one(SinksPanel).display and "Sinks" not in screen_text(app)


def test_a_brokers_text_reaches_the_screen_printable_and_never_as_markup() -> None:
    hostile = {"name": "s[b]1", "kind": "mqtt", "state": "down", "backlog": 3, "max_events": 10,
               "oldest_age_s": 75.0, "delivered": 0, "dropped": 0, "last_error": "[red]no[/red]\x1b[2J"}
    (key, cells), = SinksTable.row_cells([hostile])
    assert key == "s[b]1" and cells["error"][0] == "  [red]no[/red]\\x1b[2J" and cells["oldest"][0] == "1m15s"
    assert "s[b]1" not in SinksPanel.head_text([hostile]) and "1 down" in SinksPanel.head_text([hostile])
