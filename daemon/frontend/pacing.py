"""Refusals held back, longer for a connection that keeps earning them.

Some refusals answer a request the client can only send again unchanged to be
refused again: a malformed message of a megabyte or more (read whole before it
could be refused), a frame over a pipeline's bound (the detector may have run on
it first), a request whose reply was just over `max_reply_bytes`. Sent at once,
a client that waits for its answer and sends the same again keeps the daemon
reading or computing all the time. So they are sent late: the first to a
connection FIRST_HOLD_S after it was decided, each further one to the same
connection within FORGET_S of the last twice as late as the one before, up to
MAX_HOLD_S. A reply to a request that was computed (a 200, a model's error)
forgives the connection: a camera whose frames are refused now and then gets
each refusal FIRST_HOLD_S late, never a second.

Only the frontend thread holds and sends; other threads (a pipeline's) hand
their refusals in through `hold_later`, taken up at the frontend's next turn.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Iterator

FIRST_HOLD_S = 0.1
MAX_HOLD_S = 1.0
FORGET_S = 10.0  # a connection refused no more for this long starts again from FIRST_HOLD_S
MAX_HELD = 1024  # refusals held at once; past it they are sent at once
MAX_PEERS = 4096  # connections remembered; the least recently refused is forgotten first


class RefusalPacer:
    """Holds refusals (each a list of frames, the connection's identity first) until they are due."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: list[tuple[float, int, list[Any]]] = []  # a heap of (due, order, frames)
        self._order = itertools.count()
        self._earned: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # peer: (last hold, when)
        self._handed_in: deque[list[Any]] = deque()  # from other threads, until the frontend's turn

    def __len__(self) -> int:
        return len(self._held) + len(self._handed_in)

    def hold(self, frames: list[Any]) -> bool:
        """Hold `frames` until their connection's time; False if too many are held (send them now)."""
        if len(self._held) >= MAX_HELD:
            return False
        now = self._clock()
        heapq.heappush(self._held, (now + self._hold_s(bytes(frames[0]), now), next(self._order), frames))
        return True

    def hold_later(self, frames: list[Any]) -> None:
        """`hold` from any thread: taken up by the next `due`."""
        self._handed_in.append(frames)

    def due(self, every: bool = False) -> Iterator[list[Any]]:
        """The held refusals whose time has come, oldest due first (`every`: all of them, at a drain)."""
        while self._handed_in:
            frames = self._handed_in.popleft()
            if not self.hold(frames):
                yield frames
        held, now = self._held, self._clock()
        while held and (every or held[0][0] <= now):
            yield heapq.heappop(held)[2]

    def next_due(self, now: float) -> float | None:
        """Seconds from `now` until the first held refusal is due (0: some wait to be taken up),
        None when none is held."""
        if self._handed_in:
            return 0.0
        return self._held[0][0] - now if self._held else None

    def remembers(self, peer: bytes | None = None) -> bool:
        """Whether `peer` (any connection, where None) was refused lately: else `forgive` has
        nothing to do for it."""
        return bool(self._earned) if peer is None else peer in self._earned

    def forgive(self, peer: bytes) -> None:
        """A request of `peer` was computed: its next refusal is held FIRST_HOLD_S again."""
        if self._earned:  # empty unless some connection was refused lately: one test per reply
            self._earned.pop(peer, None)

    def _hold_s(self, peer: bytes, now: float) -> float:
        last = self._earned.pop(peer, None)
        hold_s = FIRST_HOLD_S if last is None or now - last[1] > FORGET_S else min(MAX_HOLD_S, 2 * last[0])
        self._earned[peer] = (hold_s, now)
        if len(self._earned) > MAX_PEERS:
            self._earned.popitem(last=False)
        return hold_s
