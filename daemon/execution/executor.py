"""Executor threads: one per execution context, never shared.

An executor takes a batch from its context's queue, answers requests that
are already past their deadline without computing them, runs the rest in
one backend call (which releases the GIL), and hands each reply to the
frontend.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, overload

from infermux.execution import batcher
from infermux.execution.priority import lower_this_thread
from infermux.execution.fairqueue import Closed, FairQueue
from infermux.execution.inline import track_compute
from infermux.execution.job import Job, Outcome, ReplySink, ReplyTo, internal_sink
from infermux.plugins.base import Context, InputRejected, OutputsMismatch
from infermux.protocol import OkReplies, Status, encode_reply, error_header
from infermux.execution.outputs import RegionOutputs, ShapeMemory
from infermux.execution.stats import Stats

log = logging.getLogger("infermux.executor")



class ReplyFn(Protocol):
    """Send a reply's `frames` to where `to` says (job.ReplyTo); `outcome` says how it ended, where known."""

    def __call__(self, to: ReplyTo, frames: list[Any], outcome: Outcome | None = None) -> None: ...


LateFn = Callable[[Job], None]


@dataclass(slots=True)
class Bare:
    """A client's request that the express lane read with no `Job` (frontend/express.py), to compute
    at once: its inputs and rows, the id its reply carries, the outputs it asked for (None: all),
    when it was received (perf_counter_ns), and `job_of`, which makes the Job the general path
    would have made, for a reply only that path sends (a failure, a rare encoding)."""

    inputs: dict[str, Any]
    rows: int
    id: Any
    asked: tuple[str, ...] | None
    received_ns: int
    job_of: Callable[[], Job]


@dataclass(frozen=True, slots=True)
class Queued:
    """What waits in a context's queue, to compute on the calling thread while `gate(expected_us,
    requests)` allows the next batch: the frontend asks it at the end of each burst of reads for
    the batched versions it held (inline.py), whose burst is the batch's company, so the batch
    runs without a thread hand-off (Scheduler.run_held)."""

    gate: Callable[[float, int], bool]


class BatchPolicy:
    """How an executor forms batches; changed live by the admin socket.

    `max_batch` counts rows (dim 0 summed over the merged requests), as
    Triton's `max_batch_size` does: it is what the engine's batch dimension
    must hold. A request with more rows than that runs alone.
    `preferred` row counts go at once instead of waiting out `delay_s`.
    """

    def __init__(self, max_batch: int, delay_us: int, preferred: tuple[int, ...], allowed: bool) -> None:
        self.max_batch = max_batch if allowed else 1
        self.delay_s = delay_us / 1e6
        self.preferred = preferred
        self.allowed = allowed


