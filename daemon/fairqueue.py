"""A bounded, blocking queue that serves keys round-robin.

Within one context's queue, requests are taken in turn across their `key`
(a camera id, say; requests without a key share one lane), so one flooding
source cannot starve the others: each key waits behind at most one request
of every other key, not behind the flood.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


class Closed(Exception):
    """The queue was closed and is empty."""


class FairQueue(Generic[T]):
    """Per-key lanes, served round-robin; `len()` is the total depth."""

    def __init__(self, key: Callable[[T], Hashable]) -> None:
        self._key = key
        self._lanes: dict[Hashable, deque[T]] = {}
        self._turn: deque[Hashable] = deque()  # keys with waiting items, next first
        self._size = 0
        self._closed = False
        self._ready = threading.Condition(threading.Lock())

    def __len__(self) -> int:
        return self._size

    def put(self, item: T) -> None:
        """Queue `item` in its key's lane; raises Closed once the queue is closed."""
        key = self._key(item)
        with self._ready:
            if self._closed:
                raise Closed
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = deque()
            if not lane:
                self._turn.append(key)
            lane.append(item)
            self._size += 1
            self._ready.notify()

    def _pop(self) -> T:
        key = self._turn.popleft()
        lane = self._lanes[key]
        item = lane.popleft()
        if lane:
            self._turn.append(key)
        else:
            del self._lanes[key]
        self._size -= 1
        return item

    def get(self, timeout: float | None = None) -> T | None:
        """The next item in turn; None on timeout; raises Closed once closed and empty."""
        with self._ready:
            if not self._size:
                if self._closed:
                    raise Closed
                deadline = None if timeout is None else time.monotonic() + timeout
                while not self._size and not self._closed:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return None
                    self._ready.wait(left)
                if not self._size:
                    raise Closed
            return self._pop()

    def take(self, limit: int, wait_s: float, fits: Callable[[T], bool] | None = None) -> list[T]:
        """Up to `limit` items: block for the first, then wait at most `wait_s` for company.

        `fits` decides whether the next item in turn may join (e.g. same
        shapes); the first one that does not ends the batch and stays queued.
        """
        first = self.get()
        items = [first]
        deadline = time.monotonic() + wait_s
        with self._ready:
            while len(items) < limit:
                if self._size:
                    nxt = self._lanes[self._turn[0]][0]
                    if fits is not None and not fits(nxt):
                        break
                    items.append(self._pop())
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    break
                self._ready.wait(left)
        return items

    def drain(self) -> list[T]:
        """Remove and return everything queued (used when a context goes away)."""
        with self._ready:
            items = []
            while self._size:
                items.append(self._pop())
            return items

    def close(self) -> None:
        """Wake every waiter; `get` raises Closed once the queue is empty."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
