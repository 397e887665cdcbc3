"""Frames a pipeline refused for what they are, remembered: sending one again costs a hash.

A frame that a step refuses with 400 or 413 (undecodable, over a bound) would be
refused again if sent again: nothing in it changed. Some of those refusals come
only after the work they bound: the detector runs before its regions can be
counted, and the regions are cropped before the widest can be measured. A client
looping on such a frame would keep a core busy computing refusals. So a pipeline
remembers its latest refusals by the frame's digest and what the request says
about it (format, geometry, stream key, outputs asked for), for `REMEMBER_S`; the same frame
again is answered the same refusal without running a step. A frame that differs
by one byte is computed as any other: this bounds a loop, not an attacker who
varies the frame (docs/security.md).

Only a step's own refusals are remembered, never a model's answer (a model's
400 or 503 depends on its version and its load), and a reload that changes the
pipeline starts with nothing remembered.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from infermux.plugins.processors.base import Sample

REMEMBER_S = 60.0  # long enough to outlast a client's backoff between two sends of the same frame
CAPACITY = 256  # frames remembered per pipeline: a few hundred bytes each


@dataclass(frozen=True)
class FrameKind:
    """What decides a refusal: the frame's bytes (by digest), how the request describes them, its
    stream's key (a `track` step refuses a frame without one) and the outputs it asks for."""

    digest: bytes
    format: str
    geometry: tuple[int | None, int | None, int | None]  # width, height, stride as the request declares
    key: str | int | None
    wanted: tuple[str, ...]

    @classmethod
    def of(cls, sample: Sample, wanted: tuple[str, ...]) -> "FrameKind":
        """The kind of the frame in `sample` (its undecoded bytes: a digest of a few MB takes about a
        millisecond, against the tens to hundreds a refused frame's detector takes)."""
        data = np.ascontiguousarray(sample.data if sample.data is not None else np.empty(0, np.uint8))
        digest = hashlib.blake2b(data.data, digest_size=16).digest()
        return cls(digest, sample.format, (sample.width, sample.height, sample.stride), sample.key, wanted)


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
        self._by_kind: OrderedDict[FrameKind, Refusal] = OrderedDict()
        self._lock = threading.Lock()
        self.recalled = 0  # frames answered from memory, for the views

    def remember(self, kind: FrameKind, status: int, message: str) -> None:
        """Keep the refusal of a frame of `kind` (the oldest goes when full)."""
        with self._lock:
            self._by_kind[kind] = Refusal(status, message, self._clock())
            self._by_kind.move_to_end(kind)
            while len(self._by_kind) > self._capacity:
                self._by_kind.popitem(last=False)

    def recall(self, kind: FrameKind) -> Refusal | None:
        """The refusal of a frame of `kind` made within `remember_s`, or None."""
        with self._lock:
            refusal = self._by_kind.get(kind)
            if refusal is None:
                return None
            if self._clock() - refusal.at > self._remember_s:
                del self._by_kind[kind]
                return None
            self.recalled += 1
            return refusal

    def __len__(self) -> int:
        return len(self._by_kind)
