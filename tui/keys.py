"""The `?` screen: infermux's own keys first, grouped, each with what it does (Textual's generic panel is one key further)."""

from __future__ import annotations

import re
from typing import Iterable

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from infermux.tui.actions import ACTIONS
from infermux.tui.markup import escape

VIEW_KEYS = (("1-8", "the tabs: 1 models … 7 streams, 8 cameras"),
             ("enter", "the selected version in depth (escape: back)"),
             ("/", "show only the rows matching a text (empty: all)"),
             ("s", "sort: models by QPS, p99, errors, memory; streams by fps, age"),
             ("↑ ↓ j k", "move the selection"), ("ctrl+p", "command palette: every action by name"),
             ("q", "quit"))

#: Keys whose line is not their action's help: the toggles (not in ACTIONS under their own name) and
#: the +/- pair, shown once. (scope, what it does); None: no line of its own.
SPECIAL: dict[str, tuple[str, str] | None] = {
    "pin_toggle": ("version", "pin it (its model's default); on a pinned one: unpin"),
    "drain_toggle": ("daemon", "drain the whole daemon (new requests get 503); again: resume"),
    "more": ("version", "one execution context more / fewer"), "fewer": None,
    # d is unload's older name: one line, so the two never read as two different things.
    "unload": ("version", "unload it (the queue first; then its fallback, or 503)"), "drain": None}

KEY_NAMES = {"question_mark": "?", "plus": "+ -", "slash": "/", "u": "u d"}


def key_name(binding: Binding) -> str:
    """What the key looks like on a keyboard: `?`, `R`, `D`."""
    first = binding.key.split(",")[0]
    return KEY_NAMES.get(first, first)


def action_lines(bindings: Iterable[BindingType], scope: str) -> list[str]:
    """One line per action key of `scope` ("version" or "daemon"): the key, then what it does."""
    lines = []
    for binding in bindings:
        if not isinstance(binding, Binding):
            continue
        found = re.fullmatch(r"do\('(\w+)'\)", binding.action)
        name = found.group(1) if found else ""
        if name in SPECIAL:
            special = SPECIAL[name]
            if special is not None and special[0] == scope:
                lines.append(_line(key_name(binding), special[1]))
        elif name in ACTIONS and ACTIONS[name].scope == scope:
            lines.append(_line(key_name(binding), ACTIONS[name].help))
    return lines


def _line(key: str, what: str) -> str:
    return f"  [b]{escape(key):<7}[/] {escape(what)}"


class KeysScreen(ModalScreen[None]):
    """Every infermux key with what it does; `?` or escape closes, `t` opens Textual's own panel."""

    DEFAULT_CSS = """
    KeysScreen { align: center middle; }
    KeysScreen > VerticalScroll { width: 76; max-width: 100%; height: auto; max-height: 100%;
                                  border: thick $accent; background: $surface; padding: 0 1; }
    """
    BINDINGS = [Binding("question_mark,escape,q", "close", "close"), Binding("t", "textual", "all keys")]

    def __init__(self, bindings: Iterable[BindingType]) -> None:
        super().__init__()
        self.bindings = list(bindings)

    def text(self) -> str:
        return "\n".join(["[b]On the selected version[/]", *action_lines(self.bindings, "version"),
                          "[b]On the whole daemon[/]", *action_lines(self.bindings, "daemon"),
                          "[b]Views and moving[/]", *(_line(k, what) for k, what in VIEW_KEYS)])

    def compose(self) -> ComposeResult:
        scroll = VerticalScroll()
        scroll.border_title = "infermux top: keys"
        scroll.border_subtitle = "? or escape closes · t: Textual's own keys"
        with scroll:
            yield Static(self.text(), id="keys-text")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_textual(self) -> None:
        self.dismiss(None)
        self.app.action_show_help_panel()
