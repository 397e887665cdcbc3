"""The `?` screen: infermux's own keys first, each with what it does (Textual's generic panel is one key further)."""

from __future__ import annotations

import re
from typing import Iterable

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from infermux.tui.actions import ACTIONS

VIEW_KEYS = (("1 2 3 4", "models, memory, routing, events tab"), ("enter", "the selected version in depth"),
             ("/", "show only the models matching a text (empty: all)"),
             ("s", "sort the models by QPS, p99, 500s, memory, then back to the daemon's order"),
             ("escape", "back from the detail screen"), ("↑ ↓ j k", "move the selection"),
             ("ctrl+p", "command palette: every action by name"), ("q", "quit"))


def key_name(binding: Binding) -> str:
    """What the key looks like on a keyboard: `+/-`, `R`, `D`."""
    if binding.key_display:
        return binding.key_display
    return {"question_mark": "?", "plus": "+", "minus": "-"}.get(binding.key.split(",")[0], binding.key.split(",")[0])


def action_lines(bindings: Iterable[BindingType]) -> list[str]:
    """One line per action key: the key, then the action's help from actions.ACTIONS."""
    lines = []
    for binding in bindings:
        if not isinstance(binding, Binding):
            continue
        found = re.fullmatch(r"do\('(\w+)'\)", binding.action)
        if found and found.group(1) in ACTIONS:
            lines.append(f"  [b]{escape(key_name(binding)):<7}[/] {escape(ACTIONS[found.group(1)].help)}")
        elif found:  # the toggles: pin/unpin, drain/resume
            lines.append(f"  [b]{escape(key_name(binding)):<7}[/] {escape(binding.description)}")
    return lines


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
        views = [f"  [b]{escape(k):<7}[/] {escape(what)}" for k, what in VIEW_KEYS]
        return "\n".join(["[b]infermux top: keys[/] (on the selected version unless it says daemon)",
                          *action_lines(self.bindings), "", *views, "",
                          "[dim]? or escape closes · t: every key Textual knows (scrolling, focus)[/]"])

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.text(), id="keys-text")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_textual(self) -> None:
        self.dismiss(None)
        self.app.action_show_help_panel()
