"""A model step's call: a typed request handed to the model's own placement, in-process.

The request is an ordinary Job carrying the step's arrays, with no wire
format around them: no JSON header, no frames. `Server.admit_step` admits it
on the pipeline's own thread, as the router admits a client's (version
choice, readiness, fallback, deadline, queue bounds and push-out, stream
policy), so the model's batcher merges it with other clients' requests. A hot
model's idle, unbatched context computes it on the pipeline's thread; a
batched or busy one queues it for its executor; a cold one copies it into
its worker's shared memory (workers/proxy.py). Its reply goes to
`Internal(sink)` (job.ReplyTo): the executor hands the outputs to the sink as arrays
(`StepCall.computed`), a refusal comes as the router's header
(`StepCall.refused`), and what only the wire carries (a cold worker's reply,
an executor's error) as frames (`StepCall.deliver`); each wakes the
pipeline thread waiting here, unless it ran on that thread already.

Where the admission must start a cold model's worker (its registry's
on-demand loading belongs to the frontend thread), the job goes to the
frontend instead, as before (`Server.admit_step`): `StepReply.in_process`
says which way it went, and the pipeline counts both (stats.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import zmq

from infermux.protocol import MalformedReply, Request, Status, decode_reply
from infermux.execution.job import Internal, Job, Outcome

# Server.admit_step: admits the job; True where it did so on the calling thread, False where it
# handed it to the frontend thread.
AdmitFn = Callable[[Job], bool]
GRACE_S = 1.0  # past the deadline the model's own 504 is due; wait this much longer for it


@dataclass
class StepFailed(Exception):
    """A model step did not answer 200: its status, the reason, and when to retry (503)."""

    status: int
    message: str
    retry_after_ms: int | None = None
    in_process: bool = True  # the way its call went (StepReply.in_process)


@dataclass
class StepReply:
    """A model step's answer: its outputs, the fallback that served it (None: the model itself), and
    whether it was admitted in-process (False: through the frontend thread)."""

    outputs: dict[str, np.ndarray]
    fallback: dict[str, str] | None
    in_process: bool
    here: bool = False  # computed on the pipeline's own thread (Scheduler.run_step)


class StepCall:
    """The `ReplySink` of one model step's request: keeps its answer and wakes the waiting thread."""

    def __init__(self) -> None:
        # Held until an answer (or a hand-back) comes; `_signal` lets it go, `wait` takes it again. A
        # bare lock, not an Event (a Condition and its lock, and a waiter's lock per wait): every model
        # step of every frame makes one, and most are answered on the waiting thread itself.
        self._done = threading.Lock()
        self._done.acquire()
        self.outputs: dict[str, np.ndarray] | None = None
        self.fallback: dict[str, str] | None = None
        self.header: dict[str, Any] | None = None  # a refusal's
        self.frames: list[Any] = []
        self._run: Callable[[], bool] | None = None  # handed back to run on this thread (hand_back)
        self.here = False
        self.outcome: Outcome | None = None  # the placement's figures for it (a rollout reads compute_us)

    def computed(self, outputs: dict[str, np.ndarray], fallback: dict[str, str] | None,
                 outcome: Outcome | None) -> None:
        self.outputs, self.fallback, self.outcome = outputs, fallback, outcome
        self._signal()

    def refused(self, header: dict[str, Any]) -> None:
        self.header = header
        self._signal()

    def deliver(self, frames: list[Any], outcome: Outcome | None) -> None:
        # A cold model's big outputs come as zero-copy frames on its slot: copy them out,
        # so the slot is free for the next request once this reply is read.
        self.frames = [f.bytes if isinstance(f, zmq.Frame) else f for f in frames]
        self.outcome = outcome
        self._signal()

    def hand_back(self, run: Callable[[], bool]) -> None:
        self._run = run
        self._signal()

    def _signal(self) -> None:
        try:
            self._done.release()
        except RuntimeError:  # let go already: a second answer (one after the wait gave up) changes nothing
            pass

    def wait(self, timeout_s: float) -> bool:
        """Wait for the answer, running on this thread what the placement handed back; False if
        none came within `timeout_s`."""
        while self._done.acquire(timeout=timeout_s):  # taken again: the next signal lets it go
            run, self._run = self._run, None
            if run is None:
                return True
            self.here = run()  # (a successor's placement may hand it back again: the loop runs that too)
        return False

    def answer(self, model: str, in_process: bool) -> StepReply:
        """What came: the outputs, or StepFailed with the status and reason of what did not."""
        if self.outputs is not None:
            return StepReply(self.outputs, self.fallback, in_process, self.here)
        header = self.header
        if header is None:
            try:
                reply = decode_reply(self.frames)
            except MalformedReply as exc:
                raise StepFailed(Status.BACKEND_ERROR,
                                 f"model {model!r} sent a reply that cannot be read: {exc}") from None
            if reply.status == 200:
                return StepReply(reply.outputs, reply.fallback, in_process)
            header = reply.header
        raise StepFailed(int(header.get("status", Status.BACKEND_ERROR)), str(header.get("error", "failed")),
                         header.get("retry_after_ms"))


def call(admit: AdmitFn, model: str, inputs: dict[str, np.ndarray], deadline_ns: int,
         request_id: Any) -> StepReply:
    """Run `model` on `inputs` before `deadline_ns`; its answer, or StepFailed."""
    inputs = {name: np.ascontiguousarray(a) for name, a in inputs.items()}
    sink = StepCall()
    job = Job(Internal(sink), Request(model=model, inputs=inputs, id=request_id), [],
              time.perf_counter_ns(), deadline_ns)
    in_process = admit(job)  # a refusal (404, 429, 503...) comes back to the sink, like a result
    if not sink.wait(max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9) + GRACE_S):
        raise StepFailed(Status.DEADLINE, f"model {model!r} did not answer before the deadline", None, in_process)
    try:
        return sink.answer(model, in_process)
    except StepFailed as exc:
        exc.in_process = in_process
        raise
