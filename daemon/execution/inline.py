"""When the thread that reads a request should compute it itself.

Handing a request to an executor thread costs the reading thread about
as much GIL time as it saves: a queue put, a wake-up, and later the reply
coming back through the outbox: that hand-off costs the frontend more time
than the sample classifier's whole compute. So a request whose expected compute is
short runs on the reading thread when its context is idle:

- nothing else waits on the socket: up to `idle_max_us` (default 500 µs),
  since nobody is delayed by it;
- other requests wait: only up to `busy_max_us` (default 250 µs, never
  more than `idle_max_us`), about the hand-off's own cost in wall time;
  longer computes go to the executors, where they
  overlap with reading the next requests;
- a batched model's request is never computed alone while others wait:
  they could join its batch. The frontend queues it without waking the
  executor and, at the end of its burst of reads, computes the queue in
  batches itself (Scheduler.run_held) under the same two limits, the busy
  one per request of the batch: the burst is the batch's company, and
  neither the batch nor its replies cross threads. What it leaves, it
  hands to the executor.

docs/decisions.md has the measurements behind both limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

# Asked by a scheduler with a request's expected compute time and whether its
# model batches: may the calling thread compute it itself?
InlineGate = Callable[[float, bool], bool]



class HeldBatches(Protocol):
    """A hot placement whose queued requests the reading thread may compute (Scheduler.run_held)."""

    def run_held(self, gate: Callable[[float, int], bool]) -> None: ...


# Asked by a batched model's scheduler: will the calling thread run this
# scheduler's queue at the end of its burst of reads (Scheduler.run_held)?
# If so the request is queued without waking the executor thread.
HoldFn = Callable[[HeldBatches], bool]


@dataclass(frozen=True)
class InlinePolicy:
    """The two limits on computing a request on the thread that read it."""

    idle_max_us: int = 500
    busy_max_us: int = 250

    def allows(self, expected_us: float, batching: bool, others_waiting: Callable[[], bool]) -> bool:
        """True if a request expected to take `expected_us` should run on the reading thread.

        `others_waiting()` is asked only when the answer depends on it: asking
        the socket costs a few µs, and under load most requests are short
        enough for either limit.
        """
        if not batching and expected_us <= self.busy_max_us and expected_us <= self.idle_max_us:
            return True
        if not others_waiting():
            return expected_us <= self.idle_max_us
        return False

    def allows_batch(self, batch_us: float, requests: int, others_waiting: bool) -> bool:
        """True if a held batch of `requests` expected to take `batch_us` should run on the reading thread.

        Handing a batch over costs a hand-off per request (each reply comes
        back through the outbox), so with others waiting the test is per
        request, as for unbatched models; and no batch longer than
        `idle_max_us` keeps the socket waiting.
        """
        if batch_us > self.idle_max_us:
            return False
        return not others_waiting or batch_us / max(1, requests) <= self.busy_max_us


def track_compute(estimate_us: float, sample_us: float, may_rise: bool = True) -> float:
    """The next compute-time estimate: halfway to a faster sample, 1/16 of the way to a slower one.

    An executor thread coming back from the backend waits for the GIL while
    the frontend holds it, and that wait lands in its sample; on a loaded box
    the scheduler can also leave it off the CPU for a while. A plain average
    would let such stalls make a small model look several times slower and
    close the inline gate exactly under the load it is for. So a slower
    sample counts for at most 4× the estimate, and only by 1/16: a real
    slowdown still shows within ~50 calls (a new engine gets new executors
    anyway).

    `may_rise=False` (a sample an executor thread took after a hand-off):
    only a faster sample counts. That thread waits for the GIL while the
    reading thread holds it, so its samples grow exactly when the reading
    thread is busy; letting them raise the estimate closed the gate, which
    sent more requests to the executor, whose samples grew more, until most
    of the requests were handed off (docs/decisions.md). A real slowdown
    still shows in the samples of the requests computed inline.
    """
    if not estimate_us:
        return sample_us
    if sample_us < estimate_us:
        return (estimate_us + sample_us) / 2
    if not may_rise:
        return estimate_us
    return estimate_us + (min(sample_us, 4 * estimate_us) - estimate_us) / 16
