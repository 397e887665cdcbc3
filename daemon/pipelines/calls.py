"""A model step's call: an internal request to the model's own placement, through the router.

The request is an ordinary Job, admitted by `Router.admit` on the frontend
thread as a client's is (version choice, readiness, fallback, queue bounds;
the router and the registry's on-demand loading are the frontend's alone),
so the model's batcher merges it with other requests; only its envelope differs:
`[Internal(sink)]`, and the one reply function hands the reply to the sink
(execution/job.py), which wakes the pipeline thread waiting here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import zmq

from infermux.protocol import MalformedReply, Reply, Request, Status, decode_reply, encode_header
from infermux.execution.job import Internal, Job, Outcome

AdmitFn = Callable[[Job], None]  # Server.admit_internal: the router admits it on the frontend thread
GRACE_S = 1.0  # past the deadline the model's own 504 is due; wait this much longer for it


@dataclass
class StepFailed(Exception):
    """A model step did not answer 200: its status, the reason, and when to retry (503)."""

    status: int
    message: str
    retry_after_ms: int | None = None


class Waiter:
    """The `ReplySink` of one internal request: keeps the reply and wakes the waiting thread."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.frames: list[Any] = []

    def deliver(self, frames: list[Any], outcome: Outcome | None) -> None:
        # A cold model's big outputs come as zero-copy frames on its slot: copy them out,
        # so the slot is free for the next request once this reply is read.
        self.frames = [f.bytes if isinstance(f, zmq.Frame) else f for f in frames]
        self._done.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def call(admit: AdmitFn, model: str, inputs: dict[str, np.ndarray], deadline_ns: int,
         request_id: Any) -> Reply:
    """Run `model` on `inputs` before `deadline_ns`; its reply, or StepFailed."""
    inputs = {name: np.ascontiguousarray(a) for name, a in inputs.items()}
    waiter = Waiter()
    envelope = [Internal(waiter)]
    header = encode_header({"model": model})  # the cold path reads the tensors after it (workers/proxy.py)
    frames = [*envelope, header, *(a.data.cast("B") for a in inputs.values())]
    job = Job(envelope, Request(model=model, inputs=inputs, id=request_id), frames,
              time.perf_counter_ns(), deadline_ns)
    admit(job)  # a refusal (404, 429, 503...) comes back to the waiter as a reply, like a result
    if not waiter.wait(max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9) + GRACE_S):
        raise StepFailed(Status.DEADLINE, f"model {model!r} did not answer before the deadline")
    try:
        reply = decode_reply(waiter.frames)
    except MalformedReply as exc:
        raise StepFailed(Status.BACKEND_ERROR, f"model {model!r} sent a reply that cannot be read: {exc}") from None
    if reply.status != 200:
        raise StepFailed(reply.status, str(reply.header.get("error", "failed")), reply.header.get("retry_after_ms"))
    return reply
