"""The event log: every state change as one log line and one structured event.

Loads, swaps, failures, evictions and admin actions go through `emit`; the
log gets a `key=value` line, the ring keeps recent history for the admin
`events` command, and subscribers (the stats publisher) see each event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("infermux.events")


@dataclass(frozen=True)
class Event:
    """One thing that happened to a model, a worker or the daemon."""

    kind: str
    model: str = ""
    version: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def as_json(self) -> dict[str, Any]:
        return {"time": self.time, "kind": self.kind, "model": self.model,
                "version": self.version, **self.detail}

    def line(self) -> str:
        parts = [self.kind]
        if self.model:
            parts.append(f"model={self.model}")
        if self.version:
            parts.append(f"version={self.version}")
        parts += [f"{k}={_quote(v)}" for k, v in self.detail.items()]
        return " ".join(parts)


def _quote(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


_LEVELS = {"failed": logging.ERROR, "crashed": logging.ERROR, "evicted": logging.WARNING,
           "refused": logging.WARNING, "rejected": logging.WARNING}


class EventLog:
    """Recent events plus live subscribers; thread-safe."""

    def __init__(self, keep: int = 1000) -> None:
        self._recent: deque[Event] = deque(maxlen=keep)
        self._subscribers: list[Callable[[Event], None]] = []
        self._lock = threading.Lock()

    def emit(self, kind: str, model: str = "", version: str = "", **detail: Any) -> Event:
        event = Event(kind, model, version, detail)
        log.log(_LEVELS.get(kind, logging.INFO), event.line())
        with self._lock:
            self._recent.append(event)
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(event)
        return event

    def recent(self, limit: int = 100) -> list[Event]:
        with self._lock:
            return list(self._recent)[-limit:]

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        with self._lock:
            self._subscribers.append(callback)
