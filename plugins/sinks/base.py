"""The sink plugin interface (docs/events.md#sinks).

A sink takes events out of the box: to files, a PUB socket, an MQTT broker,
an HTTP endpoint. The daemon keeps each sink's events in a durable spool
(daemon/sinks/spool.py) and hands them to the sink in order from the
sink's own thread: `deliver` returns how many of them, from the first, the
other side acknowledged; only those leave the spool. A sink that cannot
deliver raises SinkDown, and the same events are offered again later.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Mapping, Protocol


@dataclass(frozen=True)
class OutEvent:
    """One event as a sink sees it: its stream key, its type (new, update, end) and its JSON."""

    key: str
    type: str
    id: str
    data: bytes


class SinkConfigError(Exception):
    """A sink's options are wrong: the configuration file is refused with `reason`; `option` names the
    option at fault where there is one (the error then points at `sinks[i].options.<option>`)."""

    def __init__(self, kind: str, reason: str, option: str = "") -> None:
        super().__init__(f"sink kind {kind!r}: {reason}")
        self.kind, self.reason, self.option = kind, reason, option


class SinkDown(Exception):
    """The sink could not deliver now (broker away, HTTP 500, a full disk): the events wait."""


class SinkInUse(SinkDown):
    """A probe found the sink's address held (by the running daemon, or another program): a warning."""


class Sink(Protocol):
    """A started sink. Its methods run on the sink's own thread, but `result`, which the
    pipelines' threads call and which must never block. A sink whose `deliver` never blocks
    either may say so with a class attribute `immediate = True`: the hub then delivers each
    event on the thread that made it, while the sink is up and nothing else is being delivered."""

    def deliver(self, events: list[OutEvent]) -> int:
        """Send `events` in order; the number acknowledged from the first (0 to len(events)), or SinkDown."""
        ...

    def result(self, key: str, payload: bytes) -> None:
        """A frame's result of stream `key`, for sinks that publish them (best effort, never blocking)."""
        ...

    def close(self) -> None:
        """Release the connection or file."""
        ...


class SinkFactory(Protocol):
    """A sink class: `check` validates options without connecting; calling it builds the sink."""

    def check(self, options: Mapping[str, Any]) -> None: ...

    def probe(self, options: Mapping[str, Any], timeout_s: float) -> str:
        """Reach the other side once, as `infermux doctor` does, sending no event and taking nothing
        the running daemon holds: what was reached, or SinkDown saying what is wrong. Optional: a
        plugin's class without it is reported as not checked."""
        ...

    def __call__(self, name: str, options: Mapping[str, Any]) -> Sink: ...


TOPIC_ESCAPES = {"%": "%25", "/": "%2F", "+": "%2B", "#": "%23"}


def topic_key(key: str) -> str:
    """A stream key as one level of a topic: a client's key may hold `/` (another level), or MQTT's
    wildcards `+` and `#`, which a broker refuses in a published topic (and would then refuse that
    event for ever); those and `%` are written as their %-escapes. The event's `key` field is as sent."""
    return "".join(TOPIC_ESCAPES.get(c, c) for c in key)


def option(kind: str, options: Mapping[str, Any], key: str, want: type | tuple[type, ...], default: Any) -> Any:
    """`options[key]` checked to be of type `want` (default when absent); SinkConfigError naming it."""
    value = options.get(key, default)
    wants = want if isinstance(want, tuple) else (want,)
    if isinstance(value, bool) and bool not in wants or not isinstance(value, wants):
        names = " or ".join("number" if w is float else w.__name__ for w in wants)
        raise SinkConfigError(kind, f"option {key!r} must be {names}, got {value!r}", key)
    return value


def known(kind: str, options: Mapping[str, Any], names: set[str]) -> None:
    """SinkConfigError for an option the kind does not have."""
    unknown = sorted(set(options) - names)
    if unknown:
        near = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.75)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SinkConfigError(kind, f"unknown option {unknown[0]!r}; {hint}known: {', '.join(sorted(names))}",
                              unknown[0])


def bounded(kind: str, key: str, value: float, low: float, high: float) -> float:
    """`value` when low <= value <= high, else SinkConfigError naming `key`."""
    if not low <= value <= high:
        raise SinkConfigError(kind, f"option {key!r} must be between {low:g} and {high:g}, got {value!r}", key)
    return value
