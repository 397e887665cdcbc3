"""Secondary inference per track: which of a frame's regions a fan-out model step computes now.

A `for_each = "regions"` model step with `reinfer_every = N` computes a
tracked region (one with a `track_id`) on its track's first frame and then
every N frames of that track; `reinfer_growth = g` also when the box's area
has changed by g (a fraction) since it was last computed. Between, the
region takes the answer its track got when the step last ran, and does not
run the step or the rest of its stage. `max_calls_per_s` bounds the regions
the step computes per second, over every stream of the pipeline (a token
bucket holding one second's worth), split fairly across the streams that
are sending (`FairBudget`: each its share, so one flooding camera cannot
starve the others): a region that should be computed while its stream's
share is spent takes its track's last answer if there is one and is
computed on a later frame; one without an answer is skipped.

The answer is what the stage leaves on the region: its `label`, `text` and
`text_score`. What is remembered is bounded like the `track` step before the
step (its `track_ttl_s`, `max_keys`, `max_lost`, `max_tracks`): a stream's
memory goes with its silence, a track's once it has been unseen for longer
than a track can be lost. One lock guards it all, held only to decide and to
remember, never while a model runs.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from infermux.plugins.processors.base import Region


@dataclass(frozen=True)
class Policy:
    """A step's options: `every` frames (0: not by count), `growth` of the box area (0: not by size),
    `max_calls_per_s` (0: no bound)."""

    every: int = 0
    growth: float = 0.0
    max_calls_per_s: float = 0.0

    @property
    def caches(self) -> bool:
        """Whether an answer may be reused while it is fresh (not only when the budget is spent)."""
        return bool(self.every or self.growth)


@dataclass(frozen=True)
class Lifetimes:
    """How long memory lasts, from the `track` step the answers are kept by."""

    ttl_s: float = 10.0
    max_keys: int = 256
    forget_after: int = 16  # a stream's frames a track may go unseen (the track step's max_lost + 1)
    max_tracks: int = 128


ACTIVE_S = 2.0  # a stream that sent a frame this recently is active: it has a share of max_calls_per_s


class TokenBucket:
    """`rate` tokens a second, holding at most `burst`; starts full."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._at = burst, clock()

    def take(self, wanted: int) -> int:
        """Take up to `wanted` whole tokens; how many were taken (not thread-safe: the caller's lock)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        granted = min(wanted, int(self._tokens))
        self._tokens -= granted
        return granted


class FairBudget:
    """`rate` calls a second split evenly across the streams seen in the last ACTIVE_S: each has a
    bucket of its own filling at rate / n (n: the active streams), holding at most max(1, its share),
    so a stream that floods spends its own share and no other's. A shared bucket of `rate` (holding one
    second's worth) still bounds them all together, so that keys made up by the thousand, each with
    a new bucket, cannot add up to more than the step's rate. A new stream's bucket starts with its
    share (the first stream of all, alone, with the whole second's worth); `max_keys` buckets at most."""

    def __init__(self, rate: float, max_keys: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.max_keys, self._clock = rate, max_keys, clock
        self._total = TokenBucket(rate, max(1.0, rate), clock)
        self._keys: OrderedDict[str | int | None, list[float]] = OrderedDict()  # key -> [tokens, at]

    def take(self, key: str | int | None, wanted: int) -> int:
        """Take up to `wanted` whole calls for `key`'s frame; how many it may make now (the caller's lock)."""
        now = self._clock()
        while self._keys and now - next(iter(self._keys.values()))[1] > ACTIVE_S:
            self._keys.popitem(last=False)
        bucket = self._keys.pop(key, None)
        share = self.rate / (len(self._keys) + 1)
        if bucket is None:
            bucket = [max(1.0, share) if not self._keys else share, now]
            if len(self._keys) >= self.max_keys:
                self._keys.popitem(last=False)
        bucket[0] = min(max(1.0, share), bucket[0] + (now - bucket[1]) * share)
        bucket[1] = now
        self._keys[key] = bucket
        granted = min(wanted, int(bucket[0] + 1e-9))  # a share's tenths add up to 0.999...: still a call
        granted = self._total.take(granted) if granted else 0
        bucket[0] = max(0.0, bucket[0] - granted)
        return granted


@dataclass
class Answer:
    """What a stage left on a region."""

    label: str | None
    text: str | None
    text_score: float | None


@dataclass
class Memo:
    """One track's last answer: how many of its frames ago it was computed, its box area then, and the
    stream's frame count when the track was last seen."""

    answer: Answer | None = None
    frames: int = 0
    area: float = 0.0
    seen: int = 0


@dataclass
class KeyMemos:
    """One stream's memos by track id, its frame count (frames this step saw), when it was last seen."""

    tracks: dict[int, Memo] = field(default_factory=dict)
    frames: int = 0
    last_seen: float = 0.0


def area(region: Region) -> float:
    """The area of the region's axis-aligned bounds."""
    box = np.asarray(region.box, np.float64)
    return float(np.prod(box.max(axis=0) - box.min(axis=0)))


class Reinfer:
    """One fan-out model step's policy, budget and memory; shared by the pipeline's threads."""

    def __init__(self, policy: Policy, lifetimes: Lifetimes, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self.lifetimes, self._clock = policy, lifetimes, clock
        rate = policy.max_calls_per_s
        self._budget = FairBudget(rate, lifetimes.max_keys, clock) if rate else None
        self._keys: OrderedDict[str | int, KeyMemos] = OrderedDict()  # least recently seen first
        self._lock = threading.Lock()
        self.computed = self.reused = self.skipped = 0

    def admit(self, key: str | int | None, regions: list[Region]) -> list[int]:
        """The indices of `regions` the step computes now. Every other region has taken its track's
        last answer (`cached` True) or is `skipped`; the computed ones are marked `cached` False."""
        with self._lock:
            memos = self._memos(key)
            wanted: list[tuple[int, int]] = []  # (priority, index): no answer yet first, then the stalest
            for index, region in enumerate(regions):
                memo = self._memo(memos, region)
                if memo is None or memo.answer is None:
                    wanted.append((-1 << 30, index))
                elif self._due(memo, region):
                    wanted.append((-memo.frames, index))
            wanted.sort()
            granted = self._budget.take(key, len(wanted)) if self._budget and wanted else len(wanted)
            now = sorted(index for _, index in wanted[:granted])
            for index in now:
                memo = self._memo(memos, regions[index], count=False)
                if memo is not None:
                    memo.frames, memo.area = 0, area(regions[index])
                regions[index].cached = False
            self._reuse(memos, regions, set(now))
            if memos is not None:
                self._forget(memos)
            self.computed += len(now)
            return now

    def remember(self, key: str | int | None, region: Region) -> None:
        """`region` was computed: its answer is its track's from now on."""
        if key is None or region.track_id is None:
            return
        with self._lock:
            memos = self._keys.get(key)
            memo = memos.tracks.get(region.track_id) if memos is not None else None
            if memo is not None:
                memo.answer = Answer(region.label, region.text, region.text_score)

    def counts(self) -> dict[str, int]:
        """Regions computed, given a reused answer, skipped; streams and tracks remembered (for the views)."""
        with self._lock:
            return {"computed": self.computed, "reused": self.reused, "skipped": self.skipped,
                    "streams": len(self._keys), "tracks": sum(len(k.tracks) for k in self._keys.values())}

    def _memos(self, key: str | int | None) -> KeyMemos | None:
        """`key`'s memos, counting this frame; silent streams and those past max_keys are forgotten."""
        now = self._clock()
        while self._keys:
            oldest_key, oldest = next(iter(self._keys.items()))
            if now - oldest.last_seen <= self.lifetimes.ttl_s:
                break
            del self._keys[oldest_key]
        if key is None:
            return None
        memos = self._keys.pop(key, None)
        if memos is None:
            memos = KeyMemos()
            if len(self._keys) >= self.lifetimes.max_keys:
                self._keys.popitem(last=False)
        memos.last_seen, memos.frames = now, memos.frames + 1
        self._keys[key] = memos
        return memos

    def _memo(self, memos: KeyMemos | None, region: Region, count: bool = True) -> Memo | None:
        """The region's track's memo (made on its first frame; `count`: one more frame of the track)."""
        if memos is None or region.track_id is None:
            return None
        memo = memos.tracks.get(region.track_id)
        if memo is None:
            memo = memos.tracks[region.track_id] = Memo()
        elif count and memo.seen != memos.frames:
            memo.frames += 1
        memo.seen = memos.frames
        return memo

    def _due(self, memo: Memo, region: Region) -> bool:
        p = self.policy
        if not p.caches:
            return True
        if p.every and memo.frames >= p.every:
            return True
        return bool(p.growth) and abs(area(region) - memo.area) >= p.growth * max(memo.area, 1e-9)

    def _reuse(self, memos: KeyMemos | None, regions: list[Region], now: set[int]) -> None:
        for index, region in enumerate(regions):
            if index in now:
                continue
            memo = memos.tracks.get(region.track_id) if memos is not None and region.track_id is not None else None
            if memo is None or memo.answer is None:
                region.cached, region.skipped = False, True
                self.skipped += 1
            else:
                region.label, region.text, region.text_score = (memo.answer.label, memo.answer.text,
                                                                memo.answer.text_score)
                region.cached = True
                self.reused += 1

    def _forget(self, memos: KeyMemos) -> None:
        """Drop the tracks unseen for longer than a track lives unseen; at most max_tracks, the stalest go."""
        life = self.lifetimes
        stale = [t for t, m in memos.tracks.items() if memos.frames - m.seen > life.forget_after]
        for track_id in stale:
            del memos.tracks[track_id]
        if len(memos.tracks) > life.max_tracks:
            for track_id in sorted(memos.tracks, key=lambda t: memos.tracks[t].seen)[:len(memos.tracks) - life.max_tracks]:
                del memos.tracks[track_id]
