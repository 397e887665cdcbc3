"""The routing view: strategy, weights, fallbacks and pinned versions (edited with keys)."""

from __future__ import annotations

from typing import Any, Iterator

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from infermux import format as fmt
from infermux.tui import markup
from infermux.tui.views.table import Cell, Col, KeyedTable


def weight_share(models: list[dict[str, Any]]) -> dict[str, str]:
    """Each version's weight as a share of its model's total ("-" where no weights are set)."""
    totals: dict[str, int] = {}
    for m in models:
        totals[m["name"]] = totals.get(m["name"], 0) + int(m.get("weight") or 0)
    return {fmt.version_key(m): (f"{100 * int(m.get('weight') or 0) / totals[m['name']]:.0f}%"
                                 if totals[m["name"]] else "-") for m in models}


def weights_text(snapshot: dict[str, Any], name: str) -> str:
    """A model's current weights as the editor shows them: `1:90,2:10` (zeros when unset)."""
    return ",".join(f"{m['version']}:{int(m.get('weight') or 0)}"
                    for m in snapshot.get("models", []) if m["name"] == name)


class RoutingTable(KeyedTable):
    COLUMNS = (
        Col("model", "MODEL", 16), Col("version", "VER", 5), Col("state", "STATE", 9),
        Col("strategy", "STRATEGY", 13), Col("weight", "WEIGHT", 7, True), Col("share", "SHARE", 6, True),
        Col("default", "ROLE", 9), Col("fallback", "FALLBACK", 14),
    )

    def update_from(self, snapshot: dict[str, Any]) -> None:
        self.sync(self.row_cells(snapshot))

    @staticmethod
    def row_cells(snapshot: dict[str, Any]) -> Iterator[tuple[str, dict[str, Cell]]]:
        models = snapshot.get("models", [])
        shares = weight_share(models)
        for m in models:
            key = fmt.version_key(m)
            role = "pinned" if m.get("pinned") else "default" if m.get("default") else ""
            yield key, {
                "model": (m["name"], ""), "version": (str(m["version"]), ""),
                "state": (m.get("state", ""), markup.STATE_STYLE.get(m.get("state", ""), "")),
                "strategy": (m.get("strategy", ""), ""),
                "weight": (str(m.get("weight", 0)), ""), "share": (shares[key], ""),
                "default": (role, "bold yellow" if role == "pinned" else "bold" if role else ""),
                "fallback": (("→ " + m["fallback"]) if m.get("fallback") else "-", ""),
            }


class RoutingView(Vertical):
    DEFAULT_CSS = """
    RoutingView #routing-head { height: 2; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="routing-head")
        yield RoutingTable(id="routing-table")

    def update_from(self, snapshot: dict[str, Any]) -> None:
        head = self.query("#routing-head")
        if not head:  # not composed yet, or being removed as the console closes: the next snapshot
            return
        routing = (snapshot.get("daemon") or {}).get("routing") or {}
        text = (f"strategy [b]{routing.get('strategy', '-')}[/] · version mismatch "
                f"[b]{routing.get('version_mismatch', '-')}[/]\n"
                "[dim]w weights · f fallback · p pin/unpin the selected version[/]")
        if getattr(self, "_head", None) != text:
            self._head = text
            head.first(Static).update(text, layout=False)
        self.query_one(RoutingTable).update_from(snapshot)
