"""`track`: identities for a stream's regions across its frames (ByteTrack-style IoU association).

Each stream (the request's `key`) has its own tracks. A frame's regions are
matched to the tracks' predicted boxes in two stages, as ByteTrack does: the
regions scored at least `high_score` first, against every track; then the
regions between `low_score` and `high_score` against the tracks that were
seen on the previous frame and are still unmatched. An object that another
one partly hides is often detected with a low score: the second stage keeps
its track instead of throwing the detection away as noise. A high-score
region that matched nothing starts a track; a track that matches nothing is
kept for `max_lost` frames, its box moving on at its velocity, so that a
short occlusion or a missed detection does not end it.

Matching is greedy in descending IoU (the pair that overlaps most first), on
the axis-aligned bounds of the regions' boxes; a track's box is predicted by
a constant-velocity alpha-beta filter on its centre (a steady-state Kalman
filter), in frames: a stream's frames are assumed to come at its camera's
rate, so frames the daemon dropped make the prediction lag behind.

Streams are independent and run in parallel; one stream's frames take its
lock in turn, and its state moves on in the order its frames arrived
(`Sample.time_ns`): a frame that reaches the step after a newer frame of its
stream (two pipeline threads, the newer one faster) is matched against the
tracks as they are, without changing them, so its regions get ids but move
no track and start none. Memory is bounded: `max_keys` streams (the least
recently seen is forgotten first) of `max_tracks` tracks each; a stream
silent for `track_ttl_s` is forgotten. Track ids are unique within the
processor (across its streams), never reused, starting at 1.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from infermux.plugins.processors.base import ProcessorError, Region, Sample, parse_config

log = logging.getLogger("infermux.processors.track")

FORGOT_LINE_S = 10.0  # streams forgotten past max_keys: one log line per interval at most, the rest counted
KEY_SHOWN = 64  # a key in a log line is cut to this many characters

ALPHA, BETA = 0.7, 0.3  # the filter's gains on position and velocity: detections are trusted, velocity smoothed


@dataclass(frozen=True)
class TrackConfig:
    """`high_score`/`low_score`: the two detection bands (below `low_score`, a region is ignored);
    `match_iou`/`low_match_iou`: least IoU for a match in the first and second stage; `max_lost`:
    frames a track survives unmatched; `track_ttl_s`: seconds of silence after which a stream's
    tracks are forgotten; `max_keys`, `max_tracks`: the memory bounds; `keep_untracked`: keep the
    regions that got no track (without `track_id`) instead of dropping them."""

    high_score: float = 0.5
    low_score: float = 0.1
    match_iou: float = 0.2
    low_match_iou: float = 0.5
    max_lost: int = 15
    track_ttl_s: float = 10.0
    max_keys: int = 256
    max_tracks: int = 64
    keep_untracked: bool = False

    def check(self) -> tuple[str, str] | None:
        for name in ("high_score", "low_score", "match_iou", "low_match_iou"):
            if not 0 <= getattr(self, name) <= 1:
                return name, "must be between 0 and 1"
        if self.low_score > self.high_score:
            return "low_score", f"must not be above high_score ({self.high_score})"
        if self.max_lost < 0:
            return "max_lost", "must not be negative"
        if self.track_ttl_s <= 0:
            return "track_ttl_s", "must be positive"
        for name in ("max_keys", "max_tracks"):
            if getattr(self, name) < 1:
                return name, "must be at least 1"
        return None


def _quoted(key: Any) -> str:
    """A key as a log line shows it: quoted and escaped (repr), at most KEY_SHOWN characters of it."""
    if not isinstance(key, str):
        return repr(key)
    return repr(key) if len(key) <= KEY_SHOWN else repr(key[:KEY_SHOWN]) + f"... ({len(key)} characters)"


def bounds(regions: list[Region]) -> np.ndarray:
    """The regions' axis-aligned bounds, [x0, y0, x1, y1] each (float64 (n, 4))."""
    if not regions:
        return np.zeros((0, 4))
    boxes = np.stack([np.asarray(r.box, np.float64) for r in regions])
    return np.concatenate([boxes.min(axis=1), boxes.max(axis=1)], axis=1)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of every [x0, y0, x1, y1] row of `a` with every row of `b` ((len a, len b))."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    wide = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    high = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = wide * high
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def greedy_match(iou: np.ndarray, threshold: float) -> list[tuple[int, int]]:
    """(row, column) pairs with IoU at least `threshold`, the largest first, each row and column once."""
    if not iou.size:
        return []
    rows, cols = np.nonzero(iou >= threshold)
    order = np.argsort(-iou[rows, cols], kind="stable")
    used_rows: set[int] = set()
    used_cols: set[int] = set()
    pairs = []
    for i in order:
        r, c = int(rows[i]), int(cols[i])
        if r not in used_rows and c not in used_cols:
            used_rows.add(r)
            used_cols.add(c)
            pairs.append((r, c))
    return pairs


