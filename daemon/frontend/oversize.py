"""Requests whose reply came out over max_reply_bytes: refused at once for a moment, not computed again.

The frontend drops a reply over `max_reply_bytes` and sends a 413 in its place
(server.py), but only once the model has computed it: a client sending the
same request back to back would keep a core busy making replies it never gets.
So the kind of request that made one is remembered: the client's connection
(its envelope), the model and version it asked for, its inputs' names, dtypes
and shapes, and the outputs it named. Another request of that kind within
`oversize_memory_s` (config.py) is answered 413 before it is queued. Outputs can depend on values
(a detector's boxes, a tiler's repeats), so once the time is up one request of
the kind is computed again: a reply that fits forgets the kind, one over it
renews the time. Nothing else is touched: another connection, another model or
other shapes are computed as ever, and at most `MAX_KINDS` kinds are kept.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from infermux.protocol import Request

MAX_KINDS = 256  # kinds remembered at once: the oldest is forgotten first

Kind = tuple[Any, ...]


class ClientEnvelope(list[Any]):
    """A client's envelope (its identity frames, where its reply goes: job.Envelope) that knows the
    request it came with, so that a reply found too large can be remembered by its kind; `probe` is
    the kind when this request was let through to see whether its kind still makes replies over the
    limit."""

    __slots__ = ("request", "model", "version", "probe", "user")

    request: Request | None
    model: str
    version: str | None
    probe: Kind | None
    user: str | None  # the CURVE client's key it came with, where the frontend reads it (stream_keys = "bound")

    def came_with(self, request: Request) -> None:
        """Set the request (and the model and version it asks for, before any fallback changes them)."""
        self.request, self.model, self.version, self.probe = request, request.model, request.version, None

    def kind(self) -> Kind | None:
        """What a request of the same kind shares with this one; None before `came_with`."""
        request = self.request
        if request is None:
            return None
        return kind_of(self, self.model, self.version, request)


def kind_of(envelope: list[Any], model: str, version: str | None, request: Request) -> Kind:
    """The key requests are remembered by: connection, model, version, inputs' shapes, outputs named."""
    inputs = tuple((name, a.dtype.str, a.shape) for name, a in request.inputs.items())
    return (tuple(bytes(f) for f in envelope), model, version, inputs,
            None if request.outputs is None else tuple(request.outputs))


@dataclass(slots=True)
class _Over:
    size: int  # the bytes the last computed reply of the kind came to
    until: float  # refused at once until then
    probing: float = float("-inf")  # when one request of the kind was last let through to be computed


class OversizeMemory:
    """The kinds of request whose last reply was over max_reply_bytes, and how many were refused for it.

    Used on the frontend thread only (admission and sending happen there)."""

    def __init__(self, memory_s: float, max_kinds: int = MAX_KINDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.memory_s, self.max_kinds = memory_s, max_kinds
        self.refused = 0  # requests answered 413 without being computed
        self._clock = clock
        self._kinds: OrderedDict[Kind, _Over] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kinds)

    def refusal(self, kind: Kind) -> int | None:
        """The size of the last reply of `kind` if a request of it is refused now; None: compute it
        (after the time is up, the one request let through is the kind's probe: `probing`)."""
        now = self._clock()
        self._forget_stale(now)
        over = self._kinds.get(kind)
        if over is None:
            return None
        if now < over.until or now < over.probing + self.memory_s:  # one probe at a time
            self.refused += 1
            return over.size
        over.probing = now
        return None

    def probing(self, kind: Kind) -> bool:
        """Whether `kind` is remembered: a request of it that `refusal` let through is its probe."""
        return kind in self._kinds

    def over(self, kind: Kind, size: int) -> None:
        """A computed reply of `kind` was `size` bytes, over the limit: refuse the kind for a while."""
        if self.memory_s <= 0:  # turned off
            return
        self._kinds[kind] = _Over(size, self._clock() + self.memory_s)
        self._kinds.move_to_end(kind)
        while len(self._kinds) > self.max_kinds:
            self._kinds.popitem(last=False)

    def fits(self, kind: Kind) -> None:
        """A probe's reply fitted: requests of `kind` are computed again."""
        self._kinds.pop(kind, None)

    def _forget_stale(self, now: float) -> None:
        """Forget kinds not seen over for a while, oldest first, so that the memory empties (and
        admission stops looking) once no client keeps making replies too large."""
        kinds = self._kinds
        while kinds:
            over = next(iter(kinds.values()))
            if now < over.until + self.memory_s or now < over.probing + self.memory_s:
                return
            kinds.popitem(last=False)
