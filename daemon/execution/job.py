"""A request on its way through the daemon: what the frontend accepted,
where to send the answer, and the clock it runs against."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from infermux.execution.streams import Stream
from infermux.protocol import Request

if TYPE_CHECKING:
    from infermux.models.version import ModelVersion


class OutputArrays(Protocol):
    """Arrays a request's outputs may be computed into (a worker's slot: workers/slotoutputs.py; a client's regions: execution/outputs.py)."""

    def arrays(self) -> dict[str, np.ndarray] | None:
        """Arrays to compute the outputs into, or None where they are not known to fit."""
        ...

    def mismatch(self) -> None:
        """The backend refused the arrays: their shapes were not this run's."""
        ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, in the numbers statistics keep (Stats.record): a worker sends them
    with its reply so that the daemon need not parse the reply header (workers/wire.py)."""

    status: int
    batch: int  # rows of the backend call it ran in (its own rows when it ran alone)
    queue_us: int
    compute_us: int
    total_us: int


class ReplySink(Protocol):
    """Where the answer to a request the daemon sent itself goes (a pipeline's model step,
    pipelines/calls.py), on whichever thread answers (the pipeline's own, an executor, the
    frontend reading a worker's lane)."""

    def computed(self, outputs: dict[str, np.ndarray], fallback: dict[str, str] | None,
                 outcome: Outcome | None) -> None:
        """A hot context computed it: its outputs as arrays, never encoded (Executor._succeed)."""
        ...

    def refused(self, header: dict[str, Any]) -> None:
        """The router refused it: the error header it would have sent, never encoded."""
        ...

    def deliver(self, frames: list[Any], outcome: Outcome | None) -> None:
        """Any other reply, as the wire carries it: `[header, outputs...]` (a cold worker's, an error)."""
        ...

    def hand_back(self, run: Callable[[], bool]) -> None:
        """The placement took it to be computed on the sender's own thread: `run()` there, once the
        admission is over, computes or queues it (Scheduler.run_step: True where it computed it); the
        answer then comes as above."""
        ...


# Where a request's reply goes, which is one of three things:
#
# - `Envelope`: a client's, the ZeroMQ routing frames its request came with (the identities
#   of its connection and of any proxies before it; the frontend's ClientEnvelope), which the
#   frontend's ROUTER socket sends the reply back by;
# - `Internal`: a request the daemon sent itself (a pipeline's step, a rollout's shadow), whose
#   reply goes to its sink;
# - `SlotAddress`: a request a worker process computes (workers/child.py), whose reply goes back
#   to the daemon by the sequence number and slot the daemon sent it with.
#
# Every reply goes through one reply function (executor.ReplyFn), which knows which it serves.
Envelope = list[Any]


@dataclass(frozen=True, slots=True)
class Internal:
    """The reply-to of an internal request: its `sink`, in place of a client's envelope."""

    sink: ReplySink


@dataclass(slots=True)
class SlotAddress:
    """The reply-to of a request in a worker process: the daemon's sequence number for it, its
    shared-memory slot (workers/slots.Slot; None where its tensors came inline), and the views on
    that slot its outputs may be computed into (workers/slotoutputs.SlotOutputs), if any. The
    worker's types are its own: this layer holds them without reading them."""

    seq: int
    slot: Any
    outputs: Any = None


ReplyTo = Envelope | Internal | SlotAddress


# The name an internal request gives its one tensor when the model's input name is not known
# yet (a pipeline's step while the model loads): the router names it after the input of the
# version it chooses (router.py), which may have loaded in between.
ONLY_INPUT = "(the model's only input)"


def internal_sink(to: ReplyTo) -> ReplySink | None:
    """The sink of an internal request's reply-to; None for a client's or a worker's."""
    return to.sink if type(to) is Internal else None


@dataclass(slots=True)
class Job:
    """One accepted request.

    `reply_to` says where its reply goes (Envelope, Internal or SlotAddress). `frames` keeps the received ZeroMQ frames alive: the input arrays are
    views on them. `fallback` is set once the request is degraded to a
    stand-in model, and names the model it asked for and why.
    """

    reply_to: ReplyTo
    request: Request
    frames: list[Any]
    received_ns: int
    deadline_ns: int
    fallback: dict[str, str] | None = None
    hops: int = 0
    target: ModelVersion | None = None  # the version the router chose, for its statistics
    outputs_into: OutputArrays | None = None  # outputs may go straight into a worker's slot or the client's regions
    stream: Stream | None = None  # a client's keyed request: its stream's accounting (execution/streams.py)

    @property
    def key(self) -> Any:
        return self.request.key

    def answered(self, status: int) -> None:
        """Count the reply with `status` on the request's stream; a request is answered once, so only
        the first call counts."""
        stream, self.stream = self.stream, None
        if stream is not None:
            captured = self.request.captured
            stream.answer(status, time.perf_counter_ns() - self.received_ns,
                          None if captured is None else max(0.0, time.time() - captured))

    def late(self, now_ns: int | None = None) -> bool:
        return (now_ns or time.perf_counter_ns()) >= self.deadline_ns

    def remaining_us(self, now_ns: int | None = None) -> float:
        return (self.deadline_ns - (now_ns or time.perf_counter_ns())) / 1000
