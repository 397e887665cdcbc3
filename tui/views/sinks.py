"""The sinks panel, under the pipelines whose events they take: per sink, its state, backlog and
oldest waiting event.

It reads the snapshot's `sinks` (sinks/hub.py's view, the same entries `infermux ctl sinks` and
the `infermux_sink_*` series show): the state, coloured (red: down, yellow: starting), the events
waiting in its spool against its bound, the age of the oldest, delivered and dropped; wider
terminals add the last error. The panel is hidden while the daemon has no sinks, so the pipelines
keep the whole tab.

A sink's last error is a broker's or an HTTP server's text: cells are plain text (never markup)
passed through format.printable; the line above the table holds only counts.
"""

from __future__ import annotations

from typing import Any, Iterator

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from infermux import format as fmt
from infermux.tui.views.table import Cell, Col, KeyedTable

#: A state's style; a state not listed is shown plain.
STATE_STYLES = {"up": "green", "starting": "yellow", "down": "bold red"}
NEAR_FULL = 0.8  # a backlog over this share of its spool's bound is shown yellow, as the alert rule fires


def _age(seconds: Any) -> str:
    return "-" if seconds is None else fmt.duration(float(seconds))


class SinksTable(KeyedTable):
    """A row per sink, keyed by its name: kind, state, backlog (and its bound), oldest waiting,
    delivered, dropped; wider terminals add the last error."""

    COLUMNS = (
        Col("sink", "SINK", 12), Col("kind", "KIND", 8), Col("state", "STATE", 9),
        Col("backlog", "BACKLOG", 8, True), Col("bound", "OF", 8, True), Col("oldest", "OLDEST", 8, True),
        Col("delivered", "DELIVERED", 10, True), Col("dropped", "DROPPED", 8, True),
        Col("error", "  LAST ERROR", 40, optional=True),
    )

    def update_from(self, snapshot: dict[str, Any]) -> None:
        self.sync(self.row_cells(list(snapshot.get("sinks") or [])))

    def action_select(self) -> None:
        """Enter does nothing here: the detail screen is a model version's, and a sink is not one."""

    @staticmethod
    def row_cells(sinks: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Cell]]]:
        for s in sinks:
            state = str(s.get("state") or "?")
            style = STATE_STYLES.get(state, "")
            backlog, bound = int(s.get("backlog") or 0), int(s.get("max_events") or 0)
            full = "yellow" if bound and backlog > NEAR_FULL * bound else ""
            yield str(s.get("name")), {
                "sink": (fmt.printable(s.get("name", "?")), "bold red" if state == "down" else "bold"),
                "kind": (fmt.printable(s.get("kind", "?")), ""),
                "state": (fmt.printable(state), style),
                "backlog": (fmt.count(backlog), full or ("" if backlog else "dim")),
                "bound": (fmt.count(bound), "dim"),
                "oldest": (_age(s.get("oldest_age_s")), full),
                "delivered": (fmt.count(int(s.get("delivered") or 0)), ""),
                "dropped": (fmt.count(int(s.get("dropped") or 0)), "yellow" if s.get("dropped") else "dim"),
                "error": ("  " + fmt.printable(s.get("last_error") or "", 300), "dim"),
            }


class SinksPanel(Vertical):
    """A line counting the sinks (and those down, and what waits), and the table; hidden without sinks."""

    DEFAULT_CSS = """
    SinksPanel { height: 9; display: none; }
    SinksPanel #sinks-head { height: 1; padding: 0 1; }
    SinksPanel SinksTable { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="sinks-head")
        yield SinksTable(id="sinks-table")

    def update_from(self, snapshot: dict[str, Any]) -> None:
        head = self.query("#sinks-head")
        if not head:  # not composed yet, or being removed as the console closes: the next snapshot
            return
        sinks = list(snapshot.get("sinks") or [])
        if self.display != bool(sinks):
            self.display = bool(sinks)
        self.query_one(SinksTable).update_from(snapshot)
        text = self.head_text(sinks)
        if getattr(self, "_head", None) != text:  # unchanged text: no repaint
            self._head = text
            head.first(Static).update(text, layout=False)

    @staticmethod
    def head_text(sinks: list[dict[str, Any]]) -> str:
        """The line above the table: how many sinks, how many down, how many events wait in all."""
        text = f"[b]Sinks[/] · {len(sinks)} sink{'s' if len(sinks) != 1 else ''}"
        down = sum(1 for s in sinks if s.get("state") == "down")
        if down:
            text += f" · [bold red]{down} down[/]"
        waiting = sum(int(s.get("backlog") or 0) for s in sinks)
        return text + f" · {fmt.count(waiting)} waiting [dim](infermux ctl sinks: the last errors)[/]"
