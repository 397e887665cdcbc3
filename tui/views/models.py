"""The models table: one row per model version, live."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from infermux import format as fmt
from infermux.tui import markup
from infermux.tui.history import History
from infermux.tui.views.table import Cell, Col, KeyedTable


def version_label(m: dict[str, Any]) -> str:
    """The version, marked `@` when it is pinned and `*` when it is the default that takes the model's
    requests; not under a weighted split, where the SHARE column says where they go."""
    split = m.get("traffic_share") not in (None, 100.0, 100)
    return str(m["version"]) + ("@" if m.get("pinned") else "*" if m.get("default") and not split else "")


def share_text(m: dict[str, Any]) -> str:
    """The share of the model's requests (those naming no version) this version takes: `90%`; `-` when
    it depends on each request's key (hash) or the daemon does not say."""
    share = m.get("traffic_share")
    return "-" if share is None else f"{share:.0f}%"


def queue_style(depth: int, limit: int) -> str:
    if limit and depth >= limit:
        return "bold red"
    if limit and depth * 2 >= limit:
        return "yellow"
    return ""


def _stat(name: str) -> Callable[[dict[str, Any]], float]:
    return lambda m: float((m.get("stats") or {}).get(name) or 0)


def error_share(m: dict[str, Any]) -> tuple[float, float]:
    """(error replies, all replies) per second over the stats window: the ERR% column's parts."""
    st = m.get("stats") or {}
    errors = float(st.get("error_qps") or 0)
    return errors, errors + float(st.get("qps") or 0)


def _error_rate(m: dict[str, Any]) -> float:
    errors, replies = error_share(m)
    return errors / replies if replies else 0.0


#: The orders `s` cycles through (after the daemon's own), each largest first; keys are column keys.
SORTS: dict[str, Callable[[dict[str, Any]], float]] = {
    "qps": _stat("qps"), "p99": _stat("p99_us"),
    "errors": lambda m: float(((m.get("stats") or {}).get("by_status") or {}).get("500", 0)),
    "error_rate": _error_rate,
    "memory": lambda m: float(m.get("memory_bytes") or 0),
}

#: What the sort notification calls each order.
SORT_NAMES = {"qps": "QPS", "p99": "p99", "errors": "500s", "error_rate": "error rate", "memory": "memory"}

TREND_CELLS = 6  # the QPS sparkline: 30 s of snapshots in 6 bars


class ModelsTable(KeyedTable):
    """name, version, placement, state, traffic share (weights), contexts, queue, QPS and its trend,
    p99, 500s, error rate; on wider terminals also in flight, p50 and memory."""

    COLUMNS = (
        Col("model", "MODEL", 14), Col("version", "VER", 4), Col("place", "PLACE", 6),
        Col("state", "STATE", 9), Col("share", "SHARE", 6, True), Col("contexts", "CTX", 4, True),
        Col("queue", "QUEUE", 6, True),
        Col("in_flight", "INFL", 5, True, optional=True), Col("qps", "QPS", 6, True),
        Col("trend", "TREND", TREND_CELLS + 1), Col("p50", "P50", 6, True, optional=True),
        Col("p99", "P99", 6, True), Col("errors", "ERR", 5, True), Col("error_rate", "ERR%", 6, True),
        Col("memory", "MEM", 6, True, optional=True),
    )

    #: Only rows whose model:version holds this text (the `/` key); "" shows all.
    filter_text = ""
    #: The column rows are sorted by, largest first (the `s` key cycles SORTS); "" keeps the daemon's order.
    sort_by = ""
    #: Recent QPS per version (the app's), for the TREND sparklines; None: no trend.
    history: History | None = None

    def header(self, col: Col) -> str:
        return col.label + ("▼" if col.key == self.sort_by else "")

    def update_from(self, snapshot: dict[str, Any]) -> None:
        needle = self.filter_text.lower()
        models = [m for m in snapshot.get("models", []) if needle in fmt.version_key(m).lower()]
        if self.sort_by:
            models.sort(key=SORTS[self.sort_by], reverse=True)
        self.sync(self.row_cells({"models": models}, self.history))

    @staticmethod
    def row_cells(snapshot: dict[str, Any], history: History | None = None) -> Iterator[tuple[str, dict[str, Cell]]]:
        for m in snapshot.get("models", []):
            st = m.get("stats") or {}
            key = fmt.version_key(m)
            errors, replies = error_share(m)
            failed = int((st.get("by_status") or {}).get("500", 0))  # the backend or infermux failed
            trend = list(history.qps.get(key, ())) if history is not None else []
            yield key, {
                "model": (m["name"], "bold" if m.get("default") else ""),
                "version": (version_label(m), ""),
                "place": (m.get("placement", ""), "cyan" if m.get("placement") == "cold" else ""),
                "state": (m.get("state", ""), markup.STATE_STYLE.get(m.get("state", ""), "")),
                "share": (share_text(m), "dim" if not m.get("traffic_share") else ""),
                "contexts": (str(m.get("contexts", "")), ""),
                "queue": (str(m.get("queue_depth", 0)), queue_style(m.get("queue_depth", 0), m.get("max_queue", 0))),
                "in_flight": (str(m.get("in_flight", 0)), ""),
                "qps": (fmt.rate(st.get("qps")), "red" if errors else ""),
                "trend": (fmt.spark(trend, TREND_CELLS), "cyan"),
                "p50": (fmt.us(st.get("p50_us")), ""),
                "p99": (fmt.us(st.get("p99_us")), ""),
                "errors": (fmt.count(failed), "bold red" if failed else "dim"),
                "error_rate": (fmt.percent(errors, replies), "bold red" if errors else "dim"),
                "memory": (fmt.size(m.get("memory_bytes")), ""),
            }
