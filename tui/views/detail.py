"""One model version in depth: trends, batch sizes, per-context queues, settings, its events."""

from __future__ import annotations

from typing import Any, Iterator

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Sparkline, Static

from infermux import format as fmt
from infermux.tui import markup
from infermux.tui.history import History
from infermux.tui.views.events import EventStore, EventsLog
from infermux.tui.views.table import Cell, Col, KeyedTable
from infermux.tui.markup import escape


BATCHES_WIDTH = 30  # the histogram's column, padding included


def head_text(m: dict[str, Any]) -> str:
    role = "pinned" if m.get("pinned") else "default" if m.get("default") else "not default"
    state = m.get("state", "")
    lines = [f"[b]{escape(fmt.version_key(m))}[/]  [{markup.STATE_STYLE.get(state, '')}]{state}[/] · "
             f"{m.get('placement', '')} · {role} · {m.get('contexts', 0)} context(s)",
             f"memory {fmt.size(m.get('memory_bytes'))} · loaded in {m.get('last_load_ms', 0)} ms · "
             f"[dim]{escape(str(m.get('backend', '')))} {escape(str(m.get('engine', '')))}[/]"]
    return "\n".join(lines)


def reason_text(m: dict[str, Any]) -> str:
    """Why the version failed or is not serving, whole: it wraps instead of being cut at 80 columns.

    A candidate's reason is its shadowing progress (docs/hot-swap.md#shadow-rollout), not a fault.
    """
    if not m.get("reason"):
        return ""
    if m.get("state") == "candidate":
        return (f"[cyan]{escape(str(m['reason']))}[/]\n[dim]infermux ctl promote-now / reject "
                f"{escape(m.get('name', ''))} {escape(m.get('version', ''))} decides now[/]")
    return f"[red]{escape(str(m['reason']))}[/]"


def settings_text(m: dict[str, Any]) -> str:
    st = m.get("stats") or {}
    by_status = " ".join(f"{k}:{v}" for k, v in sorted((st.get("by_status") or {}).items())) or "-"
    fallback = f"→ {escape(m['fallback'])}" if m.get("fallback") else "none"
    return "\n".join([
        f"served [b]{st.get('served', 0)}[/] · errors {fmt.rate(st.get('error_qps'))}/s",
        f"status {by_status}",
        f"p50 {fmt.us(st.get('p50_us'))} p90 {fmt.us(st.get('p90_us'))} p99 {fmt.us(st.get('p99_us'))} "
        f"max {fmt.us(st.get('max_us'))}",
        f"queue {fmt.us(st.get('queue_us'))} · compute {fmt.us(st.get('compute_us'))}",
        f"max_queue {m.get('max_queue')} · timeout {m.get('timeout_ms')} ms",
        f"max_batch {m.get('max_batch')} · batch delay {m.get('batch_delay_us')} µs",
        f"fallback {fallback} · weight {m.get('weight', 0)}",
        f"strategy {escape(str(m.get('strategy', '')))}",
        *live_lines(m),
        *tensor_lines(m),
    ])


def live_lines(m: dict[str, Any]) -> list[str]:
    """The settings an operator changed live, each with the configuration's value."""
    changed = m.get("overrides") or {}
    if not changed:
        return []
    shown = ", ".join(f"{escape(field)} {escape(str(v['live']))} (file {escape(str(v['file']) or 'none')})"
                      for field, v in sorted(changed.items()))
    return [f"[magenta]live~[/] {shown}", "[dim]infermux ctl reset MODEL [FIELD] gives the file's back[/]"]


def tensor_lines(m: dict[str, Any]) -> list[str]:
    """What the loaded version takes and gives: `in  images float32[?×3×64×64]` (? = dynamic)."""
    lines = []
    for label, key in (("in ", "inputs"), ("out", "outputs")):
        for spec in m.get(key) or []:
            dims = "×".join("?" if d < 0 else str(d) for d in spec.get("shape", ()))
            lines.append(f"{label} {escape(str(spec.get('name')))} [dim]{spec.get('dtype')}\\[{dims}][/]")
    return lines


def batches_text(batches: dict[str, int], room: int = BATCHES_WIDTH - 2) -> str:
    """Batch-size histogram, one bar per size seen; bars leave `room` cells for the largest count."""
    if not batches:
        return "batch sizes\n[dim]no batches yet[/]"
    peak = max(batches.values()) or 1
    width = max(4, room - 6 - len(str(peak)))  # "  16 " before the bar, " 12345" after it
    lines = ["batch sizes"]
    for size, count in sorted(batches.items(), key=lambda kv: int(kv[0])):
        lines.append(f"{size:>4} [cyan]{'█' * max(1, round(width * count / peak))}[/] {count}")
    return "\n".join(lines)


