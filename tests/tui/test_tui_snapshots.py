"""Screenshots of the console's views with fixed data, compared with the committed SVGs.

The app is fed `tui_data` snapshots through a StaticFeed instead of the live
socket, so every figure on screen is fixed; event times are shown in UTC.
After an intended change of the look: `pytest tests/tui/test_tui_snapshots.py
--snapshot-update`, then review the SVGs (a browser shows them) before committing.
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

import pytest

from support import tui_data
from infermux.tui.app import TopApp
from infermux.tui.feed import LinkChanged, StaticFeed

STEPS = 10  # snapshots fed before the screenshot: enough for a sparkline


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def console(stale: bool = False) -> tuple[TopApp, Callable[[Any], Awaitable[None]]]:
    feed = StaticFeed(tui_data.snapshot(0), tui_data.EVENTS)
    app = TopApp(feed, config_path="/etc/infermux/infermux.toml")

    async def fill(pilot: Any) -> None:
        for step in range(STEPS):
            while app.snapshots_seen <= step:  # one at a time: each is a sparkline point
                await pilot.pause(0.01)
            if step + 1 < STEPS:
                feed.push(tui_data.snapshot(step + 1))
        if stale:  # the daemon went away after the last snapshot
            app.post_message(LinkChanged(False, "daemon not reachable at ipc:///run/infermux/admin.sock, retrying"))
            while not app.stale:
                await pilot.pause(0.01)

    return app, fill


VIEWS = {"models": (), "memory": ("2",), "routing": ("3",), "events": ("4",), "log": ("5",), "detail": ("enter",),
         "failed": ("end", "enter"), "keys": ("question_mark",), "stale": (),  # failed: segmenter's whole reason
         "streams": ("7",), "cameras": ("8", "down", "down")}


@pytest.mark.parametrize("view,keys", [pytest.param(v, k, id=v) for v, k in VIEWS.items()])
def test_view_at_80x24(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    app, fill = console(stale=view == "stale")
    assert snap_compare(app, terminal_size=(80, 24), run_before=fill, press=keys)
