"""The cold placement (execution/placement.py): a version whose contexts live in a worker process.

`WorkerProxy` implements `Placement` as `Scheduler` does for a hot version,
and holds a `RemoteEngine` and a `ContextView` per context (remote.py) in
place of the worker's engine and contexts. `submit` copies the request's tensors into a shared-memory
slot (or inline when small) and sends one message by the fast lane
(lane.py). Replies come back by the lane too: the frontend thread polls it
(`Watch`), builds the client's reply frames (big outputs go to the client
straight from the slot, zero-copy) and sends them, with no other thread in
between. A reader thread takes what travels through the ZeroMQ pipe
(heartbeats, and whatever did not fit the lane).

When the worker process ends, the reader sees it at once (pidfd) and
answers every request still in flight with 503 + retry_after_ms, so no
client waits for a timeout. While the worker is silent (stopped, hung: no
heartbeat for SILENT_S), the reader answers each request it holds at the
request's deadline (504 or the fallback, as the hot placement does) instead
of after `worker_hang_s`; what the worker sends for it later is dropped.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import asdict, replace
from typing import Any, Callable

import zmq

from infermux.execution import batcher
from infermux.workers import wire as wire
from infermux.config import COLD, ModelConfig
from infermux.execution.hooks import FrontendHooks
from infermux.execution.job import Job
from infermux.execution.stats import ModelStats
from infermux.execution.placement import Admission, Change, ContextLoad, Placement, Settings, wait_us
from infermux.workers.lane import LaneClosed
from infermux.protocol import Status, encode_reply, error_header
from infermux.transport.regions import RegionTable
from infermux.workers.slots import ALIGN, Slot, SlotPool, layout, segment_name
from infermux.workers.process import WorkerProcess
from infermux.workers.remote import ContextView, RemoteEngine, row_bytes

log = logging.getLogger("infermux.workers")

ZERO_COPY_MIN = 1 << 20  # outputs this big go to the client straight from the slot (docs/architecture.md)
# A worker beats every 0.25 s at most (pool.py): two missed beats and it is not going to answer
# in time, so its requests' deadlines are enforced here. A worker that beats keeps computing
# a late request, as a hot context does (it drops the queued late ones itself: LATE).
SILENT_S = 0.5
DEADLINE_POLL_MS = 50  # how often the reader looks at deadlines while requests are in flight


ExitFn = Callable[["WorkerProxy", str, bool], None]


class WorkerProxy:
    """Forwards one model version's jobs to its worker process and its replies to clients: a
    `Placement`, cold. `hooks.watch` polls its lane on the frontend thread; `on_exit(proxy, how,
    crashed)` hears that its worker ended (the pool, workers/pool.py)."""

    kind = COLD

    def __init__(self, process: WorkerProcess, config: ModelConfig, ready: wire.Ready, hooks: FrontendHooks,
                 stats: ModelStats, strategy: str, on_exit: ExitFn, regions: RegionTable | None = None) -> None:
        assert hooks.watch is not None, "a cold placement needs the frontend to watch its lane"
        self.process = process
        self.name, self.version = config.name, config.version
        self.engine = RemoteEngine(ready.inputs, ready.outputs, ready.memory_bytes)
        self.backend = ready.backend
        self.strategy = strategy
        allowed = ready.allowed
        # The worker caps max_batch at the engine's batch maximum (batchcap.py): show what it runs with.
        self._row_limit = batcher.row_limit(ready.inputs)
        # What the worker runs with; `apply` changes both sides (SET).
        self._settings = Settings(config.contexts, config.max_queue, self._capped(config.max_batch) if allowed else 1,
                                  config.batch_delay_us, config.preferred_batch, allowed, config.queue_policy,
                                  config.per_key_depth)
        self._stats = stats
        self.executors: list[ContextView] = [self._new_view(i) for i in range(config.contexts)]
        self.load_ms = ready.load_ms
        self.stop_reason = ""
        self.forward_to: Placement | None = None  # promote/demote: where jobs go once this one stops taking them
        self.created = self.last_beat = time.monotonic()
        self.gpu_bytes = 0  # this process's GPU memory as NVML reports it (0 where it cannot)
        self.unseen_bytes = 0  # what its load took that neither RSS nor NVML shows (MemoryKeeper.unseen)
        self._reply, self._on_late, self._on_exit = hooks.reply, hooks.on_late, on_exit
        self._outputs = len(ready.outputs)
        self._out_row_bytes = row_bytes(ready.outputs)
        self._pending: dict[int, tuple[Job, Slot | None, int]] = {}
        # Answered at their deadline while the worker was silent: the worker may still write
        # into their slots, so each is kept until its late reply (or LATE) comes, or the end.
        self._expired: dict[int, Slot | None] = {}
        self._warned_silence = 0.0  # the last_beat of the silence already logged
        self._rows = 0  # input rows of the requests in `_pending`
        self._keyed: dict[Any, int] = {}  # requests in `_pending` per key (streams: queue_policy newest_per_key)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closing = False  # no new jobs
        self._stopping = False  # the end of the process is expected
        self._broken = False  # it sent a message that does not decode (said once)
        self.slots = SlotPool(segment_name(os.getpid(), process.wid), config.max_queue + config.contexts,
                              on_drop=self._forget)
        self._lane = process.take_lane()
        hooks.watch(self._lane.fileno(), self._read_lane)
        # Client regions this worker has mapped (regions.py): their inputs are not copied.
        self._regions = regions
        self._mapped: set[str] = set()
        if regions is not None:
            regions.subscribe(id(self), self._unmap)
        self._reader = threading.Thread(target=self._read, name=f"worker-{self.name}-{self.version}", daemon=True)
        self._reader.start()

    # -- the Placement interface ------------------------------------------------------

    def submit(self, job: Job) -> Admission:
        """Send `job` to the worker, or say why not: full, or stopping, or the worker is gone."""
        with self._lock:
            if not self._closing:
                full = len(self._pending) + len(self._expired) >= self._settings.max_queue + len(self.executors)
                if full and not self._replaces(job):
                    return Admission.FULL
                # Under the lock: the reply cannot overtake `_pending`.
                return Admission.QUEUED if self._send_job(job) else Admission.CLOSED
            successor = self.forward_to
        return successor.submit(job) if successor is not None else Admission.CLOSED

    def _replaces(self, job: Job) -> bool:
        """Whether `job` replaces a request of its stream in the worker's queue rather than adding one:
        its key already has per_key_depth requests there. (One being computed is not replaced, so a
        key may go past the bound by what the worker's contexts compute: the queue stays bounded.)"""
        settings, key = self._settings, job.request.key
        return settings.queue_policy == "newest_per_key" and key is not None and \
            self._keyed.get(key, 0) >= settings.per_key_depth

    def idle_context(self, rows: int, key: Any = None) -> None:
        """None: a cold version's contexts compute in its worker, never on the calling thread."""
        return None

    def push_out(self, job: Job) -> Job | None:
        """None: the queue lives in the worker, whose requests are on their way or running there,
        so a full cold queue refuses the newcomer (429 or the fallback) instead of a queued one.
        (A stream's newer request still replaces its older one there: the worker's Scheduler
        runs the version's queue_policy and answers the older 409.)"""
        return None

    def expected_wait_us(self) -> float:
        return wait_us(self._rows, self._stats.service_time_us())

    def rows(self) -> int:
        return self._rows

    def contexts(self) -> list[ContextLoad]:
        return [ContextLoad(len(view.queue), view.in_flight) for view in self.executors]

    def settings(self) -> Settings:
        return self._settings

    def apply(self, change: Change) -> None:
        """Change settings here and in the worker (one SET message, applied there in order)."""
        if change.contexts is not None and change.contexts < 1:
            raise ValueError("a loaded model needs at least one context")
        if not self._settings.batching_allowed:
            change = replace(change, max_batch=None)
        shown = change if change.max_batch is None else replace(change, max_batch=self._capped(change.max_batch))
        self._settings = replace(self._settings, **{k: v for k, v in asdict(shown).items() if v is not None})
        # max_queue is kept here: the worker's own queue never refuses (pool.Workers._send_load).
        self._set(replace(change, max_queue=None))
        if change.contexts is not None:
            self._resize(change.contexts)
        self.slots.max_slots = self._settings.max_queue + len(self.executors)  # more in flight, more slots

    def _capped(self, max_batch: int) -> int:
        return max_batch if self._row_limit is None else min(max_batch, self._row_limit)

    def hand_over(self, successor: Placement, reason: str) -> None:
        self.forward_to, self.stop_reason = successor, reason

    def _send_job(self, job: Job) -> bool:
        tensors, regions = self._sources(job)
        sizes = [len(t) for t in tensors]
        offsets, span = layout(sizes)
        rows = batcher.rows(job.request.inputs)
        slot: Slot | None = None
        req = job.request
        # Already parsed and checked here: the worker only wraps the bytes, in this order.
        message = wire.Infer.of(next(self._seq), job.received_ns, job.deadline_ns, job.fallback, req)
        message.regions = regions
        message.output_regions = [wire.RegionOutput(name, place.region, place.offset)
                                  for name, place in req.output_regions.items()
                                  if self._map(place.region)]  # the others come back in frames
        outputs = 0 if message.output_regions else self._out_row_bytes * rows
        if sum(sizes) > wire.INLINE_MAX_BYTES or (regions and outputs > wire.INLINE_MAX_BYTES):
            slot = self._fill_slot(message, tensors, sizes, offsets, span, outputs)
        frames: list[Any] = [message.encode()]
        if slot is None:
            frames += tensors
        if not self._lane.send(frames) and \
                not self.process.send(frames, copy=slot is not None or sum(sizes) < 1 << 20):
            if slot is not None:
                self.slots.release(slot)
            return False
        self._pending[message.seq] = (job, slot, rows)
        self._rows += rows
        self._count_key(job, 1)
        return True

    def _fill_slot(self, message: wire.Infer, tensors: list[Any], sizes: list[int], offsets: list[int], span: int,
                   outputs: int) -> Slot | None:
        """Copy `tensors` into a free slot with room for `outputs` bytes after them (the worker computes
        into it: workers/slotoutputs.py), and say where in `message`; None where no slot has room (no
        room in /dev/shm, or zmq still sends them): they go inline."""
        slot = self.slots.acquire(span + outputs + ALIGN * self._outputs)
        if slot is None:
            return None
        view = slot.view
        for offset, size, tensor in zip(offsets, sizes, tensors):
            view[offset:offset + size] = tensor
        message.slot, message.offsets, message.outputs_at = slot.name, [[o, n] for o, n in zip(offsets, sizes)], span
        return slot

    def _count_key(self, job: Job, step: int) -> None:
        """Keep `_keyed` (under the lock): a request of a key went to the worker (+1) or was answered (-1)."""
        key = job.request.key
        if key is None:
            return
        n = self._keyed.get(key, 0) + step
        if n > 0:
            self._keyed[key] = n
        else:
            self._keyed.pop(key, None)

    def _sources(self, job: Job) -> tuple[list[Any], list[wire.RegionInput]]:
        """The tensors to copy (frames, in input order) and the inputs the worker reads in a
        client's region itself. A region the worker cannot be given (the lane is full) is
        copied like a frame."""
        req = job.request
        envelope = job.reply_to
        if not isinstance(envelope, list):  # a pipeline's step (Internal): its arrays, no frames (calls.py)
            return [array.data.cast("B") for array in req.inputs.values()], []
        frames = job.frames[len(envelope) + 1:]
        if not req.input_regions:
            return list(frames), []
        tensors: list[Any] = []
        regions: list[wire.RegionInput] = []
        next_frame = iter(frames)
        for index, (name, array) in enumerate(req.inputs.items()):
            ref = req.input_regions.get(name)
            if ref is None:
                tensors.append(next(next_frame))
            elif self._map(ref.region):
                regions.append(wire.RegionInput(index, ref.region, ref.offset, ref.nbytes))
            else:
                tensors.append(array.data.cast("B"))
        return tensors, regions

    def _map(self, token: str) -> bool:
        """Whether the worker has region `token` mapped, handing it the fd first if not."""
        if token in self._mapped:
            return True
        message = [wire.Map(token).encode()]
        if self._regions is None or not self._regions.with_fd(token, lambda fd: self._lane.send_fd(message, fd)):
            return False
        self._mapped.add(token)
        return True

    def _unmap(self, token: str) -> None:
        """The client's region is gone (regions.RegionTable.drop): the worker lets go of it too."""
        with self._lock:
            if token in self._mapped:
                self._mapped.discard(token)
                message = [wire.Unmap(token).encode()]
                if not self._lane.send(message):
                    self.process.send(message)

    def _new_view(self, index: int) -> ContextView:
        view = ContextView(index)
        view.stats = self._stats.add_context(in_flight=lambda: view.in_flight, queue_depth=lambda: len(view.queue))
        return view

    def depth(self) -> int:
        """Requests waiting for a context (in the worker or on the way to it)."""
        return max(0, len(self._pending) - len(self.executors))

    def load(self) -> int:
        return len(self._pending)

    def _resize(self, contexts: int) -> None:
        views, removed = self.executors[:contexts], self.executors[contexts:]
        views += [self._new_view(i) for i in range(len(views), contexts)]
        self.executors = views
        for view in removed:
            self._stats.remove_context(view.stats)

    def stop(self, timeout: float | None = None, reason: str = "unloaded") -> bool:
        """Take no new jobs, wait for those in flight, then stop the worker; True if all were answered."""
        self.stop_reason = self.stop_reason or reason
        with self._lock:
            self._closing = True
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._idle.wait(left)
            drained = not self._pending
            self._stopping = True
        self.process.stop()
        self._reader.join(10)
        return drained

    def kill(self, reason: str) -> None:
        """End a worker that no longer answers; the reader then fails what it held."""
        self.stop_reason = reason
        self.process.kill()

    # -- what the stats and admin views read ---------------------------------------------

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return not self._closing and not self.process.exited()

    def footprint(self) -> int:
        """Memory this worker costs: its resident memory plus its GPU memory where readable."""
        return self.process.rss() + (self.gpu_bytes or self.unseen_bytes)

    def worker_info(self) -> dict[str, Any]:
        state = "exited" if self.process.exited() else "stopping" if self._closing else "ready"
        return {"pid": self.pid, "state": state, "rss_bytes": self.process.rss(), "gpu_bytes": self.gpu_bytes,
                "uptime_s": round(time.monotonic() - self.process.started, 1),
                "heartbeat_age_ms": round((time.monotonic() - self.last_beat) * 1000),
                "in_flight": len(self._pending), "expired": len(self._expired), "slots": len(self.slots),
                "regions": len(self._mapped),
                "load_ms": self.load_ms}

    # -- the reader thread ---------------------------------------------------------------

    def _read(self) -> None:
        up, pidfd = self.process.up, self.process.pidfd
        poller = zmq.Poller()
        poller.register(up, zmq.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, zmq.POLLIN)
        try:
            while True:
                idle_ms = 1000 if pidfd is not None else 50
                events = dict(poller.poll(DEADLINE_POLL_MS if self._pending else idle_ms))
                if up in events:
                    self._drain(up)
                self._expire()
                if (pidfd is not None and pidfd in events) or (pidfd is None and self.process.exited()):
                    self._drain(up)  # what the worker sent before it ended still counts
                    self._read_lane()
                    break
        except Exception:  # a bug here must not leave clients waiting: fail them below
            log.exception("worker reader failed model=%s version=%s", self.name, self.version)
            self.process.kill()
        self._ended()

    def _drain(self, up: zmq.Socket) -> None:
        while True:
            try:
                frames = up.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._dispatch(frames)
            except wire.MalformedMessage as exc:
                self._malformed(exc)

    def _read_lane(self) -> bool:
        """Handle the replies waiting on the lane; False once it is closed (the worker ended)."""
        while True:
            try:
                frames = self._lane.recv()
            except LaneClosed:
                return False
            if frames is None:
                return True
            try:
                self._dispatch(frames)
            except wire.MalformedMessage as exc:
                self._malformed(exc)
                return False
            except Exception:  # on the frontend thread: a bug here ends this worker, not the daemon
                log.exception("worker reply failed model=%s version=%s", self.name, self.version)
                self.process.kill()  # the reader then answers what it held with 503
                return False

    def _dispatch(self, frames: list[Any]) -> None:
        message = wire.decode(frames[0])
        if isinstance(message, wire.Reply):
            if len(frames) < 2:
                raise wire.MalformedMessage("REPLY without its reply header frame")
            self._replied(message, frames[1], frames[2:])
        elif isinstance(message, wire.Beat):
            self._beat(message)
        elif isinstance(message, wire.Late):
            entry = self._take(message.seq)
            if entry is not None:
                self._release(entry[1])
                self._on_late(entry[0])

    def _malformed(self, exc: wire.MalformedMessage) -> None:
        """A message that does not decode: this worker is broken. It is stopped as a crash, so the
        reader answers what it held with 503 and the next request starts another (pool.py)."""
        if self._broken:
            return  # said once: what it sent before it died says nothing new
        self._broken = True
        log.error("worker %d (model=%s version=%s) sent a malformed message (%s): stopping it; the next "
                  "request starts a new one", self.pid, self.name, self.version, exc)
        self.kill(f"sent a malformed message ({exc})")

    def _take(self, seq: int) -> tuple[Job, Slot | None, int] | None:
        """The request `seq` the worker answered; None if it was answered already (at its deadline)."""
        with self._lock:
            entry = self._pending.pop(seq, None)
            if entry is not None:
                self._rows -= entry[2]
                self._count_key(entry[0], -1)
            elif seq in self._expired:
                self._release(self._expired.pop(seq))  # the worker is done with its slot now
            if not self._pending:
                self._idle.notify_all()
        return entry

    def _expire(self) -> None:
        """Answer at their deadline (504, or the fallback) the requests a silent worker holds."""
        silent = time.monotonic() - self.last_beat
        if silent < SILENT_S or not self._pending:
            return
        now = time.perf_counter_ns()
        with self._lock:
            late = [seq for seq, (job, _, _) in self._pending.items() if job.late(now)]
            jobs = []
            for seq in late:
                job, slot, rows = self._pending.pop(seq)
                self._expired[seq], self._rows = slot, self._rows - rows
                self._count_key(job, -1)
                jobs.append(job)
            if not self._pending:
                self._idle.notify_all()
        if jobs and self._warned_silence != self.last_beat:  # once per silence, not per request
            self._warned_silence = self.last_beat
            log.warning("worker %d (model=%s version=%s) silent for %.1f s: answered %d request(s) at "
                        "their deadline", self.pid, self.name, self.version, silent, len(jobs))
        for job in jobs:
            self._on_late(job)

    def _replied(self, reply: wire.Reply, header: bytes, frames: list[Any]) -> None:
        """The worker's reply `reply` with its reply `header`, the outputs in `frames` or the slot."""
        seq, outcome = reply.seq, reply.outcome
        entry = self._take(seq)
        if entry is None:
            return
        job, slot, rows = entry
        tracker = None
        if reply.places is not None:
            outputs, tracker, nbytes = self._from_slot(slot, reply.places)
        else:
            outputs = frames
            nbytes = layout([len(f) for f in outputs])[1]
        if nbytes > self._out_row_bytes * rows:  # learn the output size, so the next slot fits it
            self._out_row_bytes = -(-nbytes // max(rows, 1))
        self._release(slot, tracker)
        # Which of the worker's contexts served it is not reported: spread the records over
        # them, so the totals and the parallel service time come out right. Counted before
        # the reply leaves: a client that has its reply finds it in the statistics.
        views = self.executors
        stats = views[seq % len(views)].stats if views else self._stats.router
        if outcome.status == 200:
            stats.record_batch(outcome.batch, outcome.compute_us)
        stats.record(outcome.status, outcome.total_us, outcome.queue_us, outcome.compute_us, outcome.batch)
        job.answered(outcome.status)
        self._reply(job.reply_to, [header, *outputs])

    @staticmethod
    def _from_slot(slot: Slot | None, places: list[list[int]]) -> tuple[list[Any], zmq.MessageTracker | None, int]:
        """The outputs at `places` as reply frames, the tracker of the zero-copy ones, and the
        bytes they need laid out in a slot."""
        assert slot is not None, "the worker wrote outputs into a slot the request did not have"
        outputs: list[Any] = []
        trackers = []
        for offset, size in places:
            part = slot.view[offset:offset + size]
            if size >= ZERO_COPY_MIN:
                frame = zmq.Frame(part, copy=False, track=True)
                trackers.append(frame.tracker)
                outputs.append(frame)
            else:
                outputs.append(bytes(part))
        tracker = zmq.MessageTracker(*trackers) if trackers else None
        return outputs, tracker, layout([size for _, size in places])[1]

    def _release(self, slot: Slot | None, tracker: zmq.MessageTracker | None = None) -> None:
        if slot is not None:
            self.slots.release(slot, tracker)

    def _beat(self, beat: wire.Beat) -> None:
        self.last_beat = time.monotonic()
        views = self.executors
        for view, (queued, running, served) in zip(views, beat.contexts):
            view.queue.n, view.in_flight, view.served = queued, running, served

    def _ended(self) -> None:
        """The process is gone: tell the manager (the version stops being ready), answer what
        it held with 503, free the slots."""
        crashed = not self._stopping
        how = self.process.reason()
        reason = f"crashed ({how})" if crashed and not self.stop_reason else (self.stop_reason or how)
        self._on_exit(self, how, crashed)
        with self._lock:
            self._closing = True
            pending, self._pending, self._rows, self._keyed = self._pending, {}, 0, {}
            expired, self._expired = self._expired, {}
            self._idle.notify_all()
        for slot in expired.values():
            self._release(slot)
        retry_ms = max(100, self.load_ms + 100)
        for job, slot, _ in pending.values():
            self._release(slot)
            header = error_header(Status.NOT_READY, f"model {self.name!r} version {self.version!r}: worker "
                                  f"{self.pid} {reason}; retry", job.request.id, retry_after_ms=retry_ms,
                                  model=self.name, version=self.version)
            self._stats.router.record(int(Status.NOT_READY), (time.perf_counter_ns() - job.received_ns) // 1000)
            job.answered(int(Status.NOT_READY))
            self._reply(job.reply_to, encode_reply(header))
        for view in self.executors:
            self._stats.remove_context(view.stats)
        if self._regions is not None:
            self._regions.unsubscribe(id(self))
        self.slots.close()
        self._lane.close()  # the frontend's next poll of it reports it closed, and it lets go
        self.process.close()

    def _set(self, change: Change) -> None:
        """Tell the worker; by the lane when it fits, so that requests sent after it find it applied."""
        if change:
            message = [wire.Set(change).encode()]
            if not self._lane.send(message):
                self.process.send(message)

    def _forget(self, name: str) -> None:
        self.process.send([wire.Forget(name).encode()])
