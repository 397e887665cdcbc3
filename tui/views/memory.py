"""The memory view: the budget bar, each version's footprint, worker processes."""

from __future__ import annotations

from typing import Any, Iterator

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from infermux import format as fmt
from infermux.tui import markup
from infermux.tui.views.table import Cell, Col, KeyedTable


def bar(used: int, total: int, width: int) -> str:
    """A `[█████░░░░░]` bar of `used` out of `total` (Rich markup)."""
    share = min(1.0, used / total) if total else 0.0
    filled = round(share * width)
    colour = "red" if share > 0.9 else "yellow" if share > 0.7 else "green"
    return f"[{colour}]{'█' * filled}[/][dim]{'░' * (width - filled)}[/]"


def budget_text(snapshot: dict[str, Any]) -> str:
    """Three lines: the models' share of the memory budget, the daemon's RSS and the host, and what
    the budget counts (a daemon's RSS of 1 GB beside "30M of 19G" is not a contradiction)."""
    mem = (snapshot.get("daemon") or {}).get("memory") or {}
    used, budget = mem.get("models_bytes", 0), mem.get("budget_bytes", 0)
    share = f"{100 * used / budget:.1f}%" if budget else "-"
    regions = (snapshot.get("daemon") or {}).get("shared_memory") or {}
    shared = (f" · clients' shared memory {fmt.size(regions['bytes'])} in {regions['regions']} regions"
              if regions.get("regions") else "")
    return (f"models {bar(used, budget, 30)} {fmt.size(used)} of {fmt.size(budget)} budget ({share})\n"
            f"[dim]daemon RSS {fmt.size(mem.get('rss_bytes'))} · host memory {fmt.size(mem.get('total_bytes'))}"
            f"{shared}[/]\n"
            f"[dim]{COUNTED}[/]")


#: What the budget line counts, and what the RSS beside it holds that the budget does not.
COUNTED = ("budget: hot models' engines + contexts, cold models' workers (RSS + GPU);\n"
           "the daemon's RSS also holds Python, libraries and buffers, which it does not")


class MemoryTable(KeyedTable):
    """Footprint per model version, and its worker process where it has one."""

    COLUMNS = (
        Col("model", "MODEL", 16), Col("version", "VER", 5), Col("place", "PLACE", 6), Col("state", "STATE", 9),
        Col("memory", "MEMORY", 8, True), Col("share", "SHARE", 7, True), Col("pid", "PID", 8, True),
        Col("rss", "RSS", 8, True), Col("gpu", "GPU", 8, True),
    )

    def update_from(self, snapshot: dict[str, Any]) -> None:
        self.sync(self.row_cells(snapshot))

    @staticmethod
    def row_cells(snapshot: dict[str, Any]) -> Iterator[tuple[str, dict[str, Cell]]]:
        budget = ((snapshot.get("daemon") or {}).get("memory") or {}).get("budget_bytes", 0)
        for m in snapshot.get("models", []):
            worker = m.get("worker") or {}
            memory = m.get("memory_bytes") or 0
            yield fmt.version_key(m), {
                "model": (m["name"], ""), "version": (str(m["version"]), ""),
                "place": (m.get("placement", ""), ""),
                "state": (m.get("state", ""), markup.STATE_STYLE.get(m.get("state", ""), "")),
                "memory": (fmt.size(memory), ""),
                "share": (f"{100 * memory / budget:.1f}%" if budget else "-", ""),
                "pid": (str(worker.get("pid", "-")), ""),
                "rss": (fmt.size(worker["rss_bytes"]) if "rss_bytes" in worker else "-", ""),
                "gpu": (fmt.size(worker["gpu_bytes"]) if "gpu_bytes" in worker else "-", ""),
            }


class MemoryView(Vertical):
    """Budget on top, the table below."""

    DEFAULT_CSS = """
    MemoryView #budget { height: 4; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="budget")
        yield MemoryTable(id="memory-table")

    def update_from(self, snapshot: dict[str, Any]) -> None:
        budget = self.query("#budget")
        if not budget:  # not composed yet, or being removed as the console closes: the next snapshot
            return
        text = budget_text(snapshot)
        if getattr(self, "_budget", None) != text:
            self._budget = text
            budget.first(Static).update(text, layout=False)
        self.query_one(MemoryTable).update_from(snapshot)
