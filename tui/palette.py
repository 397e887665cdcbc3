"""Command palette entries for every action on every model version ("unload addone:2")."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Protocol, runtime_checkable

from textual.command import Hit, Hits, Provider

from infermux import format as fmt
from infermux.tui.actions import ACTIONS


@runtime_checkable
class Commanded(Protocol):
    """What the palette needs of the app (TopApp): the latest snapshot and a way to run an action."""

    snapshot: dict[str, Any]

    def action_do(self, name: str, key: str | None = None) -> None: ...


class ModelCommands(Provider):
    """Searches `<action> <model>:<version>` over the versions of the latest snapshot."""

    def _commands(self) -> list[tuple[str, str, Callable[[], None]]]:
        app = self.app
        if not isinstance(app, Commanded):  # only TopApp lists this provider
            return []
        snapshot = app.snapshot or {}
        commands: list[tuple[str, str, Callable[[], None]]] = []
        for m in snapshot.get("models", []):
            key = fmt.version_key(m)
            for action in ACTIONS.values():
                if action.scope == "version":
                    commands.append((f"{action.title} {key}", action.help,
                                     partial(app.action_do, action.name, key)))
        return commands

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, help_text, callback in self._commands():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), callback, text=text, help=help_text)