class ContextsTable(KeyedTable):
    """One row per execution context: its own queue and statistics."""

    COLUMNS = (Col("ctx", "CTX", 4, True), Col("queue", "QUEUE", 7, True), Col("in_flight", "INFL", 6, True),
               Col("qps", "QPS", 8, True), Col("p50", "P50", 8, True), Col("p99", "P99", 8, True),
               Col("served", "SERVED", 10, True))

    @staticmethod
    def row_cells(m: dict[str, Any]) -> Iterator[tuple[str, dict[str, Cell]]]:
        queues = m.get("queues") or []
        for i, ctx in enumerate((m.get("stats") or {}).get("contexts") or []):
            yield str(i), {
                "ctx": (str(i), ""), "queue": (str(queues[i] if i < len(queues) else ctx.get("queue_depth", 0)), ""),
                "in_flight": (str(ctx.get("in_flight", 0)), ""), "qps": (fmt.rate(ctx.get("qps")), ""),
                "p50": (fmt.us(ctx.get("p50_us")), ""), "p99": (fmt.us(ctx.get("p99_us")), ""),
                "served": (str(ctx.get("served", 0)), ""),
            }


class ModelScreen(Screen):
    """Pushed by enter on a model row; escape goes back. The app's action keys act on this version."""

    BINDINGS = [Binding("escape,backspace", "app.back", "back")]

    DEFAULT_CSS = """
    ModelScreen #detail-head { height: auto; padding: 0 1; background: $boost; text-wrap: nowrap;
                               text-overflow: ellipsis; }
    ModelScreen #trends { height: 4; }
    ModelScreen #trends > Vertical { width: 1fr; padding: 0 1; }
    ModelScreen Sparkline { height: 3; }
    ModelScreen #middle { height: auto; }
    ModelScreen #settings { width: 1fr; padding: 0 1; }
    ModelScreen #batches { width: 30; padding: 0 1; }
    ModelScreen #detail-reason { height: auto; padding: 0 1; background: $boost; display: none; }
    ModelScreen ContextsTable { height: auto; max-height: 8; margin: 1 1 0 1; }
    ModelScreen EventsLog { height: 6; margin: 0 1; overflow-x: hidden; }
    """

    def __init__(self, key: str, events: EventStore) -> None:
        super().__init__()
        self.key = key
        self.events = events
        self._texts: dict[str, str] = {}
        self._mounted = False  # snapshots can arrive between push_screen and mount

    def on_mount(self) -> None:
        self._mounted = True
        self.show_events(self.events)
        refresh = getattr(self.app, "refresh_views", None)
        if refresh is not None:
            refresh()

    def compose(self) -> ComposeResult:
        yield Static("", id="detail-head")
        yield Static("", id="detail-reason")
        with VerticalScroll():
            with Horizontal(id="trends"):
                with Vertical():
                    yield Static("QPS", id="qps-label")
                    yield Sparkline([], summary_function=max, id="qps-spark")
                with Vertical():
                    yield Static("p99", id="p99-label")
                    yield Sparkline([], summary_function=max, id="p99-spark")
            with Horizontal(id="middle"):
                yield Static("", id="settings")
                yield Static("", id="batches")
            yield ContextsTable()
            yield EventsLog(id="model-events")
        yield Footer(compact=True)

    def _set(self, widget_id: str, text: str) -> None:
        old = self._texts.get(widget_id)
        if old != text:
            self._texts[widget_id] = text
            # relayout only when the height may change
            layout = old is None or old.count("\n") != text.count("\n")
            self.query_one(f"#{widget_id}", Static).update(text, layout=layout)

    def update_from(self, snapshot: dict[str, Any], history: History) -> None:
        if not self._mounted:
            return
        try:
            self._update(snapshot, history)
        except NoMatches:  # the console is closing and took the widgets first: nothing to show it on
            pass

    def _update(self, snapshot: dict[str, Any], history: History) -> None:
        m = next((m for m in snapshot.get("models", []) if fmt.version_key(m) == self.key), None)
        if m is None:
            self._set("detail-head", f"[b]{escape(self.key)}[/] [red]is no longer known to the daemon[/]")
            return
        st = m.get("stats") or {}
        self._set("detail-head", head_text(m))
        self._set("detail-reason", reason_text(m))
        self.query_one("#detail-reason").display = bool(m.get("reason"))
        qps, p99 = history.qps.get(self.key, ()), history.p99_ms.get(self.key, ())
        self._set("qps-label", f"QPS now [b]{fmt.rate(st.get('qps'))}[/] · peak {fmt.rate(max(qps, default=0))}")
        self._set("p99-label", f"p99 now [b]{fmt.us(st.get('p99_us'))}[/] · "
                               f"peak {fmt.us(max(p99, default=0) * 1000 or None)}")
        self.query_one("#qps-spark", Sparkline).data = list(qps)
        self.query_one("#p99-spark", Sparkline).data = list(p99)
        self._set("settings", settings_text(m))
        self._set("batches", batches_text(st.get("batches") or {}))
        self.query_one(ContextsTable).sync(ContextsTable.row_cells(m))

    def show_events(self, store: EventStore) -> None:
        """Replace the log with this model's recent events (on open)."""
        log = self.query_one(EventsLog)
        log.clear()
        log.add(store.of_model(self.key.rsplit(":", 1)[0], 50))

    def add_events(self, events: list[dict[str, Any]]) -> None:
        if not self._mounted:
            return
        name = self.key.rsplit(":", 1)[0]
        self.query_one(EventsLog).add(e for e in events if e.get("model") == name)