@dataclass
class Tracks:
    """One stream's tracks as parallel arrays (a row per track): few numpy calls per frame, whatever the count."""

    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    center: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    size: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    velocity: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    lost: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # frames since last matched
    hits: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def boxes(self) -> np.ndarray:
        return np.concatenate([self.center - self.size / 2, self.center + self.size / 2], axis=1)

    def keep(self, mask: np.ndarray) -> None:
        if mask.all():
            return
        for name in ("ids", "center", "size", "velocity", "lost", "hits"):
            setattr(self, name, getattr(self, name)[mask])

    def add(self, ids: list[int], boxes: np.ndarray) -> None:
        n = len(ids)
        if not n:
            return
        self.ids = np.concatenate([self.ids, np.asarray(ids, np.int64)])
        self.center = np.concatenate([self.center, (boxes[:, :2] + boxes[:, 2:]) / 2])
        self.size = np.concatenate([self.size, boxes[:, 2:] - boxes[:, :2]])
        self.velocity = np.concatenate([self.velocity, np.zeros((n, 2))])
        self.lost = np.concatenate([self.lost, np.zeros(n, np.int64)])
        self.hits = np.concatenate([self.hits, np.ones(n, np.int64)])

    def update(self, rows: np.ndarray, boxes: np.ndarray) -> None:
        """Matched tracks `rows` saw `boxes`: correct position, size and velocity (after the prediction)."""
        if not len(rows):
            return
        edges = boxes - self.boxes()[rows]  # how far each edge is from where it was predicted
        low, high = edges[:, :2], edges[:, 2:]
        # An object going behind something (or coming out) is seen cut: one edge stops while the other
        # moves on as predicted. Where one edge is far more off than the other, follow the other.
        one_sided = np.maximum(np.abs(low), np.abs(high)) > 2 * np.minimum(np.abs(low), np.abs(high)) + 1
        residual = np.where(one_sided, np.where(np.abs(low) < np.abs(high), low, high), (low + high) / 2)
        gap = (self.lost[rows] + 1)[:, None]  # frames since the track was last seen
        second = (self.hits[rows] == 1)[:, None]  # its first velocity is the step it just made
        self.velocity[rows] = np.where(second, residual / gap, self.velocity[rows] + BETA * residual / gap)
        self.center[rows] += np.where(second, 1.0, ALPHA) * residual
        # A cut box says nothing of the object's size: keep the size it had.
        seen = boxes[:, 2:] - boxes[:, :2]
        self.size[rows] += np.where(one_sided, 0.0, ALPHA) * (seen - self.size[rows])
        self.lost[rows] = 0
        self.hits[rows] += 1


