"""Running a pipeline: its frames wait in a bounded queue, a few threads run the steps.

Processors never run on the frontend thread: the router hands the request
to `Pipeline.submit`, which only queues it (a full queue is 429). The queue
serves keys (cameras) in turn, as a model's does (execution/fairqueue.py);
under `queue_policy = "newest_per_key"` a camera's newer frame replaces its
oldest waiting one, which is answered 409 at once. A worker
thread decodes the frame, runs each step in order and sends the reply. A
model step hands its arrays to the model's placement from that thread, with
every policy a client's request gets (calls.py); a
fan-out stage (`for_each = "regions"`) runs its processors on each crop and
sends all of a frame's crops to a model as one batched request.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infermux.config import CameraConfig, PipelineConfig
from infermux.events import EventLog
from infermux.pipelines import calls, spec
from infermux.pipelines.calls import AdmitFn, StepFailed
from infermux.pipelines.crossings import CrossingsFile
from infermux.pipelines.lifecycle import Lifecycle, Outlet, seen_at
from infermux.pipelines.refusals import FrameKind, Refusals
from infermux.pipelines.reinfer import Reinfer
from infermux.pipelines.seen import colour_order, frame_size, seen_of
from infermux.pipelines.stats import PipelineStats
from infermux.pipelines.zones import ZoneBook
from infermux.plugins.processors.base import (FrameTooLarge, OutOfTime, ProcessorError, Region, Sample,
                                              finite_regions, working)
from infermux.plugins.processors.track import Track
from infermux.protocol import Limits, ProtocolError, Status, encode_reply, error_header
from infermux.execution.executor import ReplyFn
from infermux.execution.priority import lower_this_thread
from infermux.execution.fairqueue import Closed, FairQueue, longest_lane
from infermux.execution.job import ONLY_INPUT, Job
from infermux.execution.scheduler import NEWEST_PER_KEY, superseded

log = logging.getLogger("infermux.pipelines")

SWEEP_S = 0.1  # how often objects are looked at for their `end`: events come this much after end_after_s at most
InputsFn = Callable[[str], "list[str] | None"]  # a model's input names, None while not loaded


@dataclass
class Run:
    """One frame's way through the steps: the request, the tensors asked for, time per step."""

    job: Job
    wanted: tuple[str, ...]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    timing_us: dict[str, int] = field(default_factory=dict)
    fallbacks: list[dict[str, str]] = field(default_factory=list)  # model steps a fallback answered


class Crashed(Exception):
    """A step raised something other than a ProcessorError: 500 for this request only."""

    def __init__(self, step: str, exc: BaseException) -> None:
        super().__init__(f"step {step!r} failed: {type(exc).__name__}: {exc} (logged)")
        self.step = step


