"""The models table: one row per model version, live."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from infermux.tui import format as fmt
from infermux.tui.views.table import Cell, Col, KeyedTable


def version_label(m: dict[str, Any]) -> str:
    """The version, marked `*` when it is the model's default and `@` when it is pinned."""
    return str(m["version"]) + ("@" if m.get("pinned") else "*" if m.get("default") else "")


def queue_style(depth: int, limit: int) -> str:
    if limit and depth >= limit:
        return "bold red"
    if limit and depth * 2 >= limit:
        return "yellow"
    return ""


def _stat(name: str) -> Callable[[dict[str, Any]], float]:
    return lambda m: float((m.get("stats") or {}).get(name) or 0)


SORTS: dict[str, Callable[[dict[str, Any]], float]] = {
    "qps": _stat("qps"), "p99": _stat("p99_us"),
    "errors": lambda m: float(((m.get("stats") or {}).get("by_status") or {}).get("500", 0)),
    "memory": lambda m: float(m.get("memory_bytes") or 0),
}


class ModelsTable(KeyedTable):
    """name, version, placement, state, contexts, queue, in flight, QPS, p50, p99, 500s, memory."""

    COLUMNS = (
        Col("model", "MODEL", 15), Col("version", "VER", 5), Col("place", "PLACE", 6),
        Col("state", "STATE", 9), Col("contexts", "CTX", 4, True), Col("queue", "QUEUE", 6, True),
        Col("in_flight", "INFL", 5, True), Col("qps", "QPS", 6, True), Col("p50", "P50", 6, True),
        Col("p99", "P99", 6, True), Col("errors", "ERR", 5, True), Col("memory", "MEM", 6, True),
    )

    #: Only rows whose model:version holds this text (the `/` key); "" shows all.
    filter_text = ""
    #: The column rows are sorted by, largest first (the `s` key cycles SORTS); "" keeps the daemon's order.
    sort_by = ""

    def update_from(self, snapshot: dict[str, Any]) -> None:
        needle = self.filter_text.lower()
        models = [m for m in snapshot.get("models", []) if needle in fmt.version_key(m).lower()]
        if self.sort_by:
            models.sort(key=SORTS[self.sort_by], reverse=True)
        self.sync(self.row_cells({"models": models}))

    @staticmethod
    def row_cells(snapshot: dict[str, Any]) -> Iterator[tuple[str, dict[str, Cell]]]:
        for m in snapshot.get("models", []):
            st = m.get("stats") or {}
            errors = (st.get("error_qps") or 0) > 0
            failed = int((st.get("by_status") or {}).get("500", 0))  # the backend or infermux failed
            yield fmt.version_key(m), {
                "model": (m["name"], "bold" if m.get("default") else ""),
                "version": (version_label(m), ""),
                "place": (m.get("placement", ""), "cyan" if m.get("placement") == "cold" else ""),
                "state": (m.get("state", ""), fmt.STATE_STYLE.get(m.get("state", ""), "")),
                "contexts": (str(m.get("contexts", "")), ""),
                "queue": (str(m.get("queue_depth", 0)), queue_style(m.get("queue_depth", 0), m.get("max_queue", 0))),
                "in_flight": (str(m.get("in_flight", 0)), ""),
                "qps": (fmt.rate(st.get("qps")), "red" if errors else ""),
                "p50": (fmt.us(st.get("p50_us")), ""),
                "p99": (fmt.us(st.get("p99_us")), ""),
                "errors": (fmt.count(failed), "bold red" if failed else "dim"),
                "memory": (fmt.size(m.get("memory_bytes")), ""),
            }
