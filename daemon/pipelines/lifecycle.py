"""Tracked objects' lifecycles: the `new`, `update` and `end` events a pipeline's `track` step ids make.

Per stream key, each track id is an object. It is `new` once seen
`min_frames` times scoring at least `min_score` (a passing false alarm makes
no event); then an `update` when its label, its zones or its best score (by
`min_score_gain` at least) change, at most one per `update_every_s` (a change
in between is sent when that time is up, or rides on the `end`); and `end`
once unseen for `end_after_s`. On a camera with zones and lines (zones.py), an announced object's
moves are events too: `enter` and `exit` per zone, `cross` per line with its direction; what it did
before its `new` follows the `new` (an `enter` per zone it is in, the crossings it made), and one that
ends inside zones exits them before its `end`. The events go to the sinks (daemon/sinks/),
which only append them to their spools: nothing here waits for a sink.
Times are the frames' capture times where the request gave one, else when
the daemon received them (docs/events.md).

With `snapshots` on, each object's best frame (its highest score, a box
wholly inside the frame before one at an edge) is held, by reference, until
its next event, which hands it to the snapshots' writer (snapshots.py) and
names the files; the same files are written again by a later event whose
object was since seen better.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from infermux.plugins.processors.base import Region
from infermux.config import LifecycleConfig
from infermux.pipelines.geometry import anchor
from infermux.pipelines.seen import Seen, inside
from infermux.pipelines.zones import MAX_PENDING, NO_LABEL, Areas, Move, Presence, ZoneBook, follow

if TYPE_CHECKING:
    from infermux.pipelines.snapshots import Snapshots

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class Ids:
    """ULIDs: 48 bits of milliseconds then 80 random bits, in Crockford's base 32; ids made in one
    millisecond count up, so they sort in the order they were made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms, self._last = 0, 0

    def new(self) -> str:
        ms = time.time_ns() // 1_000_000
        with self._lock:
            if ms <= self._last_ms:
                ms, rand = self._last_ms, (self._last + 1) & ((1 << 80) - 1)
            else:
                rand = int.from_bytes(os.urandom(10), "big") >> 1  # room to count up within the millisecond
            self._last_ms, self._last = ms, rand
        value = (ms << 80) | rand
        return "".join(CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


IDS = Ids()


@dataclass
class TrackedObject:
    """What is known of one track: when it was seen, its best score and label, what was last sent."""

    key: str
    track_id: int
    first_seen: float
    last_seen: float
    last_mono: float
    box: list[list[float]]
    label: str | None = None
    score: float = 0.0
    hits: int = 0  # frames it scored at least min_score
    frames: int = 0
    zones: tuple[str, ...] = ()
    announced: bool = False
    captured: bool = False  # its times are the frames' capture times
    sent: tuple[str | None, float, tuple[str, ...]] = (None, 0.0, ())  # label, score, zones of the last event
    sent_mono: float = 0.0
    presence: Presence = field(default_factory=Presence)  # its zones and lines' sides
    counted: dict[str, str] = field(default_factory=dict)  # zone -> the label it was counted under there
    pending: list[Move] = field(default_factory=list)  # crossings made before its `new`
    best: tuple[bool, float] = (False, -1.0)  # its best frame's rank: box inside the frame, then score
    best_frame: tuple[Seen, int] | None = None  # that frame and its region's index, until an event queues it
    uid: str = ""  # its snapshots' file names (a ULID, made at its first snapshot)
    snapshot: dict[str, Any] | None = None  # the `snapshot` field of its events


class Snapper(Protocol):
    """Where an object's best frame goes (snapshots.py's Snapshots): queued, never waited on."""

    def object_snapshot(self, uid: str, label: str | None, seen: Seen, index: int) -> dict[str, Any] | None: ...


Size = tuple[int, int]  # a frame's width and height, in pixels
EventFn = Callable[[dict[str, Any]], None]


class Lifecycle:
    """The objects of one pipeline's streams; `observe` takes a frame's regions, `sweep` ends the
    objects gone quiet. Both return the events they made, in order. Safe from any thread."""

    def __init__(self, config: LifecycleConfig, pipeline: str, clock: Callable[[], float] = time.monotonic,
                 zones: ZoneBook | None = None, outlet: "Outlet | None" = None) -> None:
        self.config, self.pipeline, self._clock = config, pipeline, clock
        self.zones = zones or ZoneBook()
        self._outlet = outlet  # its `snapshots`, read at each event: the daemon connects it after the build
        self._objects: dict[tuple[str, int], TrackedObject] = {}
        self._lock = threading.Lock()
        self.made = {"new": 0, "update": 0, "end": 0, "enter": 0, "exit": 0, "cross": 0}
        self.not_followed = 0  # objects seen while max_objects were followed

    def observe(self, key: str, regions: list[Region], seen: float, captured: bool,
                size: Size | None = None, frame: Seen | None = None) -> list[dict[str, Any]]:
        """A frame of stream `key` seen at `seen` (Unix seconds), `size` pixels (None: unknown, its
        zones not looked at): its tracked regions' events. `frame` (its image and these regions, in
        order), where given, may become an object's best frame."""
        now = self._clock()
        out: list[dict[str, Any]] = []
        with self._lock:
            for index, region in enumerate(regions):
                if region.track_id is not None:
                    followed = self._one(key, region, seen, captured, now, size)
                    if followed is not None:
                        self._best(followed[0], region, frame, index)
                        self._events(*followed, captured, now, out)
        return out

    def _best(self, obj: TrackedObject, region: Region, frame: Seen | None, index: int) -> None:
        if frame is None or not self.config.snapshots or region.score < self.config.min_score:
            return
        rank = (inside(region.box, *frame.size), float(region.score))
        if rank > obj.best:
            obj.best, obj.best_frame = rank, (frame, index)

    def _one(self, key: str, region: Region, seen: float, captured: bool, now: float,
             size: Size | None) -> tuple[TrackedObject, list[Move]] | None:
        """The region's object, seen again (or new), and its moves in its camera's zones and lines."""
        obj = self._objects.get((key, region.track_id or 0))
        if obj is None:
            if len(self._objects) >= self.config.max_objects:
                self.not_followed += 1
                return None
            obj = TrackedObject(key, region.track_id or 0, seen, seen, now, box_of(region))
            self._objects[(key, obj.track_id)] = obj
        obj.frames += 1
        obj.last_mono, obj.captured = now, captured
        moves: list[Move] = []
        if seen >= obj.last_seen:  # a frame that overtook a newer one does not move the object back
            obj.last_seen, obj.box = seen, box_of(region)
            moves = self._moves(obj, size)
        obj.first_seen = min(obj.first_seen, seen)
        if region.label is not None:
            obj.label = region.label
        if region.score >= self.config.min_score:
            obj.hits += 1
            obj.score = max(obj.score, float(region.score))
        return obj, moves

    def _events(self, obj: TrackedObject, moves: list[Move], captured: bool, now: float,
                out: list[dict[str, Any]]) -> None:
        if not obj.announced:
            moves = self._announce(obj, moves, now, out)
            if not obj.announced:
                return
        out += [self._moved(obj, move) for move in moves]
        if self._changed(obj) and now - obj.sent_mono >= self.config.update_every_s:
            out.append(self._event("update", obj, captured, now))

    def _announce(self, obj: TrackedObject, moves: list[Move], now: float, out: list[dict[str, Any]]) -> list[Move]:
        """An object not yet `new`: its `new` once seen enough, and then the moves it made so far (an
        `enter` per zone it is in, its crossings); until then its crossings wait."""
        obj.pending += [m for m in moves if m.type == "cross"][:MAX_PENDING - len(obj.pending)]
        if obj.hits < self.config.min_frames:
            return []
        obj.announced = True
        out.append(self._event("new", obj, obj.captured, now))
        moves, obj.pending = [Move("enter", z) for z in obj.zones] + obj.pending, []
        return moves

    def _moves(self, obj: TrackedObject, size: Size | None) -> list[Move]:
        """The object's moves in its camera's zones and lines, now at its (new) box; its zones updated."""
        areas = self.zones.of(obj.key)
        if areas is None and not obj.presence.zones:
            return []
        if size is None or size[0] <= 0 or size[1] <= 0:
            return []
        moves = follow(areas or EMPTY, obj.presence, anchor(obj.box, *size))
        obj.zones = tuple(sorted(obj.presence.zones))
        return moves

    def _moved(self, obj: TrackedObject, move: Move) -> dict[str, Any]:
        """The event of an announced object's move, the count it changed with it."""
        self.made[move.type] += 1
        event = self._fields(move.type, obj, obj.captured)
        if move.type == "enter":
            obj.counted[move.name], count = self.zones.entered(obj.key, move.name, obj.label)
            return {**event, "zone": move.name, "counted": obj.counted[move.name], "count": count}
        if move.type == "exit":
            counted = obj.counted.pop(move.name, obj.label or NO_LABEL)
            return {**event, "zone": move.name, "counted": counted,
                    "count": self.zones.exited(obj.key, move.name, counted)}
        counted, count = self.zones.crossed(obj.key, move.name, move.direction, obj.label)
        return {**event, "line": move.name, "direction": move.direction, "counted": counted, "count": count}

    def _leave(self, obj: TrackedObject, now: float) -> list[dict[str, Any]]:
        """An announced object's last events: an `exit` from each zone it is counted in, then its `end`
        (which keeps the zones it was last seen in)."""
        zones = obj.zones
        out = []
        for zone in sorted(obj.counted):
            obj.zones = tuple(z for z in obj.zones if z != zone)
            out.append(self._moved(obj, Move("exit", zone)))
        obj.zones = zones
        out.append(self._event("end", obj, obj.captured, now))
        return out

    def _changed(self, obj: TrackedObject) -> bool:
        label, score, zones = obj.sent
        return obj.label != label or obj.zones != zones or obj.score >= score + self.config.min_score_gain

    def sweep(self) -> list[dict[str, Any]]:
        """The `end` of every object unseen for end_after_s, and the `update`s whose wait is over."""
        now = self._clock()
        out: list[dict[str, Any]] = []
        with self._lock:
            for ident, obj in list(self._objects.items()):
                if now - obj.last_mono >= self.config.end_after_s:
                    del self._objects[ident]
                    if obj.announced:
                        out += self._leave(obj, now)
                elif obj.announced and self._changed(obj) and now - obj.sent_mono >= self.config.update_every_s:
                    out.append(self._event("update", obj, obj.captured, now))
        return out

    def end_all(self) -> list[dict[str, Any]]:
        """The `end` of every object announced (the pipeline stops: a reload rebuilds its tracks)."""
        now = self._clock()
        with self._lock:
            gone, self._objects = list(self._objects.values()), {}
            return [event for obj in gone if obj.announced for event in self._leave(obj, now)]

    def _event(self, kind: str, obj: TrackedObject, captured: bool, now: float) -> dict[str, Any]:
        """A lifecycle event (`new`, `update`, `end`): what it says is what the next change is against."""
        obj.sent, obj.sent_mono = (obj.label, obj.score, obj.zones), now
        self.made[kind] += 1
        self._snap(obj)
        return self._fields(kind, obj, captured)

    def _fields(self, kind: str, obj: TrackedObject, captured: bool) -> dict[str, Any]:
        event = {"id": IDS.new(), "type": kind, "time": round(time.time(), 6), "pipeline": self.pipeline,
                 "key": obj.key, "track_id": obj.track_id, "label": obj.label, "score": round(obj.score, 6),
                 "box": obj.box, "first_seen": round(obj.first_seen, 6), "last_seen": round(obj.last_seen, 6),
                 "frames": obj.frames, "zones": list(obj.zones), "captured": captured}
        if obj.snapshot is not None:
            event["snapshot"] = obj.snapshot
        return event

    def _snap(self, obj: TrackedObject) -> None:
        """Hand the object's best frame, if it changed since its last event, to the snapshots' writer."""
        snapper = self._outlet.snapshots if self._outlet is not None else None
        if obj.best_frame is None or snapper is None:
            return
        seen, index = obj.best_frame
        obj.uid = obj.uid or IDS.new()
        queued = snapper.object_snapshot(obj.uid, obj.label, seen, index)
        obj.best_frame = None  # queued, or dropped (the queue was full): the frame is let go either way
        if queued is not None:
            obj.snapshot = queued

    def following(self) -> bool:
        """Whether some object is followed (the sweeper has something to end)."""
        with self._lock:
            return bool(self._objects)

    def counts(self) -> dict[str, Any]:
        """For the views: objects followed now, events made by type, objects not followed (max_objects)."""
        with self._lock:
            return {"objects": len(self._objects), "events": dict(self.made), "not_followed": self.not_followed}


EMPTY = Areas((), ())  # a camera whose zones a reload removed: its objects exit them


def box_of(region: Region) -> list[list[float]]:
    """The region's box as the reply gives it: four [x, y] corners, clockwise from top-left."""
    return [[round(float(x), 2), round(float(y), 2)] for x, y in region.box]


class Outlet:
    """Where a pipeline's events and frame results go: the sinks' hub once the daemon connects it
    (`events(pipeline, event)`; `results(pipeline, key, header)` only while a sink publishes results)."""

    def __init__(self) -> None:
        self.events: Callable[[str, dict[str, Any]], None] | None = None
        self.results: Callable[[str, str, dict[str, Any]], None] | None = None
        # The snapshots (snapshots.py): each keyed stream's newest frame, and objects' best frames.
        self.snapshots: "Snapshots | None" = None
        # Set while a pipeline may be following an object: without one, the sweeper sleeps (an idle
        # daemon wakes for nothing).
        self.following = threading.Event()


def seen_at(captured: Any, received_ns: int) -> tuple[float, bool]:
    """A frame's time in Unix seconds, and whether it is its capture time: the request's `captured`
    (seconds, or nanoseconds where it is that large) when it gave a finite positive one, else when
    the daemon received it (`received_ns` on the perf_counter clock)."""
    if isinstance(captured, (int, float)) and not isinstance(captured, bool) and 0 < captured < float("inf"):
        return (captured / 1e9 if captured > 1e12 else float(captured)), True
    return time.time() - (time.perf_counter_ns() - received_ns) / 1e9, False