@dataclass
class Stream:
    """One key's tracks, its lock, and when it was last seen (monotonic s) and its newest frame (time_ns)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    tracks: Tracks = field(default_factory=Tracks)
    last_seen: float = 0.0
    newest_ns: int = -1


class Track:
    """Sets each region's `track_id` from its stream's tracks; drops regions without one (see the module)."""

    kind = "track"

    def __init__(self, options: Mapping[str, Any], step: str = "track") -> None:
        self.step = step
        self.config = parse_config(step, TrackConfig, options)
        self._streams: OrderedDict[str | int, Stream] = OrderedDict()  # least recently seen first
        self._lock = threading.Lock()  # guards `_streams` and the id counter, never held while matching
        self._next_id = 1
        self.forgotten = 0  # streams forgotten past max_keys, since the step was built
        self._unsaid, self._said_at = 0, float("-inf")  # streams forgotten and not yet logged; the last line
        self._latest: str | int | None = None

    def __call__(self, sample: Sample) -> None:
        if sample.key is None:
            raise ProcessorError(self.step, "needs the request's \"key\": the stream (camera) the frame "
                                 "belongs to, whose regions are tracked across its frames")
        arrived = sample.time_ns if sample.time_ns is not None else time.perf_counter_ns()
        stream = self._stream(sample.key)
        with stream.lock:
            newest = arrived > stream.newest_ns
            ids = self._associate(stream.tracks, sample.regions, advance=newest)
            if newest:
                stream.newest_ns = arrived
        for region, track_id in zip(sample.regions, ids):
            region.track_id = track_id
        if not self.config.keep_untracked:
            keep = [i for i, track_id in enumerate(ids) if track_id is not None]
            if len(sample.crops) == len(sample.regions):
                sample.crops = [sample.crops[i] for i in keep]
            sample.regions = [sample.regions[i] for i in keep]

    def streams(self) -> dict[str, int]:
        """How many streams are tracked and their tracks in all (for the pipeline's view)."""
        with self._lock:
            self._say_forgotten(time.monotonic())  # what the last burst of forgetting left unsaid
            streams = list(self._streams.values())
        return {"streams": len(streams), "tracks": sum(len(s.tracks.ids) for s in streams)}

    def _stream(self, key: str | int) -> Stream:
        """`key`'s stream (made on its first frame); forgets silent streams, and the least recent beyond max_keys."""
        now = time.monotonic()
        with self._lock:
            while self._streams:
                oldest_key, oldest = next(iter(self._streams.items()))
                if now - oldest.last_seen <= self.config.track_ttl_s:
                    break
                del self._streams[oldest_key]
            stream = self._streams.pop(key, None)
            if stream is None:
                stream = Stream()
                if len(self._streams) >= self.config.max_keys:
                    forgotten, _ = self._streams.popitem(last=False)
                    self._forgot(forgotten)
            stream.last_seen = now
            self._streams[key] = stream
            return stream

    def _forgot(self, key: str | int) -> None:
        """A stream forgotten past max_keys (under `_lock`): counted, and told in one line per
        FORGOT_LINE_S at most, the rest summed up in the next, so that keys cycling through the step
        cannot flood the log."""
        self.forgotten += 1
        self._unsaid += 1
        self._latest = key
        self._say_forgotten(time.monotonic())

    def _say_forgotten(self, now: float) -> None:
        if not self._unsaid or now - self._said_at < FORGOT_LINE_S:
            return
        count, since = self._unsaid, now - self._said_at
        self._unsaid, self._said_at = 0, now
        what = f"stream {_quoted(self._latest)}" if count == 1 else \
            f"{count} streams in the last {since:.0f} s (the latest {_quoted(self._latest)})"
        log.warning("step %r: tracking more than max_keys=%d streams; forgot %s, the least recently seen "
                    "(raise max_keys to track more cameras)", self.step, self.config.max_keys, what)

    def _ids(self, n: int) -> list[int]:
        with self._lock:
            first, self._next_id = self._next_id, self._next_id + n
        return list(range(first, first + n))

    def _associate(self, tracks: Tracks, regions: list[Region], advance: bool) -> list[int | None]:
        """Each region's track id (None: none), by the two-stage match; with `advance`, the tracks move
        on to this frame: predicted, corrected, aged, born."""
        c = self.config
        dets = bounds(regions)
        scores = np.array([r.score for r in regions], np.float64)
        high = np.flatnonzero(scores >= c.high_score)
        low = np.flatnonzero((scores >= c.low_score) & (scores < c.high_score))
        if advance:
            tracks.center += tracks.velocity
        boxes = tracks.boxes()
        pairs = [(t, high[d]) for t, d in greedy_match(iou_matrix(boxes, dets[high]), c.match_iou)]
        matched = {t for t, _ in pairs}
        recent = np.array([t for t in np.flatnonzero(tracks.lost == 0) if t not in matched], np.intp)
        pairs += [(recent[t], low[d]) for t, d in greedy_match(iou_matrix(boxes[recent], dets[low]),
                                                                c.low_match_iou)]
        ids: list[int | None] = [None] * len(regions)
        for t, d in pairs:
            ids[int(d)] = int(tracks.ids[t])
        if advance:
            self._advance(tracks, pairs, dets, high, ids)
        return ids

    def _advance(self, tracks: Tracks, pairs: list[tuple[Any, Any]], dets: np.ndarray, high: np.ndarray,
                 ids: list[int | None]) -> None:
        """The tracks move on to this frame: the matched corrected, the others aged (and the long lost
        ended), a track born for each high-score region left over (its id written into `ids`)."""
        c = self.config
        rows = np.array([t for t, _ in pairs], np.intp)
        unmatched = np.ones(len(tracks.ids), bool)
        unmatched[rows] = False
        tracks.lost[unmatched] += 1
        tracks.update(rows, dets[np.array([d for _, d in pairs], np.intp)])
        tracks.keep(tracks.lost <= c.max_lost)
        used = {int(d) for _, d in pairs}
        births = [int(d) for d in high if int(d) not in used]
        births = births[:self._room(tracks, len(births))]
        born = self._ids(len(births))
        for d, track_id in zip(births, born):
            ids[d] = track_id
        tracks.add(born, dets[births])

    def _room(self, tracks: Tracks, wanted: int) -> int:
        """Make room for up to `wanted` new tracks under max_tracks by ending the longest-lost ones;
        how many fit. A track seen on this frame is never ended for a new one."""
        free = self.config.max_tracks - len(tracks.ids)
        if free >= wanted:
            return wanted
        lost = np.flatnonzero(tracks.lost > 0)
        ending = lost[np.argsort(-tracks.lost[lost], kind="stable")][:wanted - max(free, 0)]
        if ending.size:
            mask = np.ones(len(tracks.ids), bool)
            mask[ending] = False
            tracks.keep(mask)
        return min(wanted, self.config.max_tracks - len(tracks.ids))
