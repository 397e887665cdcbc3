"""A bounded, blocking queue that serves keys round-robin and forms batches.

Within one context's queue, requests are taken in turn across their `key`
(a camera id, say; requests without a key share one lane), so one flooding
source cannot starve the others: each key waits behind at most one request
of every other key, not behind the flood. As in fq_codel (RFC 8290), a
lane that was empty ("new": a camera sending one frame at a time) is
served before the lanes that stay backlogged ("old": the flood), once;
if it still has items after that, it joins the old lanes, which are
served in turn, one item each (deficit round-robin with a quantum of one
request). A camera then waits only for the request running, not also for
the flood's next.

The old lanes take strict turns, not the shortest first: serving the
shortest lane first makes it shorter still, so at a full queue, with every
key backlogged, the keys that happened to be shortest were served every
time and the others starved (six cameras at equal rates saw 111 to 680
frames served each of 680 sent).

`put(item, keep=N)` is a stream's latest-wins (queue_policy
"newest_per_key"): the key's lane holds at most N items, so the oldest
are taken out and handed back to be answered as superseded; the lane keeps
its turn. A stream's lane is never new: it joins the old lanes' turns, so
streams are served in the order they have been waiting. (Each empties
when served; had it come back as new, the cameras whose frames happen to
arrive just after a dequeue would go first every time, and a camera whose
frame is replaced as it waits would wait behind all of them.)

`take` forms a dynamic batch (Triton-style): up to `limit` rows, waiting at
most `wait_s` for company after the first item, never longer than the
earliest `patience` of an item already taken (its deadline), and at once
when the rows reach a preferred size. The waiting consumer is woken only
when enough rows have arrived to matter, not on every `put`: a wake-up per
request costs a GIL hand-off that, on a device with few cores, ate most
of what batching saves.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Mapping, Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Lane(Generic[T]):
    """What one key holds in a queue: how many items, its oldest and its newest."""

    count: int
    oldest: T
    newest: T


NONE: Hashable = object()  # "no key", where None is a key (the lane of requests without one)
W = TypeVar("W")


def longest_lane(held: Mapping[Hashable, Sequence[tuple[Lane[T], W]]], key: Hashable, newest: bool,
                 arrived: Callable[[T], int]) -> tuple[Hashable, W] | None:
    """Longest-queue drop at a full queue: which key gives up a request so that one of `key` fits.

    `held`: per key, its lane in each queue `W` that holds some of it. The key holding the most
    (over all queues) gives one up, and only if `key` would still hold fewer than it; among keys
    holding equally many, the one whose end item (`newest`: its newest, else its oldest) `arrived`
    last (newest) or first (oldest) gives it up, so no key is always the one to lose. Returns
    (that key, the queue to take it from), or None: refuse the newcomer instead.
    """
    totals = {k: sum(lane.count for lane, _ in where) for k, where in held.items()}
    most = max(totals.values(), default=0)
    if totals.get(key, 0) + 1 >= most:
        return None
    candidates = [(lane.newest if newest else lane.oldest, queue, k)
                  for k, where in held.items() if totals[k] == most for lane, queue in where]
    _, queue, hog = (max if newest else min)(candidates, key=lambda c: arrived(c[0]))
    return hog, queue


class Closed(Exception):
    """The queue was closed and is empty."""


class FairQueue(Generic[T]):
    """Per-key lanes, served round-robin; `len()` is the total depth in items.

    `size(item)` is the item's rows (its batch dimension); `rows` is the
    total queued. `patience(item)` is how many seconds the item can still
    wait before it must be computed (its deadline less the expected
    compute); `take` never holds a batch past the smallest patience in it.
    One consumer thread is assumed (an executor owns its queue).
    """

    def __init__(self, key: Callable[[T], Hashable], size: Callable[[T], int] | None = None,
                 patience: Callable[[T], float] | None = None) -> None:
        self._key = key
        self._size_of = size or (lambda item: 1)
        self._patience = patience
        self._lanes: dict[Hashable, deque[T]] = {}
        self._new: deque[Hashable] = deque()  # keys whose lane was empty: served first
        self._turn: deque[Hashable] = deque()  # backlogged ("old") keys, in turn
        self._size = 0
        self.rows = 0
        self._need = 0  # queued rows at which the waiting consumer is worth waking (0: any item, even 0 rows)
        self._waiting = 0  # consumers in wait(): without one, put() skips notify(), a cost every request would pay
        self._cut: float | None = None  # when the batch being formed goes, while `take` waits
        self._closed = False
        self._ready = threading.Condition(threading.Lock())

    def __len__(self) -> int:
        return self._size

    def put(self, item: T, wake: bool = True, keep: int = 0) -> Sequence[T]:
        """Queue `item` in its key's lane; raises Closed once the queue is closed.

        `keep` > 0: the lane holds at most `keep` items, `item` included; its
        oldest ones make room and are returned, for the caller to answer as
        superseded (a stream's newest frame wins). Nothing else is returned.
        `wake=False` leaves a waiting consumer asleep: the caller promises to
        take the item itself or call `wake()` soon (the frontend's held batches).
        """
        key = self._key(item)
        displaced: list[T] = []
        with self._ready:
            if self._closed:
                raise Closed
            lane = self._lanes.get(key)
            if lane is None:  # an emptied lane stays old until the next dequeue: no jumping ahead as new
                lane = self._lanes[key] = deque()
                # A stream's lane empties every time it is served: were it new on coming back, the
                # cameras whose frames come just after a dequeue would go ahead of the rest every time.
                (self._turn if keep else self._new).append(key)
            while keep and len(lane) >= keep:
                old = lane.popleft()
                self._size -= 1
                self.rows -= self._size_of(old)
                displaced.append(old)
            lane.append(item)
            self._size += 1
            self.rows += self._size_of(item)
            if wake and self._waiting and (self.rows >= self._need or self._sooner(item)):
                self._ready.notify()
        return displaced

    def count(self, key: Hashable) -> int:
        """Items of `key` queued now (no lock: a consumer may take one the moment after)."""
        lane = self._lanes.get(key)
        return len(lane) if lane else 0

    def wake(self) -> None:
        """Let a waiting consumer look at the queue again (after puts with `wake=False`)."""
        with self._ready:
            if self._waiting and self._size:
                self._ready.notify()

    def _wait(self, timeout: float | None) -> None:
        self._waiting += 1
        try:
            self._ready.wait(timeout)
        finally:
            self._waiting -= 1

    def _sooner(self, item: T) -> bool:
        """Whether `item` must be computed before the waiting batch would go."""
        return (self._cut is not None and self._patience is not None
                and time.monotonic() + self._patience(item) < self._cut)

    def _order(self) -> list[Hashable]:
        """Keys in service order: new lanes first, then the old lanes in turn."""
        lanes = self._lanes
        return [*self._new, *(k for k in self._turn if lanes[k])]

    def _next_key(self) -> Hashable:
        if self._new:
            return self._new[0]
        lanes = self._lanes
        return next(k for k in self._turn if lanes[k])  # served lanes go to the back of the turn (_pop)

    def _purge(self) -> None:
        """Forget old lanes that stayed empty since the last dequeue; their next item is new again.

        As in fq_codel, a lane that empties stays old until then: a flood
        whose lane empties for a moment (its next request still on the
        way) does not come back as new and go ahead of a camera.
        """
        lanes = self._lanes
        if any(not lanes[k] for k in self._turn):
            for key in [k for k in self._turn if not lanes[k]]:
                del lanes[key]
            self._turn = deque(k for k in self._turn if k in lanes)

    def _pop(self, key: Hashable = NONE) -> T:
        """The head of `key`'s lane (default: the next in service order); the lane goes to the back of the old."""
        if key is NONE:
            key = self._next_key()
        if self._new and self._new[0] == key:
            self._new.popleft()
        elif key in self._new:
            self._new.remove(key)
        else:
            self._turn.remove(key)
        lane = self._lanes[key]
        item = lane.popleft()
        self._turn.append(key)  # emptied or not, it is old now (an empty one until `_purge`)
        self._size -= 1
        self.rows -= self._size_of(item)
        return item

    def _first_fitting(self, fits: Callable[[T], bool]) -> Hashable:
        """The first key, in service order, whose lane's head `fits` (else NONE); lanes skipped keep their place."""
        key = self._next_key()
        if fits(self._lanes[key][0]):  # the usual case, without sorting the lanes
            return key
        for key in self._order():
            if fits(self._lanes[key][0]):
                return key
        return NONE

    def wait(self) -> None:
        """Block until an item is queued; raises Closed once closed and empty."""
        with self._ready:
            while not self._size:
                if self._closed:
                    raise Closed
                self._wait(None)

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
                    self._wait(left)
                if not self._size:
                    raise Closed
            self._purge()
            return self._pop()

    def take(self, limit: int, wait_s: float, *, preferred: Sequence[int] = (),
             fits: Callable[[T, T], bool] | None = None, block: bool = True) -> list[T]:
        """One batch of at most `limit` rows: block for the first item, then gather company.

        - `fits(first, item)`: may `item` share the first one's inference
          (same shapes and dtypes)? Lanes whose next item does not fit, or
          would pass `limit` rows, are skipped and keep their turn (the
          queued frames of two cameras of different resolutions batch
          each their own); once no queued item fits, the batch goes, at
          once: a queued request that cannot join it ends the wait.
        - the batch never waits past the smallest patience of what it
          holds, and a request arriving with less patience ends the wait.
        - `preferred`: row counts that go at once, without waiting out
          `wait_s`: the largest one as soon as it is reached, any of them
          once nothing more is queued. Without one in reach the batch waits
          and then goes with what it has (it is not cut back to a smaller
          preferred size, unlike Triton, so no request is put back).
        - `block=False`: an empty queue gives an empty batch at once.
        """
        first = self.get(None if block else 0)
        if first is None:
            return []
        items, rows = [first], self._size_of(first)
        cut = time.monotonic() + wait_s
        patience = self._patience
        if patience is not None:
            cut = min(cut, time.monotonic() + patience(first))
        preferred = [p for p in preferred if p <= limit]
        largest = max(preferred, default=0)
        with self._ready:
            while rows < limit and rows != largest:
                if self._size:
                    key = self._joining(first, limit - rows, fits)
                    if key is NONE:
                        break
                    nxt = self._pop(key)
                    items.append(nxt)
                    rows += self._size_of(nxt)
                    if patience is not None:
                        cut = min(cut, time.monotonic() + patience(nxt))
                elif not self._wait_for_company(rows, limit, preferred, cut):
                    break
        return items

    def _joining(self, first: T, room: int, fits: Callable[[T, T], bool] | None) -> Hashable:
        """The key of the first lane whose head may join `first`'s batch within `room` rows (else NONE)."""
        return self._first_fitting(lambda item: self._size_of(item) <= room and (fits is None or fits(first, item)))

    def _wait_for_company(self, rows: int, limit: int, preferred: list[int], cut: float) -> bool:
        """With the lock held and nothing queued: wait for more rows, until `cut` at most. False: the batch
        of `rows` goes now (a preferred size, its time is up, or the queue is closed)."""
        if rows in preferred:
            return False
        left = cut - time.monotonic()
        if left <= 0 or self._closed:
            return False
        target = min((p for p in preferred if p > rows), default=limit)
        self._need, self._cut = target - rows, cut
        try:
            self._wait(left)
        finally:
            self._need, self._cut = 0, None
        return True

    def lanes(self) -> dict[Hashable, Lane[T]]:
        """Per key with queued items: how many, the oldest and the newest, as of now."""
        with self._ready:
            return {key: Lane(len(lane), lane[0], lane[-1]) for key, lane in self._lanes.items() if lane}

    def pop_newest(self, key: Hashable) -> T | None:
        """Remove the most recently queued item of `key` (push-out); None if it has none."""
        return self._pop_end(key, newest=True)

    def pop_oldest(self, key: Hashable) -> T | None:
        """Remove the item of `key` queued longest (a stream's push-out); None if it has none."""
        return self._pop_end(key, newest=False)

    def _pop_end(self, key: Hashable, newest: bool) -> T | None:
        with self._ready:
            lane = self._lanes.get(key)
            if not lane:
                return None
            item = lane.pop() if newest else lane.popleft()
            if not lane:
                del self._lanes[key]
                (self._new if key in self._new else self._turn).remove(key)
            self._size -= 1
            self.rows -= self._size_of(item)
            return item

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
