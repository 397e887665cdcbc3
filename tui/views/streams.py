"""The streams view: per (model or pipeline, key), what a camera sends and what it gets back.

It reads the snapshot's `streams` (execution/streams.py, the same figures
admin `streams` and Prometheus show): frames per second in and served over
the last seconds, the share dropped (superseded, refused or failed), the
age of served frames at p99 (receipt to reply), and how long ago the
stream last sent; wider terminals add the counts, CLIENT the frames its
client replaced before sending them. A stream that went silent is red: a camera that stops is
the first thing an operator wants to know.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from infermux import format as fmt
from infermux.tui.views.table import Cell, Col, KeyedTable

EMPTY = ("no streams: requests that carry a \"key\" (a camera id) show here\n"
         "[dim]docs/protocol.md, \"Streams\": queue_policy = \"newest_per_key\" keeps each camera's newest frame[/]")
HEAD = ("{n} · rates over the last 5 s\n"
        "[dim]DROP: superseded, refused, failed · red: no frame for {silent} s · s sort · / filter[/]")


def drop_share(s: dict[str, Any]) -> tuple[float, float]:
    """(dropped, received) per second: the DROP% column's parts."""
    return float(s.get("fps_dropped") or 0), float(s.get("fps_in") or 0)


def _drop_rate(s: dict[str, Any]) -> float:
    dropped, received = drop_share(s)
    return dropped / received if received else 0.0


def _age_p99(s: dict[str, Any]) -> float:
    return float((s.get("age_ms") or {}).get("p99") or 0)


#: The orders `s` cycles through (after the daemon's: by model, then key), each largest first.
SORTS: dict[str, Callable[[dict[str, Any]], float]] = {
    "fps_in": lambda s: float(s.get("fps_in") or 0), "fps_served": lambda s: float(s.get("fps_served") or 0),
    "drop": _drop_rate, "age": _age_p99, "seen": lambda s: float(s.get("last_seen_s") or 0),
}
SORT_NAMES = {"fps_in": "frames in", "fps_served": "frames served", "drop": "drop rate", "age": "age p99",
              "seen": "time since last seen"}


def stream_key(s: dict[str, Any]) -> str:
    """The row key of a stream: model/key."""
    return f"{s['model']}/{s['key']}"


def seen(seconds: float) -> str:
    """How long ago the stream last sent: now / 12s / 3m05s."""
    return "now" if seconds < 1 else fmt.duration(seconds)


class StreamsTable(KeyedTable):
    """A row per stream, keyed `model/key`: frames in and served per second, drop %, age p99, last seen;
    wider terminals add the cumulative counts."""

    COLUMNS = (
        Col("model", "MODEL", 13), Col("key", "STREAM", 14), Col("fps_in", "FPS IN", 7, True),
        Col("fps_served", "SERVED/S", 9, True), Col("drop", "DROP%", 6, True), Col("age", "AGE P99", 8, True),
        Col("seen", "LAST SEEN", 13, True), Col("received", "RECEIVED", 9, True, optional=True),
        Col("superseded", "409", 6, True, optional=True), Col("client", "CLIENT", 7, True, optional=True),
        Col("refused", "REFUSED", 8, True, optional=True),
    )

    #: Only rows whose model/key holds this text (the `/` key); "" shows all.
    filter_text = ""
    #: The column rows are sorted by, largest first (the `s` key cycles SORTS); "" keeps model, key order.
    sort_by = ""

    def header(self, col: Col) -> str:
        return col.label + ("▼" if col.key == self.sort_by else "")

    def update_from(self, snapshot: dict[str, Any]) -> None:
        needle = self.filter_text.lower()
        shown = [s for s in (snapshot.get("streams") or {}).get("shown") or [] if needle in stream_key(s).lower()]
        if self.sort_by:
            shown.sort(key=SORTS[self.sort_by], reverse=True)
        self.sync(self.row_cells(shown))

    def action_select(self) -> None:
        """Enter does nothing here: the detail screen is a model version's, and a stream is not one."""

    @staticmethod
    def row_cells(streams: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Cell]]]:
        for s in streams:
            silent = bool(s.get("silent"))
            red = "bold red" if silent else ""
            dropped, received = drop_share(s)
            p99 = (s.get("age_ms") or {}).get("p99")
            yield stream_key(s), {
                "model": (str(s["model"]), red),
                "key": (fmt.printable(s["key"]), red or "bold"),
                "fps_in": (fmt.rate(s.get("fps_in")), red),
                "fps_served": (fmt.rate(s.get("fps_served")), red),
                "drop": (fmt.percent(dropped, received), red or ("yellow" if dropped else "dim")),
                "age": (fmt.us(p99 * 1000 if p99 is not None else None), red),
                "seen": (("SILENT " if silent else "") + seen(float(s.get("last_seen_s") or 0)), red),
                "received": (fmt.count(int(s.get("received") or 0)), red),
                "superseded": (fmt.count(int(s.get("superseded") or 0)), red or "dim"),
                "client": (fmt.count(int(s.get("replaced_by_client") or 0)), red or "dim"),
                "refused": (fmt.count(int(s.get("refused") or 0)), red or ("yellow" if s.get("refused") else "dim")),
            }


class StreamsView(Vertical):
    """A line saying how to read the table (or that there are no streams), the table below."""

    DEFAULT_CSS = """
    StreamsView #streams-head { height: 2; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="streams-head")
        yield StreamsTable(id="streams-table")

    def update_from(self, snapshot: dict[str, Any]) -> None:
        head = self.query("#streams-head")
        if not head:  # not composed yet, or being removed as the console closes: the next snapshot
            return
        streams = snapshot.get("streams") or {}
        total, shown = int(streams.get("total") or 0), len(streams.get("shown") or [])
        silent = sum(1 for s in streams.get("shown") or [] if s.get("silent"))
        count = f"{total} stream{'s' if total != 1 else ''}" + (f" ({shown} shown)" if shown < total else "")
        if silent:
            count += f" · [bold red]{silent} silent[/]"
        text = HEAD.format(n=count, silent=f"{float(streams.get('silent_s') or 5):g}") if total else EMPTY
        if getattr(self, "_head", None) != text:
            self._head = text
            head.first(Static).update(text, layout=False)
        self.query_one(StreamsTable).update_from(snapshot)
