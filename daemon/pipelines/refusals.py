"""Frames a pipeline refused for what they are, remembered: sending one again costs a hash.

A frame that a step refuses with 400 or 413 (undecodable, over a bound) would be
refused again if sent again: nothing in it changed. Some of those refusals come
only after the work they bound: the detector runs before its regions can be
counted, and the regions are cropped before the widest can be measured. A client
looping on such a frame would keep a core busy computing refusals. So a pipeline
remembers its latest refusals by the frame's digest and what the request says
about it (format, geometry, stream key, outputs asked for), for `REMEMBER_S`; the same frame
again is answered the same refusal without running a step. The digest is taken only of a frame
whose size and description match a remembered refusal's: hashing a raw 1080p frame costs
milliseconds (docs/performance.md), which a camera whose frames are served should not pay. A frame that differs
by one byte is computed as any other: this bounds a loop, not an attacker who
varies the frame (docs/security.md).

Only a step's own refusals are remembered, never a model's answer (a model's
400 or 503 depends on its version and its load), and a reload that changes the
pipeline starts with nothing remembered.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from infermux.plugins.processors.base import Sample

REMEMBER_S = 60.0  # long enough to outlast a client's backoff between two sends of the same frame
CAPACITY = 256  # frames remembered per pipeline: a few hundred bytes each


@dataclass(frozen=True)
class FrameKind:
    """What the request says of its frame: its size in bytes, format and geometry, its stream's
    key (a `track` step refuses a frame without one) and the outputs it asks for. With the
    frame's digest, what decides a refusal."""

    size: int
    format: str
    geometry: tuple[int | None, int | None, int | None]  # width, height, stride as the request declares
    key: str | int | None
    wanted: tuple[str, ...]

    @classmethod
    def of(cls, sample: Sample, wanted: tuple[str, ...]) -> "FrameKind":
        """The kind of the frame in `sample` (its undecoded bytes)."""
        size = 0 if sample.data is None else int(sample.data.nbytes)
        return cls(size, sample.format, (sample.width, sample.height, sample.stride), sample.key, wanted)


def digest(sample: Sample) -> bytes:
    """A 16-byte BLAKE2b digest of the frame's bytes."""
    data = np.ascontiguousarray(sample.data if sample.data is not None else np.empty(0, np.uint8))
    return hashlib.blake2b(data.data, digest_size=16).digest()


@dataclass(frozen=True)
class Refusal:
    """A remembered refusal: its status and message, and when it was made."""

    status: int
    message: str
    at: float


class Refusals:
    """A pipeline's latest refusals of frames, bounded in number and age; safe across its threads."""

    def __init__(self, capacity: int = CAPACITY, remember_s: float = REMEMBER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity, self._remember_s, self._clock = capacity, remember_s, clock
        self._by_frame: OrderedDict[tuple[FrameKind, bytes], Refusal] = OrderedDict()
        self._kinds: Counter[FrameKind] = Counter()  # of the frames remembered: which need a digest
        self._lock = threading.Lock()
        self.recalled = 0  # frames answered from memory, for the views

    def remember(self, sample: Sample, kind: FrameKind, status: int, message: str) -> None:
        """Keep the refusal of the frame in `sample` (the oldest goes when full)."""
        frame = (kind, digest(sample))
        with self._lock:
            if frame not in self._by_frame:
                self._kinds[kind] += 1
            self._by_frame[frame] = Refusal(status, message, self._clock())
            self._by_frame.move_to_end(frame)
            while len(self._by_frame) > self._capacity:
                self._forget(next(iter(self._by_frame)))

    def recall(self, sample: Sample, kind: FrameKind) -> Refusal | None:
        """The refusal of this very frame made within `remember_s`, or None (without hashing the
        frame when no refusal still remembered is of its kind)."""
        with self._lock:
            self._expire()
            if kind not in self._kinds:
                return None
        frame = (kind, digest(sample))  # outside the lock: the other threads need not wait for it
        with self._lock:
            refusal = self._by_frame.get(frame)
            if refusal is None:
                return None
            self.recalled += 1
            return refusal

    def reminder(self, refusal: Refusal) -> str:
        """What a refusal recalled from memory adds to its message: how long ago it was made, and
        for how much longer the same frame is refused without being computed."""
        ago = self._clock() - refusal.at
        left = max(1, math.ceil(self._remember_s - ago))
        return (f"(this frame was refused {ago:.0f} s ago and is not computed again for another {left} s: "
                "send a different frame)")

    def _expire(self) -> None:
        """Forget the refusals older than `remember_s` (the oldest come first: `remember` moves each
        to the end), so that their kinds no longer cost a digest."""
        oldest = self._clock() - self._remember_s
        while self._by_frame:
            frame, refusal = next(iter(self._by_frame.items()))
            if refusal.at >= oldest:
                return
            self._forget(frame)

    def _forget(self, frame: tuple[FrameKind, bytes]) -> None:
        del self._by_frame[frame]
        kind = frame[0]
        self._kinds[kind] -= 1
        if not self._kinds[kind]:
            del self._kinds[kind]

    def __len__(self) -> int:
        return len(self._by_frame)
