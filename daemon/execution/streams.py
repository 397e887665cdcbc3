"""Per-stream accounting: for each (model or pipeline, key), what it sent and what became of it.

A client's request with a `key` is counted `received` when the router takes
it (`StreamTable.receive`, frontend thread), and once more when it is
answered, wherever that happens (`Job.answered`: an executor, the frontend,
a worker's reply, a pipeline thread), as `served` (200), `superseded`
(409), `refused` (429, 503, 504) or `failed` (any other status); so once
nothing is in flight, received = served + superseded + refused + failed.
Frames a client replaced before it sent them (client/stream.py), which
the daemon never receives, are counted as `replaced_by_client` from the
count its next request carries.
The age of a served request is receipt to reply; where the request said
when its frame was captured (`captured`), its capture-to-reply age is kept
too (`capture_age_ms`), which adds what the camera's decoder and network took.

Memory is bounded: at most `max_keys` streams are tracked (a few KB
each: the counters, the ages of its last AGES served requests, a few
per-second buckets); a new key past that forgets the least recently seen
stream, whose counts go on in its model's `forgotten` totals so that the
model's sums (Prometheus' `key="other"`) never go back. Keys are cut to
KEY_CHARS characters.

A stream that sent two requests at most `silent_s` apart and then nothing
for `silent_s` is *silent*: `check` (a frontend tick) emits one
`stream_silent` event for it, and `stream_resumed` when it sends again:
the first EVENTS_NAMED of each kind in EVENTS_INTERVAL_S, and then one
event that counts the rest (`streams=N`), so that keys a client makes up
and drops cannot flood the log.

Under `[daemon] stream_keys = "bound"` a stream belongs to the client (a
connection, or a CURVE key: router._owner) that sent its first request
(`receive`'s `owner`) until it has sent
nothing for `silent_s` (HOLD_S when silence is off): another connection's
request with the key is not counted on it, only as `foreign`, and the
router answers it 403. The owner's own requests are all that keep it held,
so a hijacker's refused ones never extend it.
"""

from __future__ import annotations

import itertools
import threading
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from infermux.events import EventLog, Throttle

AGES = 256  # ages of served requests kept per stream: the percentiles are over the last AGES
WINDOW_S = 5  # the rates cover the last WINDOW_S seconds (the current one included)
KEY_CHARS = 128  # a longer key is counted under its first KEY_CHARS characters
CHECK_S = 0.25  # how often `check` looks for silent streams
EVENTS_NAMED, EVENTS_INTERVAL_S = 5, 10.0  # stream_silent/stream_resumed events with their key, per interval
HOLD_S = 5.0  # how long a quiet owner keeps its key under stream_keys = "bound" when stream_silent_s is 0
SERVED, SUPERSEDED = 200, 409
REFUSED = frozenset((429, 503, 504))
COUNTERS = ("received", "served", "superseded", "refused", "failed", "replaced_by_client")

Clock = Callable[[], float]


def stream_key(key: Any) -> str:
    """The name a request's key is counted under: its text, cut to KEY_CHARS ("5" and 5 are one stream)."""
    return str(key)[:KEY_CHARS]


class _PerSecond:
    """Counts in one-second buckets over the last WINDOW_S + 1 seconds."""

    __slots__ = ("stamps", "counts")

    def __init__(self) -> None:
        self.stamps = [-1] * (WINDOW_S + 1)
        self.counts = [0] * (WINDOW_S + 1)

    def add(self, second: int, count: int = 1) -> None:
        i = second % len(self.stamps)
        if self.stamps[i] != second:
            self.stamps[i], self.counts[i] = second, 0
        self.counts[i] += count

    def rate(self, now: float, since: float) -> float:
        """Per second over the last WINDOW_S seconds (the current one included), or since `since` if later."""
        second = int(now)
        total = sum(c for s, c in zip(self.stamps, self.counts) if second - WINDOW_S < s <= second)
        span = min(WINDOW_S - 1 + (now - second), now - since)
        return total / max(span, 1.0)


