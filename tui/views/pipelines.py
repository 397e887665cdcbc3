"""The pipelines view: each pipeline's frames by status, and each step's runs, errors and latency.
A 409 (a frame replaced by a newer one of its stream under newest_per_key) is the policy working:
counted in the 409 column (and STATUS), never in ERR.

It reads the snapshot's `pipelines` list (daemon/pipelines/stats.py, the
same figures `infermux status` and Prometheus show). A step's run is one
pass over a frame, or over all of a frame's crops for a `for_each` step.
"""

from __future__ import annotations

from typing import Any, Iterator

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from infermux import format as fmt
from infermux.tui.views.sinks import SinksPanel
from infermux.tui.views.table import Cell, Col, KeyedTable

EMPTY = ("no pipelines: this daemon's configuration has no \\[\\[pipelines]] section\n"
         "[dim]docs/pipelines.md says how to write one; R reloads the file[/]")
HEAD = ("{n} · a step's run is one frame (a for-each step's: all its crops)\n"
        "[dim]STATUS: the pipeline's replies by status · queue: frames waiting/threads[/]")


def statuses(stats: dict[str, Any]) -> str:
    """`200:40 400:2` — the replies by status, 200 first, then by code."""
    by = stats.get("by_status") or {}
    return " ".join(f"{code}:{by[code]}" for code in sorted(by, key=lambda c: (c != "200", c))) or "-"


def runs_on(step: dict[str, Any]) -> str:
    """What a step runs: `→ model` or its processor, `each region` for a fan-out step; what a track
    step holds (`12 tracks/3 streams`) and how often a re-inferred step reused an answer (`reused 80%`)."""
    what = f"→ {step['model']}" if step.get("model") else str(step.get("processor", ""))
    what += " · each region" if step.get("for_each") else ""
    tracking = step.get("tracking")
    if tracking:
        what += f" · {tracking['tracks']} tracks/{tracking['streams']} streams"
    reinfer = step.get("reinfer")
    if reinfer:
        total = reinfer["computed"] + reinfer["reused"] + reinfer["skipped"]
        what += f" · reused {reinfer['reused'] / total:.0%}" if total else " · reused -"
        what += f", skipped {fmt.count(reinfer['skipped'])}" if reinfer["skipped"] else ""
    return what


class PipelinesTable(KeyedTable):
    """A row per pipeline (its frames), under it a row per step; keys `pipeline` and `pipeline/step`."""

    COLUMNS = (
        Col("name", "PIPELINE / STEP", 16), Col("ok", "OK", 7, True), Col("rate", "FPS", 6, True),
        Col("superseded", "409", 6, True, optional=True), Col("errors", "ERR", 5, True),
        Col("p50", "P50", 7, True), Col("p99", "P99", 7, True),
        Col("detail", "STATUS / RUNS ON", 30),
    )

    def update_from(self, snapshot: dict[str, Any]) -> None:
        self.sync(self.row_cells(snapshot))

    def action_select(self) -> None:
        """Enter does nothing here: the detail screen is a model version's, and a row here is not one."""

    @staticmethod
    def row_cells(snapshot: dict[str, Any]) -> Iterator[tuple[str, dict[str, Cell]]]:
        for p in snapshot.get("pipelines") or []:
            frames = p.get("frames") or {}
            failed = fmt.failures(frames)
            queue = f"  queue {p.get('queued', 0)}/{p.get('workers', '?')}"
            if p.get("refused_from_memory"):  # the same refused frame sent again (docs/pipelines.md#bounds)
                queue += f"  refused again {fmt.count(p['refused_from_memory'])}"
            if p.get("dropped_regions"):  # boxes a model gave as NaN or infinity (docs/pipelines.md#bounds)
                queue += f"  NaN boxes {fmt.count(p['dropped_regions'])}"
            yield p["name"], _cells((p["name"], "bold"), frames, failed, (statuses(frames) + queue, ""))
            for name, step in (p.get("steps") or {}).items():
                yield f"{p['name']}/{name}", _cells((f"  {name}", ""), step, fmt.failures(step),
                                                     (runs_on(step), "cyan" if step.get("model") else "dim"))


def _cells(name: Cell, stats: dict[str, Any], failed: int, detail: Cell) -> dict[str, Cell]:
    return {"name": name, "ok": (fmt.count(int(stats.get("served") or 0)), ""),
            "rate": (fmt.rate(stats.get("qps")), ""), "errors": (fmt.count(failed), "bold red" if failed else "dim"),
            "superseded": (fmt.count(fmt.superseded(stats)), "" if fmt.superseded(stats) else "dim"),
            "p50": (fmt.us(stats.get("p50_us")), ""), "p99": (fmt.us(stats.get("p99_us")), ""), "detail": detail}


class PipelinesView(Vertical):
    """A line saying how to read the table (or that there are no pipelines), the table below, and
    under it the sinks their events go to (while the daemon has any)."""

    DEFAULT_CSS = """
    PipelinesView #pipelines-head { height: 2; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="pipelines-head")
        yield PipelinesTable(id="pipelines-table")
        yield SinksPanel(id="sinks")

    def update_from(self, snapshot: dict[str, Any]) -> None:
        head = self.query("#pipelines-head")
        if not head:  # not composed yet, or being removed as the console closes: the next snapshot
            return
        count = len(snapshot.get("pipelines") or [])
        text = HEAD.format(n=f"{count} pipeline{'s' if count != 1 else ''}") if count else EMPTY
        if getattr(self, "_head", None) != text:
            self._head = text
            head.first(Static).update(text, layout=False)
        self.query_one(PipelinesTable).update_from(snapshot)
        self.query_one(SinksPanel).update_from(snapshot)
