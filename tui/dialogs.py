"""Modal dialogs: a yes/no confirmation and a one-line editor. Both work without a mouse."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, NoBinding
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


class LineInput(Input):
    """An Input whose editing keys (ctrl+u, backspace, enter...) act in the order they were typed.

    Textual runs a widget's key bindings only once the key has bubbled up to the app, through
    each parent's message queue, while a typed character is inserted at once: when a terminal
    delivers `ctrl+u` and the new text in one read (a fast typist, a paste over SSH), the text
    went in first and ctrl+u then erased it. Here the Input's own bindings run as the key arrives."""

    async def _on_key(self, event: events.Key) -> None:
        if not event.is_printable:
            try:
                binding = self._bindings.get_bindings_for_key(event.key)[0]
            except NoBinding:
                binding = None
            if binding is not None:
                event.stop()
                event.prevent_default()
                await self.run_action(binding.action)
                return
        await super()._on_key(event)


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
            yield LineInput(self.value, id="value")
            if self.hint:
                yield Static(self.hint, classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
