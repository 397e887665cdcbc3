"""Modal dialogs: a yes/no confirmation and a one-line editor. Both work without a mouse."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

DIALOG_CSS = """
ConfirmScreen, PromptScreen { align: center middle; }
ConfirmScreen > Vertical, PromptScreen > Vertical {
    width: 64; max-width: 100%; height: auto; border: thick $warning; background: $surface; padding: 1 2;
}
PromptScreen > Vertical { border: thick $accent; }
ConfirmScreen Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
ConfirmScreen Button { margin-left: 2; min-width: 10; }
PromptScreen .hint { color: $text-muted; }
"""


class ConfirmScreen(ModalScreen[bool]):
    """Ask before something destructive: y / enter confirms, n / escape cancels."""

    DEFAULT_CSS = DIALOG_CSS
    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, id="question")
            with Horizontal():
                yield Button("No (n)", id="no")
                yield Button("Yes (y)", id="yes", variant="warning")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # enter on the default button cancels

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PromptScreen(ModalScreen["str | None"]):
    """Edit one value: enter submits, escape cancels."""

    DEFAULT_CSS = DIALOG_CSS
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, title: str, value: str, hint: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text)
            yield Input(self.value, id="value")
            if self.hint:
                yield Static(self.hint, classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