class Executor:
    """Runs one context on its own thread, fed by its own fair queue."""

    def __init__(self, name: str, version: str, index: int, context: Context, reply: ReplyFn,
                 on_late: LateFn, policy: BatchPolicy, nice: int = 0) -> None:
        self.name, self.version, self.index = name, version, index
        self.nice = nice  # added to this context's thread's nice value (priority.py)
        self.queue: FairQueue[Job] = FairQueue(key=lambda job: job.request.key,
                                               size=lambda job: batcher.rows(job.request.inputs),
                                               patience=self._patience)
        self.in_flight = 0  # requests in the running backend call
        self.in_flight_rows = 0
        self.served = 0
        # Compute time per input row (inline.track_compute), two ways: `row_us`, what a request costs
        # the thread that computes it inline (the inline gates read it), and `row_wall_us`, what a call
        # takes wherever it runs, waits for the GIL included (what a deadline must allow for).
        self.row_us = self.row_wall_us = 0.0
        self._context = context
        self._reply = reply
        self._on_late = on_late
        self.stats = Stats()  # replaced by the scheduler with this context's share of the model's stats
        self._policy = policy
        self._busy = threading.Lock()  # held while the context computes, by whichever thread
        self._ended = False  # the context is closed (or about to be), under `_busy`: `compute` computes nothing
        self._shapes = ShapeMemory()  # output shapes by kind of request, for RegionOutputs
        self._ok = OkReplies(name, version)
        self._samples: list[float] = []  # Bare requests' compute µs a row, for settle
        self._thread = threading.Thread(target=self._run, name=f"exec-{name}-{version}-{index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def load(self) -> int:
        """Queued plus running requests: what least_queue compares."""
        return len(self.queue) + self.in_flight

    def stop(self, timeout: float | None = None) -> bool:
        """Finish what is queued, then stop; True once the thread has ended."""
        self.queue.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        lower_this_thread(self.nice, f"model {self.name} version {self.version}")
        try:
            while True:
                try:
                    jobs = self._take()
                except Closed:
                    break
                with self._busy:
                    self._guarded(jobs)
                # Waiting for the next batch must not keep this one's inputs alive: they can be
                # a client's shared-memory region that its client has let go (regions.py).
                del jobs
        finally:
            with self._busy:  # not under a pipeline thread's compute (`compute`, Scheduler.run_step)
                self._ended = True
            try:
                self._context.close()
            except Exception:  # a failing close must not hide the real exit reason
                log.exception("closing context failed model=%s version=%s", self.name, self.version)

    def _guarded(self, jobs: list[Job]) -> None:
        """Run a batch; a bug anywhere in it answers those requests 500 instead of killing the context."""
        try:
            self._run_batch(jobs)
        except Exception as exc:
            log.exception("executor error model=%s version=%s context=%d", self.name, self.version, self.index)
            self.in_flight = self.in_flight_rows = 0
            self._fail(jobs, Status.BACKEND_ERROR, f"internal error: {exc}")

    @overload
    def compute(self, work: Job) -> bool: ...

    @overload
    def compute(self, work: Bare) -> list[Any] | bool | None: ...

    @overload
    def compute(self, work: Queued) -> None: ...

    def compute(self, work: Job | Bare | Queued) -> list[Any] | bool | None:
        """The one way another thread computes on this context (its own thread takes `queue`):

        - a `Job`: computed on the calling thread at once if this context is idle with nothing
          queued (answered 504 or by the fallback, uncomputed, if it is past its deadline); True
          once it is answered, False, having done nothing, if the context is busy or closed;
        - a `Bare` request (the express lane's, no Job): the same, its reply's frames returned for
          the caller to send; True where it was answered through the general reply; None, having
          done nothing, if the context is busy (Bare says more);
        - `Queued`: what waits in the queue, in batches on the calling thread while its gate
          allows, then this context's thread woken for the rest.

        The placement decides which context may compute on a calling thread (Placement.idle_context)."""
        kind = type(work)
        if kind is Bare:
            return self._bare(work)  # type: ignore[arg-type]
        if kind is Queued:
            self._queued(work.gate)  # type: ignore[union-attr]
            return None
        return self._alone(work)  # type: ignore[arg-type]

    def _alone(self, job: Job) -> bool:
        """`compute` of a Job: one request, alone, in fewer steps than a batch's (`_guarded`) with the same
        deadline check, statistics, estimates and reply."""
        if self.in_flight or len(self.queue) or not self._busy.acquire(blocking=False):
            return False
        try:
            if self._ended:
                return False
            if job.late():
                self._on_late(job)
                return True
            rows = batcher.rows(job.request.inputs)
            self.in_flight, self.in_flight_rows = 1, rows
            start = time.perf_counter_ns()
            try:
                outputs = self._infer_one(job)
            except Exception as exc:
                self.in_flight = self.in_flight_rows = 0
                self._failed([job], exc)
                return True
            end = time.perf_counter_ns()
            self.in_flight = self.in_flight_rows = 0
            self._learn(rows, start, end)
            self._succeed(job, outputs, start, end, 0, rows)
            self.served += 1
        except Exception as exc:  # as _guarded: a bug answers 500, the context lives on
            log.exception("executor error model=%s version=%s context=%d", self.name, self.version, self.index)
            self.in_flight = self.in_flight_rows = 0
            self._fail([job], Status.BACKEND_ERROR, f"internal error: {exc}")
        finally:
            self._busy.release()
        return True

    def _bare(self, work: Bare) -> list[Any] | bool | None:
        """`compute` of a Bare request (frontend/express.py): `_alone` for a client's request that no `Job`
        was made for. The same statistics and estimates, without the Job, the Outcome (only a
        pipeline's sink reads one) and the reply's trip through the frontend's `reply`; they are
        kept (`Stats.record_soon`, `_samples`) and folded by `settle`, which the lane calls once a
        burst. `_alone`'s steps are written out again here, since a helper shared by both would
        cost the lane a call and a closure per request."""
        if self.in_flight or len(self.queue) or not self._busy.acquire(blocking=False):
            return None
        try:
            rows, asked = work.rows, work.asked
            self.in_flight, self.in_flight_rows = 1, rows
            start = time.perf_counter_ns()
            try:
                outputs = self._context.infer(work.inputs)
            except Exception as exc:
                self.in_flight = self.in_flight_rows = 0
                self._failed([work.job_of()], exc)
                return True
            end = time.perf_counter_ns()
            self.in_flight = self.in_flight_rows = 0
            self.served += 1
            if asked is not None:
                outputs = {name: outputs[name] for name in asked}
            received = work.received_ns
            queue_us, compute_us = (start - received) // 1000, (end - start) // 1000
            total_us = (time.perf_counter_ns() - received) // 1000
            frames = self._ok.encode(work.id, queue_us, compute_us, total_us, outputs)
            if frames is None:
                self._learn(rows, start, end)
                self._succeed(work.job_of(), outputs, start, end, 0, rows)
                return True
            self._samples.append((end - start) / 1000 / max(1, rows))
            self.stats.record_soon(total_us, queue_us, compute_us, rows)
            return frames
        except Exception as exc:  # as _alone: a bug answers 500, the context lives on
            log.exception("executor error model=%s version=%s context=%d", self.name, self.version, self.index)
            self._fail([work.job_of()], Status.BACKEND_ERROR, f"internal error: {exc}")
            return True
        finally:
            self._busy.release()

    def settle(self) -> None:
        """Fold what `compute` kept of Bare requests into the estimates and statistics (the calling thread is the
        lane's, whose samples may raise an estimate as an inline call's do: `_learn`)."""
        samples = self._samples
        for sample in samples:
            self._estimate(sample, may_rise=True)
        samples.clear()
        self.stats.settle()

    def _queued(self, gate: Callable[[float, int], bool]) -> None:
        """`compute` of Queued: queued batches on the calling thread while `gate` allows it, then this
        context's thread woken for the rest."""
        policy = self._policy
        try:
            while len(self.queue) and self.row_us and self._batch_allowed(gate):
                if not self._busy.acquire(blocking=False):
                    break
                try:
                    jobs = self.queue.take(policy.max_batch, 0.0, preferred=policy.preferred, fits=_mergeable,
                                           block=False)
                    if jobs:
                        self._guarded(jobs)
                finally:
                    self._busy.release()
        except Closed:
            pass
        finally:
            self.queue.wake()

    def _batch_allowed(self, gate: Callable[[float, int], bool]) -> bool:
        """Ask `gate` about the next batch: its expected compute and (at most) how many requests it holds."""
        rows = min(self.queue.rows, self._policy.max_batch)
        return gate(self.row_us * rows, min(len(self.queue), max(1, rows)))

    def _take(self) -> list[Job]:
        """The next request, plus whatever mergeable ones arrive within the batch delay."""
        self.queue.wait()  # then read the policy: a change made while this thread waited counts now
        policy = self._policy
        if policy.max_batch <= 1:
            job = self.queue.get()  # blocks until there is one (or raises Closed)
            return [job] if job is not None else []
        return self.queue.take(policy.max_batch, policy.delay_s, preferred=policy.preferred,
                               fits=_mergeable)

    def _patience(self, job: Job) -> float:
        """Seconds `job` may wait for company: half of what its deadline leaves after a full batch's compute.

        Half, not all: a thread woken at the last moment is often late by
        milliseconds on a busy box, and the request would then miss its
        deadline for a batch that gained it nothing.
        """
        return (job.remaining_us() - self.row_wall_us * self._policy.max_batch) / 2e6

    def _run_batch(self, jobs: list[Job]) -> None:
        now = time.perf_counter_ns()
        live = []
        for job in jobs:
            if job.late(now):
                self._on_late(job)
            else:
                live.append(job)
        if live:
            self._compute(live)

    def _compute(self, jobs: list[Job]) -> None:
        """One backend call for `jobs` (merged along axis 0 when there are several)."""
        sizes = [batcher.rows(j.request.inputs) for j in jobs]
        self.in_flight, self.in_flight_rows = len(jobs), sum(sizes)
        start = time.perf_counter_ns()
        try:
            if len(jobs) == 1:
                results = [self._infer_one(jobs[0])]
            else:
                merged = self._context.infer(batcher.merge([j.request.inputs for j in jobs]))
                results = batcher.split(merged, sizes)
        except Exception as exc:
            self._failed(jobs, exc)
            return
        finally:
            self.in_flight = self.in_flight_rows = 0
        end = time.perf_counter_ns()
        rows = sum(sizes)
        self._learn(rows, start, end)
        shared = rows if len(jobs) > 1 else 0
        for job, outputs in zip(jobs, results):
            self._succeed(job, outputs, start, end, shared, rows)
        self.served += len(jobs)

    def _failed(self, jobs: list[Job], exc: Exception) -> None:
        """The backend call for `jobs` raised `exc`: 400 for input it rejected, else 500."""
        if isinstance(exc, InputRejected):
            self._fail(jobs, Status.BAD_REQUEST, str(exc))
            return
        log.warning("inference failed model=%s version=%s context=%d", self.name, self.version, self.index,
                    exc_info=exc)  # the first of a kind names its exception, then counts (events.py)
        self._fail(jobs, Status.BACKEND_ERROR, f"backend error: {str(exc)[:500]}")

    def _learn(self, rows: int, start: int, end: int) -> None:
        """Count a backend call of `rows` rows from `start` to `end` (ns) and update the estimates."""
        # Batch sizes are rows, as max_batch is: the histogram shows what the engine ran.
        self.stats.record_batch(rows, (end - start) // 1000)
        self._estimate((end - start) / 1000 / max(1, rows), threading.current_thread() is not self._thread)

    def _estimate(self, sample_us: float, may_rise: bool) -> None:
        """Move both compute estimates towards a call's µs a row (`may_rise`: track_compute's)."""
        self.row_wall_us = track_compute(self.row_wall_us, sample_us)
        self.row_us = track_compute(self.row_us, sample_us, may_rise=may_rise)

    def _infer_one(self, job: Job) -> dict[str, Any]:
        """One request alone: into the arrays it offers (Job.outputs_into) where the backend can (base.WritesOutputs):
        a worker's slot (workers/slotoutputs.py), or the client's own regions (execution/outputs.py)."""
        if job.outputs_into is None:
            if not job.request.output_regions:  # the common request: nowhere to write into
                return self._context.infer(job.request.inputs)
            job.outputs_into = RegionOutputs(job.request, self._shapes)  # _succeed teaches it the shapes
        into = getattr(self._context, "infer_into", None)
        offered = job.outputs_into
        arrays = offered.arrays() if offered is not None and into is not None else None
        if arrays and into is not None and offered is not None:
            try:
                outputs: dict[str, Any] = into(job.request.inputs, arrays)
                return outputs
            except OutputsMismatch:
                offered.mismatch()
        return self._context.infer(job.request.inputs)

    def _succeed(self, job: Job, outputs: dict, start: int, end: int, batch: int, rows: int) -> None:
        """Reply 200; `batch` is the rows of a call shared with other requests (0: ran alone), `rows`
        those of the call whatever it was (the worker's Outcome, from which the daemon learns the
        time per row)."""
        req = job.request
        if req.outputs is not None:
            outputs = {name: outputs[name] for name in req.outputs}
        sink = internal_sink(job.reply_to)
        if sink is not None:  # a pipeline's step: its arrays as they are, no reply to encode (calls.py)
            self._computed(job, sink, outputs, start, end, batch, rows)
            return
        if isinstance(job.outputs_into, RegionOutputs):  # ran alone: the next of its kind goes straight there
            job.outputs_into.learn(outputs)
        queue_us, compute_us = (start - job.received_ns) // 1000, (end - start) // 1000
        total_us = (time.perf_counter_ns() - job.received_ns) // 1000
        plain = not batch and not job.fallback and not req.output_regions
        frames = self._ok.encode(req.id, queue_us, compute_us, total_us, outputs) if plain else None
        if frames is None:
            header: dict[str, Any] = {
                "id": req.id, "status": 200, "model": self.name, "version": self.version,
                "timing_us": {"queue": queue_us, "compute": compute_us, "total": total_us},
            }
            if batch:
                header["batch"] = batch
            if job.fallback:
                header["fallback"] = job.fallback
            frames = encode_reply(header, outputs, req.output_regions)  # raises on outputs it cannot send: a 500
        outcome = Outcome(200, rows, queue_us, compute_us, total_us)
        # Counted before it leaves: a client that has its reply finds it in the statistics.
        self.stats.record(200, total_us, queue_us, compute_us, batch)
        job.answered(200)
        self._reply(job.reply_to, frames, outcome)

    def _computed(self, job: Job, sink: ReplySink, outputs: dict, start: int, end: int, batch: int,
                  rows: int) -> None:
        """`_succeed` for an internal request: counted as a client's, handed over as arrays."""
        queue_us, compute_us = (start - job.received_ns) // 1000, (end - start) // 1000
        total_us = (time.perf_counter_ns() - job.received_ns) // 1000
        self.stats.record(200, total_us, queue_us, compute_us, batch)
        job.answered(200)
        sink.computed(outputs, job.fallback, Outcome(200, rows, queue_us, compute_us, total_us))

    def _fail(self, jobs: list[Job], status: Status, message: str) -> None:
        for job in jobs:
            header = error_header(status, message, job.request.id, model=self.name, version=self.version)
            total_us = (time.perf_counter_ns() - job.received_ns) // 1000
            frames = encode_reply(header)
            self.stats.record(int(status), total_us)
            job.answered(int(status))
            self._reply(job.reply_to, frames, Outcome(int(status), 1, 0, 0, total_us))


def _mergeable(first: Job, job: Job) -> bool:
    """Whether `job` may share `first`'s inference: same input names, dtypes, non-batch dims."""
    return batcher.signature(job.request.inputs) == batcher.signature(first.request.inputs)
