"""Command palette entries for every action on every model version ("unload addone:2")."""

from __future__ import annotations

from functools import partial

from textual.command import Hit, Hits, Provider

from infermux.tui import format as fmt
from infermux.tui.actions import ACTIONS


class ModelCommands(Provider):
    """Searches `<action> <model>:<version>` over the versions of the latest snapshot."""

    def _commands(self) -> list[tuple[str, str, object]]:
        app = self.app
        snapshot = getattr(app, "snapshot", {}) or {}
        commands: list[tuple[str, str, object]] = []
        for m in snapshot.get("models", []):
            key = fmt.version_key(m)
            for action in ACTIONS.values():
                if action.scope == "version":
                    commands.append((f"{action.title} {key}", action.help,
                                     partial(app.action_do, action.name, key)))  # type: ignore[attr-defined]
        return commands

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, help_text, callback in self._commands():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), callback, text=text, help=help_text)  # type: ignore[arg-type]
