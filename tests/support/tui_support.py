"""Helpers for the console tests: read the screen as text, wait for a condition."""

from __future__ import annotations

import io
import time
from typing import Any, Callable

from rich.console import Console
from textual.app import App
from textual.pilot import Pilot

from infermux.tui.feed import StaticFeed


def screen_text(app: App) -> str:
    """What the terminal shows right now, as plain text (the same render as a screenshot)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def until(pilot: Pilot, condition: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    """Let the app run until `condition()` is true; fail with the screen if it never is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}:\n{screen_text(pilot.app)}")


class AnsweringFeed(StaticFeed):
    """A stand-in for the daemon's admin socket: fixed snapshots, and `answers[cmd]` as each command's reply.

    For what the console makes of a reply (titles, texts); what the daemon replies is tested against real daemons."""

    def __init__(self, snapshot: dict[str, Any], answers: dict[str, dict[str, Any]]) -> None:
        super().__init__(snapshot)
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        self.calls.append((cmd, args))
        return self.answers.get(cmd, {"ok": False, "error": f"no answer for {cmd}"})
