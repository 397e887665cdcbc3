"""The events pane: loads, swaps, failures, evictions and admin actions as they happen."""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from textual.widgets import RichLog

from infermux.tui import markup


def event_id(event: dict[str, Any]) -> tuple[Any, ...]:
    """Events are seen twice after a reconnect (stream and backfill): this tells them apart."""
    return (event.get("time"), event.get("kind"), event.get("model"), event.get("version"))


class EventStore:
    """Recent events without duplicates, oldest first; the detail screen filters it by model."""

    def __init__(self, keep: int = 1000) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=keep)
        self._seen: deque[tuple[Any, ...]] = deque(maxlen=keep)
        self._seen_set: set[tuple[Any, ...]] = set()

    def add(self, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Keep the events not seen before (in time order) and return them."""
        new = []
        for event in sorted(events, key=lambda e: e.get("time", 0)):
            key = event_id(event)
            if key in self._seen_set:
                continue
            if len(self._seen) == self._seen.maxlen:
                self._seen_set.discard(self._seen[0])
            self._seen.append(key)
            self._seen_set.add(key)
            self.events.append(event)
            new.append(event)
        return new

    def of_model(self, name: str, limit: int) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("model") == name][-limit:]


class EventsLog(RichLog):
    """Appends lines; never redraws what is already there. `skip`: event kinds left to another pane."""

    def __init__(self, *, skip: frozenset[str] = frozenset(), **kwargs: Any) -> None:
        # Wrapped: at 80 columns a failure's reason is the end of a long line, and it must be readable.
        super().__init__(max_lines=500, markup=True, wrap=True, min_width=40, **kwargs)
        self.skip = skip

    def shows(self, event: dict[str, Any]) -> bool:
        return event.get("kind") not in self.skip

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        for event in events:
            if self.shows(event):
                self.write(markup.event_line(event))


#: What the Log tab shows: the daemon's logged warnings and errors, failures and crashes.
LOG_KINDS = frozenset({"log", "error", "failed", "crashed"})


class LogPane(EventsLog):
    """The Log tab: recent warnings and errors the daemon logged (`log` and `error` events), newest last."""

    EMPTY = "[dim]no warnings or errors logged (the daemon's last 50 events are read on connect)[/]"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.empty = True

    def on_mount(self) -> None:
        if self.empty:  # events can reach the pane before its own mount does
            self.write(self.EMPTY)

    def shows(self, event: dict[str, Any]) -> bool:
        return event.get("kind") in LOG_KINDS

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        shown = [e for e in events if self.shows(e)]
        if shown and self.empty:
            self.empty = False
            self.clear()
        super().add(shown)
