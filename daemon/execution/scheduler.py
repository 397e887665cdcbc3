"""The hot placement (placement.py): one version's contexts on executor threads in the daemon.

`submit` puts a request on one context's queue (least loaded, or the one
its key hashes to) unless the version's total queue is at `max_queue`.
Contexts can be added or removed live; a removed one finishes its queue.
A worker process runs the same class for its cold version (workers/child.py),
so a cold version's streams are superseded in its worker's queue. The hot
placer builds it (models/hot.py).

Under `queue_policy = "newest_per_key"` a request's key is a stream: its
requests wait on one context (the one already holding them), at most
`per_key_depth` of them; a newer one replaces the oldest, which is answered
409 at once with `superseded_by`. What a context computes is never cut off.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from infermux.execution import batcher
from infermux.config import HOT, ModelConfig
from infermux.execution.fairqueue import Closed, Lane, longest_lane
from infermux.execution.batchcap import CappedPolicy
from infermux.execution.executor import Executor, Queued
from infermux.execution.hashring import HashRing
from infermux.execution.hooks import FrontendHooks
from infermux.execution.job import Job, Outcome, internal_sink
from infermux.execution.placement import Admission, Change, ContextLoad, Placement, Settings, wait_us
from infermux.plugins.base import Engine
from infermux.execution.stats import ModelStats
from infermux.protocol import OPERATOR_RETRY_MS, Status, encode_reply, error_header

NEWEST_PER_KEY = "newest_per_key"  # config.QUEUE_POLICIES


class Scheduler:
    """Bounded queues and executors for one loaded model version: a `Placement`, hot."""

    kind = HOT

    def __init__(self, config: ModelConfig, engine: Engine, stats: ModelStats, hooks: FrontendHooks,
                 strategy: str, warm_row_us: float = 0.0, backend: str = "") -> None:
        self.name, self.version = config.name, config.version
        self.engine, self.backend = engine, backend
        self.created = time.monotonic()
        self.max_queue = config.max_queue
        self.queue_policy, self.per_key_depth = config.queue_policy, config.per_key_depth
        self.strategy = strategy
        self.policy = CappedPolicy(config.max_batch, config.batch_delay_us, config.preferred_batch,
                                   batcher.batchable(engine.inputs, engine.outputs),
                                   batcher.row_limit(engine.inputs), f"{config.name}:{config.version}")
        self._reply, self._on_late, self._stats = hooks.reply, hooks.on_late, stats
        # A version given a lower priority computes on its own threads only, never on the frontend's.
        self.nice = config.nice
        self._inline = hooks.inline if not config.nice else None
        self._hold = hooks.hold if not config.nice else None
        self.warm_row_us = warm_row_us
        self._lock = threading.Lock()
        self.executors: list[Executor] = []
        self._ring: HashRing[int] | None = None
        self._next = 0
        self._successor: Placement | None = None  # once stopped, who takes what is still submitted to it
        self.resize(config.contexts)

    def _new_executor(self, index: int) -> Executor:
        ex = Executor(self.name, self.version, index, self.engine.create_context(), self._reply,
                      self._on_late, self.policy, self.nice)
        ex.stats = self._stats.add_context(in_flight=lambda: ex.in_flight, queue_depth=lambda: len(ex.queue))
        ex.row_us = ex.row_wall_us = self.warm_row_us
        ex.start()
        return ex

    def resize(self, contexts: int) -> None:
        """Add contexts (created now) or remove the newest ones (they drain first)."""
        if contexts < 1:
            raise ValueError("a loaded model needs at least one context")
        with self._lock:
            executors = list(self.executors)
            while len(executors) < contexts:
                executors.append(self._new_executor(len(executors)))
            removed = executors[contexts:]
            executors = executors[:contexts]
            self.executors = executors  # one assignment: dispatch never sees a half-built list
            self._ring = HashRing(list(range(contexts)))
        for ex in removed:
            ex.stop()
            self._stats.remove_context(ex.stats)

    def depth(self) -> int:
        n = 0  # a loop, not sum() over a generator: the express lane asks for every request
        for ex in self.executors:
            n += len(ex.queue)
        return n

    def load(self) -> int:
        return sum(ex.load for ex in self.executors)

    def rows(self) -> int:
        """Input rows queued or running: what the expected wait is measured in."""
        return sum(ex.queue.rows + ex.in_flight_rows for ex in self.executors)

    def expected_wait_us(self) -> float:
        return wait_us(self.rows(), self._stats.service_time_us())

    def contexts(self) -> list[ContextLoad]:
        return [ContextLoad(len(ex.queue), ex.in_flight) for ex in self.executors]

    def settings(self) -> Settings:
        policy = self.policy
        return Settings(len(self.executors), self.max_queue, policy.max_batch, round(policy.delay_s * 1e6),
                        policy.preferred, policy.allowed, self.queue_policy, self.per_key_depth)

    def apply(self, change: Change) -> None:
        """Change settings live; the executors read the policy at their next batch."""
        if change.contexts is not None:
            self.resize(change.contexts)
        if change.max_queue is not None:
            self.max_queue = change.max_queue
        if change.queue_policy is not None:
            self.queue_policy = change.queue_policy
        if change.per_key_depth is not None:
            self.per_key_depth = change.per_key_depth
        policy = self.policy
        if change.max_batch is not None and policy.allowed:
            policy.max_batch = change.max_batch
        if change.batch_delay_us is not None:
            policy.delay_s = change.batch_delay_us / 1e6
        if change.preferred_batch is not None:
            policy.preferred = change.preferred_batch

    def hand_over(self, successor: Placement, reason: str) -> None:
        self._successor = successor

    def worker_info(self) -> dict[str, object] | None:
        return None  # it runs in the daemon

    def footprint(self) -> int:
        """The engine's own figure, its live contexts included: weights once, activations per
        context (docs/architecture.md#memory-footprints). Never the daemon's RSS growth at load,
        which counts libraries loaded once for all, memory the allocator reuses and loads running
        at the same time."""
        return self.engine.memory_bytes()

    def _pick(self, executors: list[Executor], job: Job) -> Executor:
        if self.strategy == "hash" and job.request.key is not None and self._ring is not None:
            index = self._ring.lookup(str(job.request.key))
            if index < len(executors):
                return executors[index]
        # least_queue: the least loaded context; ties rotate so idle contexts share the work.
        self._next = (self._next + 1) % len(executors)
        best = executors[self._next]
        for ex in executors:
            if ex.load < best.load:
                best = ex
        return best

    def submit(self, job: Job) -> Admission:
        """Queue `job` on a context, or say why not (full, or the version is stopping)."""
        executors = self.executors
        if not executors:
            return self._forward(job)
        key = job.request.key
        keep = self.per_key_depth if self.queue_policy == NEWEST_PER_KEY and key is not None else 0
        home = self._home(executors, key) if keep else None
        # A stream's request that replaces one of its own queued ones does not make the queue longer.
        if (home is None or home.queue.count(key) < keep) and self.depth() >= self.max_queue:
            return Admission.FULL
        executor = home or self._pick(executors, job)
        if self._hand_back(executor, job):
            return Admission.QUEUED
        batched = self.policy.max_batch > 1
        if batched and self._hold is not None and self._hold(self):
            return self._put(executor, job, keep, held=True)
        here = self._computes_here((executor,), batcher.rows(job.request.inputs), batched)
        if here is not None and here.compute(job):
            return Admission.QUEUED
        return self._put(executor, job, keep, held=False)

    def _put(self, executor: Executor, job: Job, keep: int, held: bool) -> Admission:
        """Queue `job` on `executor` (`held`: for the reading thread to run with the rest of its burst,
        run_held, the context's thread not woken); a closed queue (the context is being removed, or
        this version stopped meanwhile) sends it to the successor, or CLOSED for a held one."""
        try:
            self._superseded(executor.queue.put(job, wake=not held, keep=keep), job)
        except Closed:
            return Admission.CLOSED if held else self._forward(job)
        return Admission.QUEUED

    def _hand_back(self, executor: Executor, job: Job) -> bool:
        """A pipeline's model step (calls.py) that its own thread may compute: the version does not
        batch (so there is no company to wait for), is not niced (its compute stays on its own
        threads) and `executor` is idle. Handed back to the step's sink, which runs `run_step` on its
        thread once the admission is over; True where it was."""
        if self.policy.max_batch > 1 or self.nice or executor.load:
            return False
        sink = internal_sink(job.reply_to)
        if sink is None:
            return False
        sink.hand_back(lambda: self.run_step(executor, job))
        return True

    def run_step(self, executor: Executor, job: Job) -> bool:
        """Compute a step handed back (`_hand_back`) on the calling thread if `executor` is still idle,
        else queue it there as any request; if the version stopped meanwhile, its successor takes it,
        else 503 (as `Router._refused` says of a closed placement). True where it computed it."""
        if executor.compute(job):
            return True
        try:
            executor.queue.put(job)
            return False
        except Closed:
            pass
        if self._forward(job) is Admission.QUEUED:
            return False
        total_us = (time.perf_counter_ns() - job.received_ns) // 1000
        self._stats.router.record(int(Status.NOT_READY), total_us)
        job.answered(int(Status.NOT_READY))
        self._reply(job.reply_to, encode_reply(error_header(
            Status.NOT_READY, f"model {self.name!r} version {self.version!r} stopped; retry", job.request.id,
            retry_after_ms=OPERATOR_RETRY_MS, model=self.name, version=self.version)))
        return False

    def idle_context(self, rows: int, key: Any = None) -> Executor | None:
        """Placement.idle_context: the context that may compute a request of `rows` rows (and `key`) on
        the calling thread at once, nothing about it needing deciding: the version does not batch,
        its queue has room, no key to hash to a context, no older request of its stream waiting
        (newest_per_key: the newer replaces that one, on the general path), and an idle context
        whose compute the inline gate allows (`_computes_here`). None where none may."""
        if (self.policy.max_batch > 1 or self._inline is None or (self.strategy == "hash" and key is not None)
                or self.depth() >= self.max_queue):
            return None
        if self.queue_policy == NEWEST_PER_KEY and key is not None and self._home(self.executors, key) is not None:
            return None
        return self._computes_here(self.executors, rows, False)

    def _computes_here(self, executors: Sequence[Executor], rows: int, batched: bool) -> Executor | None:
        """The first of `executors` that is idle with its compute time known, where the inline gate
        (inline.py) lets the calling thread compute a request of `rows` rows on it at once (`batched`:
        the version batches); None where it does not, or none is idle. The one place this is asked:
        the fast path's `idle_context`, and `submit` for the context it picked."""
        inline = self._inline
        if inline is None:
            return None
        for executor in executors:
            if executor.load == 0 and executor.row_us:  # the first idle one decides
                return executor if inline(executor.row_us * rows, batched) else None
        return None

    def _forward(self, job: Job) -> Admission:
        """This version takes no more work: its successor's, once a switch replaced it (hand_over)."""
        successor = self._successor
        return successor.submit(job) if successor is not None else Admission.CLOSED

    @staticmethod
    def _home(executors: list[Executor], key: Any) -> Executor | None:
        """The context where `key`'s requests wait, if any: a stream's requests wait together, so
        that the newest can replace the oldest."""
        return next((ex for ex in executors if ex.queue.count(key)), None)

    def _superseded(self, displaced: Sequence[Job], newer: Job) -> None:
        """Answer each request `newer` replaced in its stream's queue: 409, not computed."""
        for job in displaced:
            total_us = (time.perf_counter_ns() - job.received_ns) // 1000
            self._stats.router.record(int(Status.SUPERSEDED), total_us)
            job.answered(int(Status.SUPERSEDED))
            self._reply(job.reply_to, encode_reply(superseded(job, newer, self.name, self.version)),
                        Outcome(int(Status.SUPERSEDED), 1, 0, 0, total_us))

    def run_held(self, gate: Callable[[float, int], bool]) -> None:
        """Compute what was held for the calling thread (while `gate` allows), wake the executors for the rest."""
        queued = Queued(gate)
        for executor in self.executors:
            executor.compute(queued)

    def push_out(self, job: Job) -> Job | None:
        """The queue is full: make room for `job` if its key holds less of it than another key.

        Longest-queue drop: the key with the most queued requests (over all
        contexts) gives up one, which is returned for the caller to refuse:
        its newest under fifo (what it sent last waits behind the rest
        anyway), its oldest under newest_per_key (a stream wants its latest
        frames). Among keys holding equally many, the one whose request of
        that end arrived last (fifo) or first (streams) gives it up, so no
        key is always the one to lose. A flooding key then cannot fill the
        queue and lock the other keys out with 429s: each key keeps at least
        an equal share. Requests without a key share one lane, so unkeyed
        traffic never pushes out unkeyed traffic.
        """
        held: dict[Any, list[tuple[Lane[Job], Executor]]] = {}
        newest = self.queue_policy != NEWEST_PER_KEY
        for ex in self.executors:
            for key, lane in ex.queue.lanes().items():
                held.setdefault(key, []).append((lane, ex))
        found = longest_lane(held, job.request.key, newest, lambda queued: queued.received_ns)
        if found is None:
            return None
        hog, ex = found
        return ex.queue.pop_newest(hog) if newest else ex.queue.pop_oldest(hog)

    def stop(self, timeout: float | None = None, reason: str = "unloaded") -> bool:
        """Let every context finish its queue, then stop; True if all ended in time."""
        executors, self.executors = self.executors, []
        stopped = all([ex.stop(timeout) for ex in executors])
        for ex in executors:
            self._stats.remove_context(ex.stats)
        return stopped




def superseded(job: Job, newer: Job, model: str, version: str | None) -> dict[str, Any]:
    """The 409 header of `job`, replaced in its stream's queue by `newer` (never computed)."""
    header = error_header(Status.SUPERSEDED, f"superseded by a newer request of key {job.request.key!r} "
                          f"(id {newer.request.id!r}) before it was computed (queue_policy newest_per_key); "
                          "not computed", job.request.id, model=model, version=version, fallback=job.fallback)
    header["superseded_by"] = newer.request.id  # null when the newer request has no id
    return header
