"""The event log: every state change as one log line and one structured event.

Loads, swaps, failures, evictions and admin actions go through `emit`; the
log gets a `key=value` line, the ring keeps recent history for the admin
`events` command, and subscribers (the stats publisher) see each event.

Errors logged with a traceback (a backend that raises, a bug answered 500)
go through TRACEBACKS, a filter on the daemon's log handler: the first of a
kind is written with its traceback and becomes an `error` event; repeats
are counted and written as one line (and one event) per interval, so a
plugin that fails every request cannot flood the journal. Other warnings
and errors the daemon logs become `log` events (the console's Log tab), at
most one per message per interval, the repeats counted in the next one.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
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
            parts.append(f"model={_quote(self.model)}")
        if self.version:
            parts.append(f"version={_quote(self.version)}")
        parts += [f"{k}={_quote(v)}" for k, v in self.detail.items()]
        return " ".join(parts)


def _quote(value: Any) -> str:
    """A logfmt value: bare when it can be, else double-quoted with `"`, `\\` and control
    characters escaped (as JSON does), so a value holding quotes or `=` still parses."""
    text = str(value)
    if text and not any(c in text for c in ' ="\\') and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


_LEVELS = {"error": logging.ERROR, "failed": logging.ERROR, "crashed": logging.ERROR, "evicted": logging.WARNING,
           "refused": logging.WARNING, "rejected": logging.WARNING, "fallback_refused": logging.WARNING,
           "stream_silent": logging.WARNING, "camera_lost": logging.WARNING, "camera_refused": logging.WARNING}
_LEVELS.update({"sink_down": logging.WARNING, "sink_dropped": logging.WARNING, "sink_failed": logging.ERROR})


# Kinds kept in a ring of their own: what operators did (the admin socket's audit trail) must
# not be pushed out by what traffic does (a client registering shared memory in a loop).
AUDIT_KINDS = frozenset({"admin"})


class EventLog:
    """Recent events plus live subscribers; thread-safe. Audit events (AUDIT_KINDS) have a ring
    of their own, of the same size, so no number of other events evicts them."""

    def __init__(self, keep: int = 1000) -> None:
        self._recent: deque[Event] = deque(maxlen=keep)
        self._audit: deque[Event] = deque(maxlen=keep)
        self._subscribers: list[Callable[[Event], None]] = []
        self._lock = threading.Lock()

    def emit(self, kind: str, model: str = "", version: str = "", **detail: Any) -> Event:
        event = Event(kind, model, version, detail)
        log.log(_LEVELS.get(kind, logging.INFO), event.line())
        return self.record(event)

    def record(self, event: Event) -> Event:
        """Keep and publish `event` without a log line (its record is already in the log)."""
        with self._lock:
            (self._audit if event.kind in AUDIT_KINDS else self._recent).append(event)
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(event)
        return event

    def recent(self, limit: int = 100, kinds: frozenset[str] | None = None) -> list[Event]:
        """The newest `limit` events, oldest first, of `kinds` (None: every kind), from both rings."""
        with self._lock:
            if kinds is not None and kinds <= AUDIT_KINDS:
                pool = list(self._audit)
            else:
                pool = sorted([*self._recent, *self._audit], key=lambda e: e.time)
        if kinds is not None:
            pool = [e for e in pool if e.kind in kinds]
        return pool[-limit:]

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        with self._lock:
            self._subscribers.append(callback)


class Throttle:
    """At most `first` occurrences of each kind per `interval_s` get through; the rest are counted.

    For a line or an event that traffic can repeat at will (a client registering shared memory in
    a loop, a full /dev/shm met by every request): `admit` says whether this one goes through, and
    how many of its kind were held back before it; `held` hands over (and forgets) the counts of
    windows that have ended with some held back, for a summary line when the repeats stop."""

    def __init__(self, first: int = 5, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.first, self.interval_s, self._clock = first, interval_s, clock
        self._windows: dict[str, list[float]] = {}  # kind -> [window start, passed, held]
        self._lock = threading.Lock()

    def admit(self, kind: str) -> int | None:
        """None: hold this one back (counted); else how many of `kind` were held back since the
        last one that went through (0 mostly)."""
        now = self._clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is None or now - window[0] >= self.interval_s:
                held = int(window[2]) if window is not None else 0
                self._windows[kind] = [now, 1, 0]
                return held
            if window[1] < self.first:
                window[1] += 1
                return 0
            window[2] += 1
            return None

    def held(self) -> dict[str, int]:
        """Kinds whose window has ended with some held back, and how many; those are then forgotten."""
        now = self._clock()
        out: dict[str, int] = {}
        with self._lock:
            for kind, window in list(self._windows.items()):
                if now - window[0] >= self.interval_s:
                    if window[2]:
                        out[kind] = int(window[2])
                    del self._windows[kind]
        return out


MESSAGE_KINDS = 256  # distinct warning messages remembered for the `log` events' repeat counts


class _Inside(threading.local):
    active = False  # this thread is recording a `log` event: what a subscriber logs meanwhile is not one


_inside = _Inside()


@dataclass
class _Repeats:
    """One kind of traceback: where it was logged and how often since the last line about it."""

    logger: str
    level: int
    message: str
    count: int = 0
    timer: threading.Timer | None = None


def _field(text: str, key: str) -> str:
    """`model=bad version=1 ...` -> the value of `key`, or ""."""
    found = re.search(rf"\b{key}=(\S+)", text)
    return found.group(1) if found else ""


class TracebackLimiter(logging.Filter):
    """Passes the first record of each kind that carries a traceback; counts the rest per interval.

    A warning's first record loses its traceback and names the exception
    instead (one line, as before); an error's keeps it.
    A kind is the logger, the formatted message and the exception type: each
    context of a broken model is its own kind, each request is not. While a
    kind repeats, one line every `interval_s` says how many more there were;
    an interval without any ends the kind, so the next one shows its
    traceback again. `total` counts every such record (the daemon's
    internal errors, shown by `status` and /metrics).
    """

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.total = 0
        self.events: EventLog | None = None  # set by `infermux serve`: errors become events too
        self._kinds: dict[tuple[str, str, str], _Repeats] = {}
        self._messages: dict[tuple[str, str], tuple[float, int]] = {}  # (logger, msg): (last event, skipped)
        self._lock = threading.Lock()
        atexit.register(self.flush)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or record.exc_info[0] is None:
            if record.levelno >= logging.WARNING:
                self._logged(record)
            return True
        exc = record.exc_info[1]
        message = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
        key = (record.name, record.getMessage(), type(exc).__name__)
        with self._lock:
            self.total += 1
            kind = self._kinds.get(key)
            if kind is not None:
                kind.count += 1
                return False
            kind = self._kinds[key] = _Repeats(record.name, record.levelno, message)
            self._arm(key, kind)
        if record.levelno < logging.ERROR:
            # A warning (a backend that raised on a request) keeps to one line: its reason, no traceback.
            record.msg, record.args, record.exc_info, record.exc_text = message, (), None, None
        self._event(kind, 0)
        return True

    def _logged(self, record: logging.LogRecord) -> None:
        """A warning or error without a traceback as a `log` event; repeats of its message within
        `interval_s` are only counted (the count rides on the next one), so a warning per request
        cannot push the other events out of the ring."""
        events = self.events
        if events is None or record.name == log.name or getattr(record, "infermux_event", False) or _inside.active:
            return  # an event's own line, a count line of ours, or logged while recording one
        key, now = (record.name, str(record.msg)), time.monotonic()
        with self._lock:
            last, skipped = self._messages.get(key, (float("-inf"), 0))
            if now - last < self.interval_s:
                self._messages[key] = (last, skipped + 1)
                return
            if len(self._messages) >= MESSAGE_KINDS:  # bounded: forget the old kinds
                self._messages.clear()
            self._messages[key] = (now, 0)
        message = record.getMessage()
        detail: dict[str, Any] = {"level": record.levelname.lower(), "logger": record.name,
                                  "message": message[:300]}
        if skipped:
            detail["repeated"] = skipped
        _inside.active = True
        try:
            events.record(Event("log", _field(message, "model"), _field(message, "version"), detail))
        finally:
            _inside.active = False

    def _arm(self, key: tuple[str, str, str], kind: _Repeats) -> None:
        kind.timer = threading.Timer(self.interval_s, self._close_interval, (key,))
        kind.timer.daemon = True
        kind.timer.start()

    def _close_interval(self, key: tuple[str, str, str]) -> None:
        """The interval of `key` ended: write its count, or forget it after a quiet interval."""
        with self._lock:
            kind = self._kinds.get(key)
            if kind is None:
                return
            count, kind.count = kind.count, 0
            if count:
                self._arm(key, kind)
            else:
                del self._kinds[key]
        if count:
            self._report(kind, count)

    def flush(self) -> None:
        """Write every pending count now (at exit: no repeat goes unsaid)."""
        with self._lock:
            pending = [(kind, kind.count) for kind in self._kinds.values() if kind.count]
            for kind in self._kinds.values():
                kind.count = 0
                if kind.timer is not None:
                    kind.timer.cancel()
            self._kinds.clear()
        for kind, count in pending:
            self._report(kind, count)

    def _report(self, kind: _Repeats, count: int) -> None:
        where = "traceback above, not repeated" if kind.level >= logging.ERROR else "the first is above"
        logging.getLogger(kind.logger).log(kind.level, "%s: %d more like this (%s)", kind.message, count, where,
                                           extra={"infermux_event": True})  # its event follows: no `log` event
        self._event(kind, count)

    def _event(self, kind: _Repeats, repeated: int) -> None:
        if self.events is not None:
            detail: dict[str, Any] = {"reason": kind.message[:300]}
            if repeated:
                detail["repeated"] = repeated
            self.events.record(Event("error", _field(kind.message, "model"), _field(kind.message, "version"),
                                     detail))


#: The daemon's one limiter: `infermux serve` puts it on the log handler (the log is process-wide too).
TRACEBACKS = TracebackLimiter()


def limit_tracebacks() -> TracebackLimiter:
    """Put TRACEBACKS on every handler of the root logger (after logging is configured)."""
    for handler in logging.getLogger().handlers:
        if TRACEBACKS not in handler.filters:
            handler.addFilter(TRACEBACKS)
    return TRACEBACKS
