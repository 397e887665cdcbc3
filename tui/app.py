"""`TopApp`: the operator console. Views on tabs, actions on keys, the daemon's answers as notifications.

Data arrives from a `Feed` (tui/feed.py) as messages; each snapshot updates
the status line, the visible view and the detail screen in place. Admin
commands run on worker threads so a slow `load` never freezes the screen.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Iterable, Protocol

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from infermux import format as fmt
from infermux.tui.actions import ACTIONS, Action, Refused, summary
from infermux.tui.dialogs import ConfirmScreen, PromptScreen
from infermux.tui.feed import EventsArrived, Feed, LinkChanged, SnapshotReady
from infermux.tui.header import status_text
from infermux.tui.history import History
from infermux.tui.keys import KeysScreen
from infermux.tui.views.cameras import CamerasTable, CamerasView
from infermux.tui.palette import ModelCommands
from infermux.tui.views.detail import ModelScreen
from infermux.tui.views.events import EventsLog, EventStore, LogPane
from infermux.tui.views.memory import MemoryTable, MemoryView
from infermux.tui.views.models import SORT_NAMES, SORTS, ModelsTable
from infermux.tui.views.pipelines import PipelinesTable, PipelinesView
from infermux.tui.views.routing import RoutingTable, RoutingView
from infermux.tui.views import streams as stream_views
from infermux.tui.views.streams import StreamsTable, StreamsView
from infermux.tui.views.table import KeyedTable
from infermux.tui.markup import escape

TABS = ("models", "memory", "routing", "events", "log", "pipelines", "streams", "cameras")


class TopApp(App):
    """`infermux top`: shows what `feed` delivers and sends the operator's actions through it.

    Tests drive it with `run_test()`; `StaticFeed` gives it fixed snapshots.
    """

    TITLE = "infermux top"
    COMMANDS = App.COMMANDS | {ModelCommands}
    CSS = """
    #status { height: 2; padding: 0 1; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }
    #banner { height: auto; padding: 0 1; background: $error; color: $text; text-style: bold; }
    TabbedContent { height: 1fr; }
    .-stale KeyedTable, .-stale #status { text-opacity: 60%; }
    TabPane { padding: 0; }
    Tab { padding: 0 0 0 1; }  /* eight tabs' titles fit 80 columns */
    """

    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("enter", "detail", "detail", show=False),
        Binding("l", "do('load')", "load"),
        Binding("u", "do('unload')", "unload"),
        # one footer entry for the pair: "+/- ctx"
        Binding("plus,equals_sign", "do('more')", "ctx", key_display="+/-"),
        Binding("minus", "do('fewer')", "fewer contexts", show=False),
        Binding("p", "do('pin_toggle')", "pin"),
        Binding("R", "do('reload')", "reload"),
        Binding("question_mark", "keys", "keys", key_display="?"),
        Binding("slash", "filter", "filter", key_display="/", show=False),
        Binding("s", "sort", "sort", show=False),
        Binding("w", "do('weights')", "weights", show=False),
        Binding("x", "do('contexts')", "set contexts", show=False),
        Binding("d", "do('drain')", "drain", show=False),
        Binding("f", "do('fallback')", "fallback", show=False),
        Binding("h", "do('promote')", "promote (hot)", show=False),
        Binding("c", "do('demote')", "demote (cold)", show=False),
        Binding("D", "do('drain_toggle')", "drain/resume daemon", show=False),
        *(Binding(str(i + 1), f"tab('{tab}')", tab, show=False) for i, tab in enumerate(TABS)),
    ]

    def __init__(self, feed: Feed, *, config_path: str = "") -> None:
        super().__init__()
        self.feed = feed
        self.config_path = config_path
        self.snapshot: dict[str, Any] = {}
        self.history = History()
        self.events = EventStore()
        self.link_ok = False
        self.stale = False  # the daemon went away: the status line says the figures are old
        self.snapshots_seen = 0
        self._shown_tab = "models"
        self._last_key: str | None = None

    # -- layout -------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static("[dim]infermux top — waiting for the first snapshot[/]", id="status")
        yield Static(f"connecting to {escape(self.feed.endpoints.stats)} …", id="banner")
        with TabbedContent(initial="models"):
            with TabPane("1 Models", id="models"):
                yield ModelsTable(id="models-table")
            with TabPane("2 Memory", id="memory"):
                yield MemoryView()
            with TabPane("3 Routing", id="routing"):
                yield RoutingView()
            with TabPane("4 Events", id="events"):
                yield EventsLog(id="events-log", skip=frozenset({"log"}))  # those are the Log tab's
            with TabPane("5 Log", id="log"):
                yield LogPane(id="log-pane")
            with TabPane("6 Pipelines", id="pipelines"):
                yield PipelinesView()
            with TabPane("7 Streams", id="streams"):
                yield StreamsView()
            with TabPane("8 Cameras", id="cameras"):
                yield CamerasView()
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.main = self.screen
        self.models_table = self.query_one(ModelsTable)
        self.memory_view = self.query_one(MemoryView)
        self.routing_view = self.query_one(RoutingView)
        self.pipelines_view = self.query_one(PipelinesView)
        self.streams_view = self.query_one(StreamsView)
        self.streams_table = self.streams_view.query_one(StreamsTable)
        self.cameras_view = self.query_one(CamerasView)
        self.events_log = self.query_one("#events-log", EventsLog)
        self.log_pane = self.query_one(LogPane)
        self.models_table.history = self.history
        self.banner = self.query_one("#banner", Static)
        self.status_line = self.query_one("#status", Static)
        self.models_table.focus()
        self.feed.start(self)

    def on_unmount(self) -> None:
        self.feed.stop()

    # -- data in ------------------------------------------------------------------

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        snapshot = self.feed.take_snapshot()
        if snapshot is None:
            return
        self.snapshot = snapshot
        if self.stale:
            self.stale = False
            self.main.remove_class("-stale")
        self.snapshots_seen += 1
        self.history.add(snapshot)
        self.refresh_views()

    def refresh_views(self) -> None:
        """Update what can be seen; hidden views catch up when they are shown."""
        if not self.snapshot:
            return
        base = self.base_screen()
        if base is None:
            return
        if isinstance(base, ModelScreen):
            base.update_from(self.snapshot, self.history)
            return
        # Widgets of a covered screen are not touched: Textual would repaint the whole
        # top screen for them.
        self.status_line.update(status_text(self.snapshot, self.stale), layout=False)  # fixed height: no relayout
        views: dict[str, _Updates] = {"models": self.models_table, "memory": self.memory_view,
                                      "routing": self.routing_view, "pipelines": self.pipelines_view,
                                      "streams": self.streams_view, "cameras": self.cameras_view}
        view = views.get(self._tab)
        if view is not None:  # the events tab fills itself from EventsArrived
            view.update_from(self.snapshot)

    def on_events_arrived(self, message: EventsArrived) -> None:
        new = self.events.add(message.events)
        self.events_log.add(new)
        self.log_pane.add(new)
        base = self.base_screen()
        if isinstance(base, ModelScreen):
            base.add_events(new)

    def on_link_changed(self, message: LinkChanged) -> None:
        self.link_ok = message.ok
        self.banner.update(escape(message.text))
        self.banner.display = not message.ok
        if not message.ok and self.snapshot:
            self.stale = True
            self.main.add_class("-stale")  # the tables' figures are old too: greyed with the status line
            self.status_line.update(status_text(self.snapshot, stale=True), layout=False)

    # -- navigation ---------------------------------------------------------------

    def base_screen(self) -> Screen | None:
        """The screen under any open dialog; None once the app is closing (its screens are gone, but
        a snapshot or events already posted are still delivered: a busy box showed it)."""
        stack = self.screen_stack
        return next((s for s in reversed(stack) if not isinstance(s, ModalScreen)), stack[-1] if stack else None)

    @property
    def _tab(self) -> str:
        """The active tab's id; "" while the app closes: the screen's widgets go before the screen
        does, and a snapshot delivered in between finds no tabs (a fresh-clone CI run caught it)."""
        tabs = self.main.query(TabbedContent)
        return tabs.first().active if tabs else ""

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """Keep the selected version when switching tabs; focus what the new tab shows."""
        previous = self._table(self._shown_tab)
        key = previous.selected_key() if previous is not None else self._last_key
        self._shown_tab, self._last_key = event.pane.id or "", key
        self.refresh_views()  # hidden tabs are stale: fill this one before selecting in it
        table = self._table(self._shown_tab)
        if table is None:
            {"log": self.log_pane, "pipelines": self.pipelines_view.query_one(PipelinesTable),
             "streams": self.streams_table, "cameras": self.cameras_view.query_one(CamerasTable)}.get(self._shown_tab, self.events_log).focus()
            return
        if key:
            table.select(key)
        table.focus()

    def _table(self, tab: str) -> KeyedTable | None:
        return {"models": self.models_table, "memory": self.memory_view.query_one(MemoryTable),
                "routing": self.routing_view.query_one(RoutingTable)}.get(tab)

    def action_keys(self) -> None:
        """infermux's keys and what each does (the footer has room for the common ones only)."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        elif not isinstance(self.screen, KeysScreen):
            self.push_screen(KeysScreen(self.BINDINGS))

    def action_filter(self) -> None:
        """Show only the rows whose name holds the text typed (`/`, then enter; empty: all): the models'
        name:version, or on the streams tab a stream's model/key."""
        if self.screen is not self.main:
            return
        on_streams = self._tab == "streams"
        table: ModelsTable | StreamsTable = self.models_table
        if on_streams:
            table = self.streams_table
        tab, label, what = ("streams", "7 Streams", "streams") if on_streams else ("models", "1 Models", "models")

        def chosen(text: str | None) -> None:
            if text is not None:
                table.filter_text = text.strip()
                tabs = self.query_one(TabbedContent)
                # the tab says a filter hides rows: "1 Models /det"
                tabs.get_tab(tab).label = label + (f" /{table.filter_text}" if table.filter_text else "")
                tabs.active = tab
                self.refresh_views()

        hint = f"enter to apply, empty for every {what[:-1]}, escape to cancel"
        self.push_screen(PromptScreen(f"Show {what} matching", table.filter_text, hint), chosen)

    def action_sort(self) -> None:
        """Cycle the visible table's order, largest first: the models' (the daemon's, then QPS, p99, 500s,
        error rate, memory) or on the streams tab the streams' (model and key, then frames in, served,
        drop rate, age, time since last seen)."""
        table: ModelsTable | StreamsTable = self.models_table
        what, sorts, names, plain = "models", SORTS, SORT_NAMES, "models in the daemon's order"
        if self._tab == "streams":
            table, sorts, names = self.streams_table, stream_views.SORTS, stream_views.SORT_NAMES
            what, plain = "streams", "streams by model and key"
        order = ["", *sorts]
        table.sort_by = order[(order.index(table.sort_by) + 1) % len(order)]
        self.notify(f"{what} sorted by {names[table.sort_by]}, largest first" if table.sort_by else plain, timeout=2)
        table.refresh()  # the header's ▼ moves even when the rows keep their order
        self.refresh_views()

    def action_tab(self, tab: str) -> None:
        if self.screen is self.main:
            self.query_one(TabbedContent).active = tab

    def selected_key(self) -> str | None:
        """The version the action keys act on: the detail screen's, else the cursor row of the visible table."""
        base = self.base_screen()
        if isinstance(base, ModelScreen):
            return base.key
        table = self._table(self._tab)
        if table is None:  # the events tab: the row last selected elsewhere
            return self._last_key or self.models_table.selected_key()
        return table.selected_key()

    def selected(self) -> dict[str, Any] | None:
        key = self.selected_key()
        return next((m for m in self.snapshot.get("models", []) if fmt.version_key(m) == key), None)

    def on_keyed_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        if self.screen is self.main:
            self.action_detail()

    def action_detail(self) -> None:
        key = self.selected_key()
        if key is None or isinstance(self.screen, ModelScreen):
            return
        self.push_screen(ModelScreen(key, self.events))

    async def action_back(self) -> None:  # async like the App.action_back it overrides
        """Leave the detail screen; the tables underneath catch up at once, not at the next snapshot."""
        if isinstance(self.screen, ModelScreen):
            self.pop_screen()
            self.call_later(self.refresh_views)

    # -- actions ------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("do", "detail", "tab") and isinstance(self.screen, ModalScreen):
            return False  # a dialog is open: its own keys only
        if action in ("detail", "tab") and isinstance(self.screen, ModelScreen):
            return False
        if action == "back" and not isinstance(self.screen, ModelScreen):
            return False
        return True

    def action_do(self, name: str, key: str | None = None) -> None:
        """Run the named action (see actions.ACTIONS) on `key`, or on the selected version."""
        if key is not None:
            target = next((m for m in self.snapshot.get("models", []) if fmt.version_key(m) == key), None)
        else:
            target = self.selected()
        if name == "pin_toggle":
            name = "unpin" if target and target.get("pinned") else "pin"
        if name == "drain_toggle":
            name = "drain_all" if (self.snapshot.get("daemon") or {}).get("accepting", True) else "resume"
        action = ACTIONS[name]
        if action.scope == "version" and target is None:
            self.notify("no model selected (is the daemon connected?)", severity="warning")
            return
        target = (target or {}) if action.scope == "version" else {}  # "Drain daemon", not "... classifier:1"
        if action.prompt:
            self._prompt(action, target)
        else:
            self._confirm(action, target, "")

    def _prompt(self, action: Action, target: dict[str, Any]) -> None:
        from infermux.tui.views.routing import weights_text

        if action.name == "weights":
            current = weights_text(self.snapshot, target["name"])
        elif action.name == "contexts":
            current = str(target.get("contexts", ""))
        else:
            current = str(target.get("fallback", ""))
        hint = "enter to apply, escape to cancel"
        title = action.prompt.format(model=target["name"], target=f"{target['name']} v{target['version']}")
        screen = PromptScreen(title, current, hint)

        def entered(text: str | None) -> None:
            if text is not None:  # None: escape
                self._confirm(action, target, text)

        self.push_screen(screen, entered)

    def _confirm(self, action: Action, target: dict[str, Any], text: str) -> None:
        try:
            cmd, args = action.build(target, text)
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        if not action.confirm:
            self.send(action, target, cmd, args)
            return
        question = action.confirm.format(target=fmt.version_key(target) if target else "",
                                         config=self.config_path or "the configuration file")

        def answered(yes: bool | None) -> None:
            if yes:
                self.send(action, target, cmd, args)

        self.push_screen(ConfirmScreen(question), answered)

    def on_cameras_view_snapshot_wanted(self, message: CamerasView.SnapshotWanted) -> None:
        self.snapshot_of(message.camera)

    @work(thread=True, group="admin", exit_on_error=False)
    def snapshot_of(self, camera: str) -> None:
        """`S` in the Cameras view: the daemon saves the camera's newest frame; the view shows the path."""
        reply = self.feed.call("snapshot", model=camera)
        self.call_from_thread(self.cameras_view.snapshot_taken, camera, reply)

    @work(thread=True, group="admin", exit_on_error=False)
    def send(self, action: Action, target: dict[str, Any], cmd: str, args: dict[str, Any]) -> None:
        """Ask the daemon on a worker thread; the answer comes back as a notification."""
        reply = self.feed.call(cmd, **args)
        self.call_from_thread(self._answer, action, target, cmd, reply)

    def _answer(self, action: Action, target: dict[str, Any], cmd: str, reply: dict[str, Any]) -> None:
        ok = bool(reply.get("ok"))
        # Titled for a person ("Drained classifier v1"), the daemon's own words below it.
        # Plain text (markup=False; a toast's title is never markup): the daemon's words shown as they are.
        self.notify(summary(cmd, reply), title=action.outcome(target, ok), markup=False,
                    severity="information" if ok else "error", timeout=4 if ok else 10)

    # -- command palette -----------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        key = self.selected_key() or "the selected version"
        for action in ACTIONS.values():
            where = "" if action.scope == "daemon" else f" ({key})"
            yield SystemCommand(action.title + where, action.help, partial(self.action_do, action.name))


class _Updates(Protocol):
    """A view that redraws itself from a snapshot."""

    def update_from(self, snapshot: dict[str, Any]) -> None: ...