class Pipeline:
    """One configured pipeline: its steps, its queue and threads, its statistics."""

    def __init__(self, config: PipelineConfig, admit: AdmitFn, reply: ReplyFn, reply_late: ReplyFn,
                 model_inputs: InputsFn, limits: Limits, outlet: Outlet | None = None,
                 zones: ZoneBook | None = None) -> None:
        self.config = config
        self.outlet = outlet or Outlet()
        self.lifecycle = (Lifecycle(config.events, config.name, zones=zones, outlet=self.outlet)
                          if config.events is not None else None)
        self.order = colour_order(config)  # the decoded image's, for the snapshots
        self.name = config.name
        self.stages = spec.stages(config)
        self._steps = {step.name: step for stage in self.stages for step in stage.steps}
        self.model_steps = spec.model_steps(config)
        self.stats = PipelineStats([s.name for s in config.steps])
        self.refusals = Refusals()  # frames refused for what they are: the same again is not computed
        self._admit, self._reply, self._model_inputs, self._limits = admit, reply, model_inputs, limits
        self._reply_late = reply_late  # refusals of the frame itself: held back (server.reply_late)
        self._queue: FairQueue[Job] = FairQueue(key=lambda job: job.request.key)
        self._keep = config.per_key_depth if config.queue_policy == NEWEST_PER_KEY else 0
        # A reload replaces or removes this pipeline while the router may still be handing it a
        # frame: `_gate` orders the two, so no frame is queued behind the threads' last one.
        self._gate = threading.Lock()
        self._closed = False
        self.successor: Pipeline | None = None  # the reload's new definition, which takes later frames
        self._threads = [threading.Thread(target=self._work, name=f"pipeline-{self.name}-{i}", daemon=True)
                         for i in range(config.workers)]
        for thread in self._threads:
            thread.start()

    def state(self, step: str) -> dict[str, Any]:
        """What a step keeps across frames, for the views: a track step's streams and tracks, a
        re-inferred step's regions computed, reused and skipped."""
        built = self._steps[step]
        if isinstance(built, spec.ModelStep) and built.reinfer is not None:
            return {"reinfer": built.reinfer.counts()}
        if isinstance(built, spec.ProcessorStep) and isinstance(built.processor, Track):
            return {"tracking": built.processor.streams()}
        return {}

    # -- the frontend thread ------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue `job` for a worker thread, or ProtocolError 429 when the queue is full
        (404 when a reload removed the pipeline; its successor's when a reload changed it)."""
        with self._gate:
            if not self._closed:
                self._enqueue(job)
                return
        if self.successor is None:
            raise ProtocolError(Status.NOT_FOUND, f"pipeline {self.name!r} was removed by a reload")
        self.successor.submit(job)

    def _enqueue(self, job: Job) -> None:
        if not job.deadline_ns:
            job.deadline_ns = job.received_ns + (job.request.timeout_ms or self.config.timeout_ms) * 1_000_000
        key = job.request.key
        keep = self._keep if key is not None else 0
        # On the frontend thread alone: the threads only take, so the queue cannot grow past the check.
        full = not (keep and self._queue.count(key) >= keep) and len(self._queue) >= self.config.max_queue
        if full and not self._push_out(job):
            self.stats.frames.record(int(Status.TOO_MANY), 0)
            raise ProtocolError(Status.TOO_MANY, f"pipeline {self.name!r} queue is full ({self.config.max_queue} "
                                f"frames, max_queue); retry later", retry_after_ms=self._retry_after_ms())
        for old in self._queue.put(job, keep=keep):  # Closed only once stopped, under the gate: not here
            self.stats.frames.record(int(Status.SUPERSEDED), (time.perf_counter_ns() - old.received_ns) // 1000)
            old.answered(int(Status.SUPERSEDED))
            self._reply(old.reply_to, encode_reply(superseded(old, job, self.name, None)))

    def _push_out(self, job: Job) -> bool:
        """The queue is full: make room for `job` if its key holds less of it than another key, as a
        model's queue does (Scheduler.push_out): the key holding the most gives up its newest frame
        (its oldest under newest_per_key), answered 429. Equal cameras then share a full queue
        instead of the ones whose frames happen to arrive as a place frees taking every place."""
        newest = self.config.queue_policy != NEWEST_PER_KEY
        held = {key: [(lane, self._queue)] for key, lane in self._queue.lanes().items()}
        found = longest_lane(held, job.request.key, newest, lambda queued: queued.received_ns)
        if found is None:
            return False
        hog, _ = found
        victim = self._queue.pop_newest(hog) if newest else self._queue.pop_oldest(hog)
        if victim is not None:  # (None: a thread took the lane's last frame meanwhile, which made room too)
            self.stats.frames.record(int(Status.TOO_MANY), (time.perf_counter_ns() - victim.received_ns) // 1000)
            victim.answered(int(Status.TOO_MANY))
            self._reply(victim.reply_to, encode_reply(error_header(
                Status.TOO_MANY, f"pipeline {self.name!r} queue is full and key {hog!r} holds the most of it; "
                "retry later", victim.request.id, retry_after_ms=self._retry_after_ms())))
        return True

    def _retry_after_ms(self) -> int:
        """Retry-After for a full queue: about the time its threads take to work through it."""
        per_frame_us = self.stats.frames.snapshot().p50_us or 10_000
        return max(1, int(per_frame_us * self.config.max_queue / self.config.workers / 1000))

    def stop(self, successor: "Pipeline | None" = None) -> None:
        """Let the threads finish what is queued and end; frames submitted later go to `successor`."""
        with self._gate:
            if self._closed:
                return
            self.successor, self._closed = successor, True
        self._queue.close()
        if self.lifecycle is not None and self.outlet.events is not None:
            for event in self.lifecycle.end_all():
                self.outlet.events(self.name, event)

    # -- the worker threads ---------------------------------------------------------

    def _work(self) -> None:
        lower_this_thread(self.config.nice, f"pipeline {self.name}")
        while True:
            try:
                job = self._queue.get()
            except Closed:  # stopped, and nothing is left
                return
            if job is None:
                continue
            try:
                status, frames = self._answer(job)
            except Exception:  # never lose the thread: the request still gets its 500
                log.exception("internal error in pipeline %r", self.name)
                status, frames = Status.BACKEND_ERROR, encode_reply(error_header(
                    Status.BACKEND_ERROR, "internal error in infermux (logged)", job.request.id))
            self.stats.frames.record(int(status), (time.perf_counter_ns() - job.received_ns) // 1000)
            job.answered(int(status))
            # A frame refused for what it is (undecodable, over a bound) is refused again if sent again:
            # held back a moment, a client looping on it cannot keep the pipeline's threads busy.
            refused = status in (Status.BAD_REQUEST, Status.TOO_LARGE)
            (self._reply_late if refused else self._reply)(job.reply_to, frames)

    def _answer(self, job: Job) -> tuple[int, list[Any]]:
        """The reply to one frame: 200 with its regions, or the error naming the step."""
        req = job.request
        where = f"pipeline {self.name!r}"
        frame: tuple[Sample, FrameKind] | None = None  # once read: what a refusal is remembered by
        try:
            run = Run(job, self._wanted(job))
            sample = self._sample(job)
            frame = sample, FrameKind.of(sample, run.wanted)
            refused = self.refusals.recall(*frame)
            if refused is not None:
                return refused.status, encode_reply(error_header(
                    Status(refused.status), f"{refused.message} {self.refusals.reminder(refused)}",
                    req.id, model=self.name))
            for stage in self.stages:
                self._stage(stage, sample, run)
            header = self._header(req.id, sample, run)
            if req.key is not None:
                self._observed(job, sample, header)
            return Status.OK, encode_reply(header, {k: run.tensors[k] for k in run.wanted})
        except OutOfTime as exc:  # the request's time, not the frame: another request may give it more
            status, message, retry = Status.DEADLINE, f"{where} {exc}", None
        except ProcessorError as exc:  # a step's refusal of what the frame is: the same frame again gets it again
            status = Status.TOO_LARGE if isinstance(exc, FrameTooLarge) else Status.BAD_REQUEST
            message, retry = f"{where} {exc}", None
            if frame is not None:
                self.refusals.remember(*frame, int(status), message)
        except StepFailed as exc:
            status, message, retry = Status(exc.status), f"{where} {exc.message}", exc.retry_after_ms
        except Crashed as exc:
            log.error("%s %s", where, exc, exc_info=exc.__cause__)
            status, message, retry = Status.BACKEND_ERROR, f"{where} {exc}", None
        return status, encode_reply(error_header(status, message, req.id, retry_after_ms=retry, model=self.name))

    def _header(self, request_id: Any, sample: Sample, run: Run) -> dict[str, Any]:
        """A computed frame's reply header: its regions (or a whole-frame classifier's classes), the steps'
        times, the fallbacks taken and how many boxes were dropped."""
        header: dict[str, Any] = {"id": request_id, "status": 200, "model": self.name}
        if sample.classes and not sample.regions:  # a whole-frame classifier: its classes, no regions
            header["classes"] = [[{"index": c.index, "label": c.label, "score": round(c.score, 6)}
                                  for c in row] for row in sample.classes]
        else:
            header["regions"] = [r.to_json() for r in sample.regions]
        header["timing_us"] = run.timing_us
        if sample.motion:  # where the frame changed, as it came: a result's reader sees what the steps were given
            header["motion"] = [list(box) for box in sample.motion]
        if run.fallbacks:
            header["fallbacks"] = run.fallbacks
        if sample.dropped:  # boxes that were not finite numbers: the answer says the frame had them
            header["dropped_regions"] = sample.dropped
        return header

    def _observed(self, job: Job, sample: Sample, header: dict[str, Any]) -> None:
        """A served frame of a keyed stream: its objects' events and its result, to the sinks."""
        key = str(job.request.key)
        results, events, snapshots = self.outlet.results, self.outlet.events, self.outlet.snapshots
        if results is not None:
            results(self.name, key, header)
        if self.lifecycle is None and snapshots is None:
            return
        seen, captured = seen_at(getattr(job.request, "captured", None), job.received_ns)
        frame = None
        if snapshots is not None and sample.image is not None:  # the newest frame, by reference (seen.py)
            frame = seen_of(sample.image, sample.data, sample.regions, key, self.name, self.order, seen)
            snapshots.remember(frame)
        if self.lifecycle is not None:
            for event in self.lifecycle.observe(key, sample.regions, seen, captured, frame_size(sample), frame):
                if events is not None:
                    events(self.name, event)
            self.outlet.following.set()  # after observe: the sweeper's check after clearing sees the object

    def sweep(self) -> bool:
        """End the objects gone quiet (and send the updates whose wait is over); whether any is left."""
        if self.lifecycle is None:
            return False
        events = self.outlet.events
        for event in self.lifecycle.sweep():
            if events is not None:
                events(self.name, event)
        return self.lifecycle.following()

    def _wanted(self, job: Job) -> tuple[str, ...]:
        """The tensors the request asks for back: "step.output" of a model step."""
        wanted = job.request.outputs or ()
        for name in wanted:
            if name.partition(".")[0] not in self.model_steps:
                raise ProcessorError("outputs", f"{name!r} is not \"step.output\" of a model step; "
                                     f"model steps: {', '.join(self.model_steps)}")
        return tuple(wanted)

    def _sample(self, job: Job) -> Sample:
        """The request's frame as a Sample: its bytes, and the format and geometry its header declares."""
        req, name = job.request, self.config.input
        if set(req.inputs) != {name}:
            raise ProcessorError("input", f"takes one input {name!r} (a frame), got {sorted(req.inputs)}")
        array = req.inputs[name]
        if array.dtype != np.uint8:
            raise ProcessorError("input", f"input {name!r} must be uint8 bytes, got {array.dtype}")
        # The frontend's parse kept the frame's entry (Request.described): its header is not read again.
        meta = (req.described or {}).get(name, {})
        fmt = meta.get("format")
        if not isinstance(fmt, str):
            raise ProcessorError("input", f"input {name!r} needs a \"format\": jpeg, png, nv12, i420, bgr, rgb, gray")
        geometry = {k: meta.get(k) for k in ("width", "height", "stride")}
        for key, value in geometry.items():
            if value is not None and (type(value) is not int or value < 1):
                raise ProcessorError("input", f"input {name!r}: {key!r} must be a positive integer, got {value!r}")
        return Sample(data=array, format=fmt, key=req.key, time_ns=job.received_ns, deadline_ns=job.deadline_ns,
                      width=geometry["width"], height=geometry["height"], stride=geometry["stride"],
                      motion=list(getattr(req, "motion", ())))

    def _stage(self, stage: spec.Stage, sample: Sample, run: Run) -> None:
        if not stage.fan_out:
            samples = [sample]
        else:
            if len(sample.crops) != len(sample.regions):
                raise ProcessorError(stage.steps[0].name, "for_each = \"regions\" needs a 'crop' step before it")
            samples = [Sample(image=crop, regions=[region]) for crop, region in zip(sample.crops, sample.regions)]
            if not samples:  # nothing found: nothing to run (200 with no regions)
                return
        computed: list[tuple[Reinfer, Region]] = []
        for step in stage.steps:
            if isinstance(step, spec.ModelStep) and step.reinfer is not None:
                samples = self._admit_regions(step.reinfer, sample.key, samples, computed)
                if not samples:  # every region took its track's answer, or was skipped
                    break
            self._step(step, samples, run)
        for reinfer, region in computed:  # the stage's answers, now whole, are their tracks'
            reinfer.remember(sample.key, region)

    @staticmethod
    def _admit_regions(reinfer: Reinfer, key: str | int | None, samples: list[Sample],
                       computed: list[tuple[Reinfer, Region]]) -> list[Sample]:
        """The crops a re-inferred step computes now; the others leave the stage with their track's
        answer (or skipped), as reinfer.py decides."""
        now = reinfer.admit(key, [one.regions[0] for one in samples])
        computed += [(reinfer, samples[i].regions[0]) for i in now]
        return [samples[i] for i in now]

    def _step(self, step: spec.Step, samples: list[Sample], run: Run) -> None:
        """Run one step over `samples`, timing and counting it; errors name the step. A frame whose
        deadline has passed is not carried further: its client has had its 504 (or given up)."""
        self._in_time(step.name, run)
        start = time.perf_counter_ns()
        status = Status.OK
        try:
            if isinstance(step, spec.ModelStep):
                self._model(step, samples, run)
            else:
                made, dropped = 0, samples[0].dropped
                for one in samples:
                    step.processor(one)
                    if len(samples) > 1:  # a stage over many regions: each may take a while, and make much
                        self._in_time(step.name, run)
                        made = self._few_bytes(step.name, one, made)
                if not step.fan_out:
                    self._finite_regions(samples[0], dropped)
                    self._few_regions(step.name, samples[0])
        except OutOfTime:
            status = Status.DEADLINE
            raise
        except ProcessorError as exc:
            status = Status.TOO_LARGE if isinstance(exc, FrameTooLarge) else Status.BAD_REQUEST
            raise
        except StepFailed as exc:
            status = Status(exc.status)
            exc.message = f"step {step.name!r}: {exc.message}"
            raise
        except Exception as exc:
            status = Status.BACKEND_ERROR
            raise Crashed(step.name, exc) from exc
        finally:
            us = (time.perf_counter_ns() - start) // 1000
            run.timing_us[step.name] = us
            self.stats.step(step.name, int(status), us)

    def _in_time(self, step: str, run: Run) -> None:
        """StepFailed (504) once the frame's deadline has passed: the steps left are not computed."""
        now = time.perf_counter_ns()
        if now >= run.job.deadline_ns:
            late_ms = (now - run.job.deadline_ns) / 1e6
            raise StepFailed(Status.DEADLINE, f"step {step!r}: the frame's deadline passed {late_ms:.0f} ms before "
                             "it; it and the steps after it were not computed")

    def _finite_regions(self, sample: Sample, before: int) -> None:
        """Drop the regions whose box or score is not a finite number (a model's NaN or infinity),
        before a later step tracks or crops them; those and the ones the step dropped itself (since
        `before`) are counted on the frame's answer and the pipeline's view."""
        sample.regions, dropped = finite_regions(sample.regions)
        sample.dropped += dropped
        if sample.dropped > before:
            self.stats.dropped(sample.dropped - before)

    def _few_bytes(self, step: str, sample: Sample, made: int) -> int:
        """The bytes a per-region step has made for the frame's regions so far, with `sample`'s; 413 as
        soon as they are over max_batch_bytes, before the step runs on the frame's other regions."""
        array = sample.tensor if sample.tensor is not None else sample.image
        made += int(array.nbytes) if isinstance(array, np.ndarray) else 0
        if made > self.config.max_batch_bytes:
            raise FrameTooLarge(step, f"made {made} bytes for the frame's regions so far; the pipeline takes at "
                                f"most {self.config.max_batch_bytes} per frame (max_batch_bytes)")
        return made

    def _few_regions(self, step: str, sample: Sample) -> None:
        """413 as soon as a step finds more regions than the pipeline takes per frame (before crops)."""
        if len(sample.regions) > self.config.max_regions:
            raise FrameTooLarge(step, f"found {len(sample.regions)} regions in the frame; the pipeline takes at "
                                f"most {self.config.max_regions} (max_regions)")

    def _model(self, step: spec.ModelStep, samples: list[Sample], run: Run) -> None:
        """The samples' tensors as one request to `step.model`; each sample gets its rows of the outputs."""
        tensors = [working(step.name, s) for s in samples]
        batch = self._batch(step, tensors)
        names = self._model_inputs(step.model)
        name = step.input or (names[0] if names and len(names) == 1 else ONLY_INPUT)
        try:
            reply = calls.call(self._admit, step.model, {name: batch}, run.job.deadline_ns, run.job.request.id)
        except StepFailed as exc:
            self.stats.called(step.name, exc.in_process, False)
            raise
        self.stats.called(step.name, reply.in_process, reply.here)
        if reply.fallback:
            run.fallbacks.append({"step": step.name, **reply.fallback})
        for out, value in reply.outputs.items():
            if f"{step.name}.{out}" in run.wanted:
                run.tensors[f"{step.name}.{out}"] = value
        share(step.name, samples, [t.shape[0] for t in tensors], batch, reply.outputs)

    def _batch(self, step: spec.ModelStep, tensors: list[np.ndarray]) -> np.ndarray:
        """The samples' tensors as one batch, once its crops' width and its size are within the bounds."""
        if step.fan_out:
            widest = max(t.shape[-1] for t in tensors)
            if widest > self.config.max_crop_width:
                raise FrameTooLarge(step.name, f"a region's tensor is {widest} wide; the pipeline pads every crop "
                                    f"of the frame to the widest and takes at most {self.config.max_crop_width} "
                                    f"(max_crop_width)")
        size = batch_bytes(tensors, step.pad_multiple)
        if size > self.config.max_batch_bytes:  # before the batch (or the model's work on it) is made
            raise FrameTooLarge(step.name, f"its batch of {len(tensors)} tensor(s) would be {size} bytes; the "
                                f"limit is {self.config.max_batch_bytes} (max_batch_bytes)")
        return stack(step.name, tensors, step.pad_value, step.pad_multiple)


def share(step: str, samples: list[Sample], rows: list[int], batch: np.ndarray, outputs: dict[str, np.ndarray]) -> None:
    """Each sample gets its `rows` of the model's outputs for `batch` (they replace the previous model's)."""
    if len(samples) == 1:
        samples[0].outputs = dict(outputs)
        return
    cuts = np.cumsum(rows)[:-1]
    for one in samples:
        one.outputs = {}
    for out, value in outputs.items():
        if value.shape[:1] != batch.shape[:1]:
            raise ProcessorError(step, f"output {out!r} has shape {list(value.shape)}, not one row "
                                 f"per input row ({batch.shape[0]})")
        for one, part in zip(samples, np.split(value, cuts)):
            one.outputs[out] = part


def batch_bytes(tensors: list[np.ndarray], multiple: int) -> int:
    """The bytes `stack` would make of `tensors`: every axis but the first padded to the largest, the
    last up to a multiple of `multiple` (computed without making it)."""
    if len(tensors) == 1 and multiple == 1:
        return int(tensors[0].nbytes)
    rank = max(t.ndim for t in tensors)
    dims = [max(t.shape[axis] if axis < t.ndim else 1 for t in tensors) for axis in range(1, rank)]
    if dims:
        dims[-1] = -(-dims[-1] // multiple) * multiple
    rows = sum(t.shape[0] if t.ndim else 1 for t in tensors)
    return rows * math.prod(dims) * max(t.itemsize for t in tensors)


def stack(step: str, tensors: list[np.ndarray], pad_value: float, multiple: int) -> np.ndarray:
    """The tensors (each with its batch rows first) as one batch: every other axis padded with
    `pad_value` to the largest, the last one up to a multiple of `multiple`."""
    if len(tensors) == 1 and multiple == 1:
        return tensors[0]
    ranks = {t.ndim for t in tensors}
    dtypes = {t.dtype for t in tensors}
    if len(ranks) != 1 or len(dtypes) != 1 or min(ranks) < 2:
        raise ProcessorError(step, f"cannot batch tensors of shapes {[list(t.shape) for t in tensors]} "
                             f"and dtypes {sorted(str(d) for d in dtypes)}")
    dims = [max(t.shape[axis] for t in tensors) for axis in range(1, tensors[0].ndim)]
    dims[-1] = -(-dims[-1] // multiple) * multiple
    rows = sum(t.shape[0] for t in tensors)
    out = np.full((rows, *dims), pad_value, dtype=tensors[0].dtype)
    row = 0
    for t in tensors:
        out[(slice(row, row + t.shape[0]),) + tuple(slice(0, n) for n in t.shape[1:])] = t
        row += t.shape[0]
    return out


@dataclass
class PipelineChanges:
    """What a reload did to the pipelines, by name."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)


class Pipelines:
    """Every configured pipeline by name (the router dispatches to them); the views read `view`."""

    def __init__(self, configs: tuple[PipelineConfig, ...], admit: AdmitFn, reply: ReplyFn, reply_late: ReplyFn,
                 model_inputs: InputsFn, limits: Limits, cameras: tuple[CameraConfig, ...] = (),
                 crossings: CrossingsFile | None = None) -> None:
        self._admit, self._reply, self._reply_late, self._model_inputs = admit, reply, reply_late, model_inputs
        self.outlet = Outlet()  # where events and results go: the daemon connects the sinks (docs/events.md)
        # The cameras' zones and lines and their counts, shared by every pipeline: a camera's stream keeps its
        # counts across its pipeline's rebuild (zones.py), its lines' crossings across a restart (crossings.py).
        self.zones, self.crossings = ZoneBook(cameras), crossings or CrossingsFile(None, EventLog())
        self.zones.restore(self.crossings.read())
        # The router holds this very dict: `apply` changes it in place.
        self.by_name = {c.name: self._build(c, limits) for c in configs}
        self._stopped = threading.Event()
        # Objects end when their stream goes quiet, without a frame to notice it on: a thread looks.
        self._sweeper = threading.Thread(target=self._sweep, name="pipeline-lifecycles", daemon=True)
        self._sweeper.start()

    def _build(self, config: PipelineConfig, limits: Limits) -> Pipeline:
        return Pipeline(config, self._admit, self._reply, self._reply_late, self._model_inputs, limits, self.outlet,
                        self.zones)

    def _sweep(self) -> None:
        following = self.outlet.following
        while not self._stopped.is_set():
            following.wait()  # until a pipeline follows an object
            if self._stopped.wait(SWEEP_S):
                return
            left = self._sweep_all()
            self.crossings.keep(self.zones, now=not left)  # the last objects ended: saved before it sleeps
            if not left:
                following.clear()
                if any(p.lifecycle is not None and p.lifecycle.following() for p in list(self.by_name.values())):
                    following.set()  # an object observed between the sweep and the clear

    def _sweep_all(self) -> bool:
        """Sweep every pipeline; whether any still follows an object."""
        left = False
        for pipeline in list(self.by_name.values()):
            try:
                left = pipeline.sweep() or left
            except Exception:  # never lose the thread: the next sweep tries again
                log.exception("internal error ending tracked objects of pipeline %r", pipeline.name)
                left = True
        return left

    def apply(self, configs: tuple[PipelineConfig, ...], limits: Limits) -> PipelineChanges:
        """Move to `configs` (a reload): new pipelines start, removed ones stop, changed ones are
        replaced. A stopped pipeline's threads finish the frames it holds on the old definition;
        a frame the router hands it later goes to its replacement (or is a 404 if it was removed).
        Everything is built before anything changes, so a step that cannot be built changes nothing."""
        wanted = {c.name: c for c in configs}
        changes = PipelineChanges(
            added=[n for n in wanted if n not in self.by_name],
            removed=[n for n in self.by_name if n not in wanted],
            changed=[n for n in wanted if n in self.by_name and self.by_name[n].config != wanted[n]])
        fresh: dict[str, Pipeline] = {}
        try:
            for name in (*changes.added, *changes.changed):
                fresh[name] = self._build(wanted[name], limits)
        except BaseException:
            for pipeline in fresh.values():
                pipeline.stop()
            raise
        for name in changes.removed:
            self.by_name.pop(name).stop()
        for name in changes.changed:
            old, self.by_name[name] = self.by_name[name], fresh[name]
            old.stop(successor=fresh[name])
        for name in changes.added:
            self.by_name[name] = fresh[name]
        return changes

    def view(self) -> list[dict[str, Any]]:
        """Per pipeline: its frames' and each step's counts and latencies, and what each step runs."""
        out = []
        for p in self.by_name.values():
            stats = p.stats.view()
            for step in p.config.steps:
                stats["steps"][step.name].update({"model": step.model} if step.model else {"processor": step.processor})
                if step.for_each:
                    stats["steps"][step.name]["for_each"] = step.for_each
                stats["steps"][step.name].update(p.state(step.name))
            out.append({"name": p.name, "input": p.config.input, "queued": len(p._queue), "workers": p.config.workers,
                        "nice": p.config.nice, "queue_policy": p.config.queue_policy,
                        "refused_from_memory": p.refusals.recalled, "dropped_regions": p.stats.dropped_regions,
                        **({"events": p.lifecycle.counts()} if p.lifecycle is not None else {}), **stats})
        return out

    def stop(self) -> None:
        self._stopped.set()
        self.outlet.following.set()  # the sweeper, asleep until an object is followed, sees the stop
        for pipeline in self.by_name.values():
            pipeline.stop()
        self.crossings.keep(self.zones, now=True)