@dataclass
class Totals:
    """A stream's counters (also what a model's forgotten streams add up to)."""

    received: int = 0
    served: int = 0
    superseded: int = 0
    refused: int = 0
    failed: int = 0
    # Frames the client replaced by newer ones before sending them (its requests' `replaced` field): lost
    # on the client's side, never received here, so outside received = served + superseded + ...
    replaced_by_client: int = 0
    age_s: float = 0.0  # the ages of served requests, summed (Prometheus' _sum)

    def add(self, other: "Totals") -> None:
        for name in (*COUNTERS, "age_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Stream:
    """One (model or pipeline, key): its counters, recent rates and the ages of its last served requests.

    `receive` runs on the frontend thread, `answer` on whichever thread answers; a lock keeps the
    counters exact (received = served + superseded + refused + failed, once nothing is in flight)."""

    model: str
    key: str
    first_seen: float
    clock: Clock = time.monotonic
    totals: Totals = field(default_factory=Totals)
    last_seen: float = 0.0
    prev_seen: float = 0.0  # the request before the last: whether the stream was "active" (check)
    silent: bool = False
    owner: Any = None  # under stream_keys = "bound": the connection that holds the key (StreamTable.receive)
    foreign: int = 0  # requests with the key from other connections, refused while it was held
    _in: _PerSecond = field(default_factory=_PerSecond)
    _out: _PerSecond = field(default_factory=_PerSecond)
    _dropped: _PerSecond = field(default_factory=_PerSecond)
    _replaced: _PerSecond = field(default_factory=_PerSecond)  # frames the client replaced, as it told
    _ages: array = field(default_factory=lambda: array("d"))  # ms, a ring of AGES once full
    _capture_ages: array = field(default_factory=lambda: array("d"))  # ms from capture, a ring of AGES once full
    _captured: int = 0  # served requests that said when they were captured
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def receive(self, now: float, replaced: int = 0) -> None:
        with self._lock:
            self.totals.received += 1
            self.prev_seen, self.last_seen = self.last_seen, now
            self._in.add(int(now))
            if replaced:
                self.totals.replaced_by_client += replaced
                self._replaced.add(int(now), replaced)

    def answer(self, status: int, age_ns: int, capture_age_s: float | None = None) -> None:
        now = self.clock()
        with self._lock:
            totals = self.totals
            if status == SERVED:
                totals.served += 1
                totals.age_s += age_ns / 1e9
                _ring(self._ages, totals.served, age_ns / 1e6)
                if capture_age_s is not None:
                    self._captured += 1
                    _ring(self._capture_ages, self._captured, capture_age_s * 1e3)
                self._out.add(int(now))
                return
            if status == SUPERSEDED:
                totals.superseded += 1
            elif status in REFUSED:
                totals.refused += 1
            else:
                totals.failed += 1
            self._dropped.add(int(now))

    def in_flight(self) -> int:
        t = self.totals
        return t.received - t.served - t.superseded - t.refused - t.failed

    def ages_ms(self) -> list[float]:
        """The ages of the last AGES served requests, in ms (a copy)."""
        with self._lock:
            return list(self._ages)

    def view(self, now: float) -> dict[str, Any]:
        """What admin `streams`, the stats stream and the console show of it."""
        with self._lock:
            t = self.totals
            counts = {name: getattr(t, name) for name in COUNTERS}
            ages = sorted(self._ages)
            captured = sorted(self._capture_ages)
            fps = {"fps_in": self._in.rate(now, self.first_seen), "fps_served": self._out.rate(now, self.first_seen),
                   "fps_dropped": self._dropped.rate(now, self.first_seen),
                   "fps_replaced_by_client": self._replaced.rate(now, self.first_seen)}
        return {"model": self.model, "key": self.key, **counts, "foreign": self.foreign,
                "age_ms": {"p50": percentile(ages, 50), "p99": percentile(ages, 99)},
                "capture_age_ms": {"p50": percentile(captured, 50), "p95": percentile(captured, 95),
                                   "p99": percentile(captured, 99)},
                "last_seen_s": round(now - self.last_seen, 3), **{k: round(v, 2) for k, v in fps.items()},
                "silent": self.silent}


def _ring(ages: array, count: int, value: float) -> None:
    """Keep `value`, the `count`-th, in a ring of the last AGES."""
    if len(ages) < AGES:
        ages.append(value)
    else:
        ages[count % AGES] = value


def percentile(ordered: list[float], q: float) -> float | None:
    """Nearest rank of sorted `ordered` (as execution/stats.py); None when empty."""
    if not ordered:
        return None
    rank = min(len(ordered), max(1, -(-len(ordered) * q // 100)))
    return round(ordered[int(rank) - 1], 3)


class StreamTable:
    """Every stream the daemon tracks, least recently seen first, and what forgotten ones added up to."""

    def __init__(self, events: EventLog | None = None, silent_s: float = 5.0, max_keys: int = 1024,
                 clock: Clock = time.monotonic) -> None:
        self.events, self.silent_s, self.max_keys, self.clock = events, silent_s, max_keys, clock
        self._streams: OrderedDict[tuple[str, str], Stream] = OrderedDict()
        self._next_check = 0.0
        self._quiet_at = 0.0  # silent_s after the last request: every stream's silence is seen by then
        self.forgotten: dict[str, Totals] = {}  # per model: the streams forgotten to stay within max_keys
        self._lock = threading.Lock()  # the table's shape; each stream counts under its own lock
        # stream_silent and stream_resumed: keys a client makes up at will come and go as fast as it
        # likes, so a few events of each kind per interval name their key, one more sums up the rest.
        self._told = Throttle(first=EVENTS_NAMED, interval_s=EVENTS_INTERVAL_S, clock=clock)

    def foreign(self, model: str, key: Any, owner: Any) -> bool:
        """Whether `key`'s stream of `model` belongs to a connection other than `owner` that has sent
        within `silent_s` (stream_keys = "bound"; frontend thread, before `receive`): then the request
        is counted as the stream's `foreign` and not received."""
        now = self.clock()
        with self._lock:
            stream = self._streams.get((model, stream_key(key)))
            if stream is None or stream.owner in (None, owner) or now - stream.last_seen >= (self.silent_s or HOLD_S):
                return False
            stream.foreign += 1
            return True

    def receive(self, model: str, key: Any, owner: Any = None, replaced: int = 0) -> Stream:
        """Count a request of `key` to `model` (frontend thread), and the `replaced` frames its client says
        it dropped before it; its stream, to count the answer on. With an `owner` (stream_keys = "bound":
        the sending connection, `foreign` asked first), the stream is that connection's from now on."""
        name = (model, stream_key(key))
        now = self.clock()
        self._quiet_at = now + self.silent_s
        with self._lock:
            stream = self._streams.get(name)
            if stream is None:
                stream = self._streams[name] = Stream(model, name[1], now, self.clock)
                if len(self._streams) > self.max_keys:
                    self._forget_one()
            else:
                self._streams.move_to_end(name)
            if owner is not None:
                stream.owner = owner
        stream.receive(now, replaced)
        if stream.silent:
            stream.silent = False
            self._emit("stream_resumed", stream, now)
        return stream

    def _forget_one(self) -> None:
        """Drop the least recently seen stream with nothing in flight among the 64 least recently seen
        (else the least recently seen): its answers still to come would be counted nowhere."""
        oldest = list(itertools.islice(self._streams, 64))
        victim = next((name for name in oldest if self._streams[name].in_flight() == 0), oldest[0])
        stream = self._streams.pop(victim)
        self.forgotten.setdefault(stream.model, Totals()).add(stream.totals)

    def streams(self) -> list[Stream]:
        """The tracked streams, least recently seen first (a copy of the list)."""
        with self._lock:
            return list(self._streams.values())

    def check(self) -> None:
        """Mark streams silent that were active and have sent nothing for `silent_s` (a frontend tick;
        it looks at most every CHECK_S)."""
        now = self.clock()
        if not self.silent_s or now < self._next_check:
            return
        self._next_check = now + CHECK_S
        for stream in self.streams():  # least recently seen first: the silent ones are at the front
            quiet = now - stream.last_seen
            if quiet < self.silent_s:
                break
            if not stream.silent and stream.prev_seen and stream.last_seen - stream.prev_seen <= self.silent_s:
                stream.silent = True
                self._emit("stream_silent", stream, now)
        for kind, count in self._told.held().items():
            self._sum_up(kind, count)

    def _sum_up(self, kind: str, count: int) -> None:
        """The one event for `count` streams of `kind` not named in an interval (no key: too many)."""
        if self.events is not None:
            self.events.emit(kind, streams=count, within_s=self._told.interval_s)

    def due(self, now: float) -> float | None:
        """Seconds from `now` until `check` must look again: every CHECK_S until each stream that
        could go silent has been seen silent (`silent_s` after the last request, plus one look);
        then None, and an idle daemon does not wake for streams."""
        if not self.silent_s or now > self._quiet_at + CHECK_S:
            return None
        return self._next_check - now

    def _emit(self, kind: str, stream: Stream, now: float) -> None:
        held = self._told.admit(kind) if self.events is not None else None
        if held:  # the first of a new interval: the last one's unnamed go first
            self._sum_up(kind, held)
        if held is not None and self.events is not None:
            detail: dict[str, Any] = {"key": stream.key}
            if kind == "stream_silent":
                detail["silent_s"] = round(now - stream.last_seen, 1)
            self.events.emit(kind, stream.model, **detail)

    def view(self, model: str | None = None) -> list[dict[str, Any]]:
        """Every tracked stream (of `model`), by model then key."""
        now = self.clock()
        found = [s for s in self.streams() if model is None or s.model == model]
        return [s.view(now) for s in sorted(found, key=lambda s: (s.model, s.key))]
