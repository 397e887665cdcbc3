"""The worker process of a cold model (`python -m infermux.workers.child`, started by the daemon).

It loads its version with the hot placer (models/hot.py), so it runs the
same backend plugins, warm-up, `Scheduler` and `Executor`s (`contexts = N`
threads, batching, deadlines) as a hot model, behind the pipes of wire.py
instead of the daemon's ROUTER. It is started with
`subprocess`, never `fork`: a CUDA context does not survive a fork.

A worker starts as a spare: libraries imported, no model, waiting for LOAD.
It exits when the daemon says EXIT, and also when the daemon vanishes (the
lifeline pipe it inherited reads EOF), unlinking the shared-memory slots
the dead daemon can no longer remove. SIGTERM and SIGINT are ignored: on
`systemctl stop` the whole cgroup gets SIGTERM, and the daemon still needs
its workers to answer what is in flight while it drains.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Any, cast

import numpy as np
import zmq

from infermux.workers import wire as wire
from infermux.config import ModelConfig
from infermux.events import limit_tracebacks
from infermux.models.budget import limit_malloc_arenas, release_freed_memory, rss_bytes
from infermux.execution.inline import InlinePolicy
from infermux.execution.job import Job, Outcome, ReplyTo, SlotAddress
from infermux.workers.lane import Lane, LaneClosed
from infermux.plugins import backends
from infermux.plugins.base import BackendError
from infermux.protocol import DTYPES, OutputRegion, Request, Status, encode_reply, error_header
from infermux.transport.regions import MappedRegions
from infermux.transport.waiting import message_waiting
from infermux.models.hot import HotPlacer, WarmShape
from infermux.models.placer import LoadFailed
from infermux.models.version import ModelVersion
from infermux.execution.hooks import FrontendHooks
from infermux.execution.placement import Admission, Change
from infermux.execution.scheduler import Scheduler
from infermux.workers.slots import Slot, SlotCache, layout
from infermux.execution.outputs import ShapeMemory
from infermux.workers.slotoutputs import SlotOutputs

log = logging.getLogger("infermux.worker")

# Libraries a backend imports lazily on its first load: a spare imports them
# ahead so that a cold start costs the engine load alone.
HEAVY_IMPORTS = {"onnxruntime": ("onnxruntime",), "tensorrt": ("tensorrt",)}
BURST = 64


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m infermux.workers.child", description=__doc__.splitlines()[0])
    p.add_argument("--id", type=int, required=True, help="worker number (names its slots)")
    p.add_argument("--down", required=True, help="endpoint the daemon sends on")
    p.add_argument("--up", required=True, help="endpoint the daemon receives on")
    p.add_argument("--lifeline", type=int, required=True, help="fd that reads EOF when the daemon dies")
    p.add_argument("--lane", type=int, required=True, help="fd of the fast lane's socket (lane.py)")
    p.add_argument("--preload", default="", help="comma-separated backend names to import ahead")
    p.add_argument("--heartbeat-s", type=float, default=0.25)
    p.add_argument("--inline-max-us", type=int, default=500)
    p.add_argument("--inline-busy-max-us", type=int, default=250)
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def preload(names: list[str]) -> None:
    """Import backends and the libraries they load lazily; a missing one is not an error here."""
    for name in names:
        try:
            backends.get(name)
            for module in HEAVY_IMPORTS.get(name, ()):
                importlib.import_module(module)
        except (BackendError, ImportError) as exc:
            log.debug("preload of %s skipped: %s", name, exc)


class Worker:
    """One worker's loop: the I/O thread reads the daemon's pipe; executors reply."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.inline = InlinePolicy(args.inline_max_us, args.inline_busy_max_us)
        self.ctx = zmq.Context()
        self.down = self.ctx.socket(zmq.PULL)
        self.down.connect(args.down)
        self.up = self.ctx.socket(zmq.PUSH)
        self.up.setsockopt(zmq.LINGER, 2000)
        self.up.connect(args.up)
        self._send_lock = threading.Lock()  # executors and the I/O thread share `up`
        self.lane = Lane.from_fd(args.lane)
        self.slots = SlotCache()
        self.regions = MappedRegions()  # clients' shared-memory regions (regions.py)
        self.shapes = ShapeMemory()
        self.scheduler: Scheduler | None = None
        self.engine: Any = None
        self.name = self.version = ""
        # The daemon sent the version's routing strategy in its config: "least_queue" is never read.
        self.warm_shapes: tuple[WarmShape, ...] = ()  # the LOAD message's: what the daemon's pipelines send
        self.placer = HotPlacer(FrontendHooks(reply=self._reply, on_late=self._late, inline=self._inline_ok),
                                warming=self._warming, strategy=lambda: "least_queue",
                                shapes=lambda name: self.warm_shapes)

    def send(self, frames: list[Any], copy: bool = True) -> None:
        with self._send_lock:
            self.up.send_multipart(frames, copy=copy)

    def send_fast(self, frames: list[Any], copy: bool = True) -> None:
        """Replies: by the fast lane when they fit, else through ZeroMQ (lane.py)."""
        if not self.lane.send(frames):
            self.send(frames, copy)

    # -- main loop ---------------------------------------------------------------

    def run(self) -> int:
        self.send([wire.Hello(os.getpid(), rss_bytes()).encode()])
        poller = zmq.Poller()
        poller.register(self.down, zmq.POLLIN)
        poller.register(self.args.lifeline, zmq.POLLIN)
        poller.register(self.lane.fileno(), zmq.POLLIN)
        beat_s = self.args.heartbeat_s
        next_beat = time.monotonic()
        while True:
            wait_ms = max(0, math.ceil((next_beat - time.monotonic()) * 1000))  # 0 would spin until the beat
            events = dict(poller.poll(wait_ms))
            if self.args.lifeline in events:
                self._orphaned()
                return 0
            if self.lane.fileno() in events and not self._read_lane():
                self._orphaned()
                return 0
            if self.down in events:
                for _ in range(BURST):
                    try:
                        frames = self.down.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if wire.kind_of(frames[0]) == wire.EXIT:
                        self._read_lane()  # requests that overtook EXIT are still served
                        return self._exit()
                    self._handle(frames)
            if time.monotonic() >= next_beat:
                self._beat()
                next_beat = time.monotonic() + beat_s

    def _read_lane(self) -> bool:
        """Handle what waits on the fast lane; False once the daemon's end is closed."""
        for _ in range(BURST):
            try:
                frames = self.lane.recv()
            except LaneClosed:
                return False
            if frames is None:
                break
            self._handle(frames)
        return True

    def _handle(self, frames: list[bytes]) -> None:
        try:
            message = wire.decode(frames[0])
        except wire.MalformedMessage as exc:
            self._unreadable(wire.kind_of(frames[0]), exc)
            return
        if isinstance(message, wire.Infer):
            self._infer(message, frames[1:])
        elif isinstance(message, wire.Forget):
            self.slots.forget(message.slot)
        elif isinstance(message, wire.Map):
            fd = self.lane.take_fd()
            if fd is not None:
                self.regions.map(message.region, fd)
        elif isinstance(message, wire.Unmap):
            self.regions.unmap(message.region)
        elif isinstance(message, wire.Load):
            self.warm_shapes = message.shapes
            self._load(message.config)
        elif isinstance(message, wire.Set):
            self._set(message.change)
        else:
            log.warning("unexpected %s message from the daemon", type(message).__name__.upper())

    def _unreadable(self, kind: bytes, exc: wire.MalformedMessage) -> None:
        """A message from the daemon that does not decode (a daemon bug): said, and left unserved,
        but a LOAD is answered ERROR so that the daemon does not wait for READY, and a MAP's fd closed."""
        log.error("unreadable message from the daemon: %s", exc)
        if kind == wire.LOAD:
            self.send([wire.Error(f"unreadable LOAD message: {exc}", "load").encode()])
        elif kind == wire.MAP:
            fd = self.lane.take_fd()
            if fd is not None:
                os.close(fd)

    def _beat(self) -> None:
        if self.scheduler is None:
            return  # a spare: nobody reads its pipe yet, and unread beats would fill it
        contexts = [(len(ex.queue), ex.in_flight, ex.served) for ex in self.scheduler.executors]
        self.send([wire.Beat(contexts).encode()])

    # -- load --------------------------------------------------------------------

    def _load(self, mc: ModelConfig) -> None:
        started = time.monotonic()
        self.name, self.version = mc.name, mc.version
        try:
            scheduler = self.placer.load(ModelVersion(mc))
        except LoadFailed as exc:
            self.send([wire.Error(str(exc), exc.during).encode()])
            return
        self.scheduler, self.engine = scheduler, scheduler.engine
        ready = wire.Ready(list(self.engine.inputs), list(self.engine.outputs), self.engine.memory_bytes(),
                           scheduler.warm_row_us, scheduler.backend, round((time.monotonic() - started) * 1000),
                           scheduler.policy.allowed)
        self.send([ready.encode()])

    def _warming(self, version: ModelVersion, backend: str) -> None:
        self.send([wire.Stage("warming", backend).encode()])

    def _set(self, change: Change) -> None:
        if self.scheduler is not None:
            fewer = change.contexts is not None and change.contexts < len(self.scheduler.executors)
            self.scheduler.apply(change)
            if fewer:  # the removed contexts' sessions are gone: hand their memory back to the system
                release_freed_memory()

    def _inline_ok(self, service_time_us: float, batching: bool) -> bool:
        """May the I/O thread compute this request itself? (inline.py)"""
        if threading.current_thread() is not threading.main_thread():
            return False
        return self.inline.allows(service_time_us, batching, self._others_waiting)

    def _others_waiting(self) -> bool:
        """Whether more requests wait, on the fast lane or the socket."""
        return self.lane.readable() or message_waiting(self.down)

    # -- requests ------------------------------------------------------------------

    def _infer(self, message: wire.Infer, frames: list[bytes]) -> None:
        """One request: its tensors are in `frames` (inline) or in its slot."""
        slot = None if message.slot is None else self.slots.get(message.slot)
        to = SlotAddress(message.seq, slot)
        try:
            request = self._request(message, frames if slot is None else
                                    [slot.view[offset:offset + n] for offset, n in message.offsets])
            if slot is not None and not request.output_regions:  # outputs straight into it (workers/slotoutputs.py)
                kind = ShapeMemory.kind([[t.name, t.dtype, t.shape] for t in message.tensors], message.outputs)
                to.outputs = SlotOutputs(slot, message.outputs_at, kind, self.shapes)
        except (KeyError, TypeError, ValueError, IndexError) as exc:  # a daemon bug, not the client's
            self._refuse(to, Status.BACKEND_ERROR, f"worker cannot read the request: {exc}",
                         message.request_id)
            return
        job = Job(to, request, [], message.received_ns, message.deadline_ns, message.fallback,
                  outputs_into=to.outputs)
        scheduler = self.scheduler
        if scheduler is None or scheduler.submit(job) is not Admission.QUEUED:
            why = "no model loaded" if scheduler is None else "worker queue full"
            self._refuse(to, Status.NOT_READY, f"{why}; retry", request.id, retry_after_ms=50)

    def _request(self, message: wire.Infer, buffers: list[Any]) -> Request:
        """The request the daemon already parsed and checked, with numpy views on its tensors."""
        if message.regions:  # inputs in mapped client regions, between the copied ones
            in_region = {r.index: self.regions.view(r.region, r.offset, r.nbytes) for r in message.regions}
            copied = iter(buffers)
            buffers = [in_region[i] if i in in_region else next(copied) for i in range(len(message.tensors))]
        inputs = {t.name: np.frombuffer(buf, dtype=DTYPES[t.dtype]).reshape(t.shape)
                  for t, buf in zip(message.tensors, buffers, strict=True)}
        request = Request(model=message.model, inputs=inputs, id=message.request_id, key=message.key,
                          outputs=None if message.outputs is None else tuple(message.outputs))
        for out in message.output_regions:  # outputs the client wants in its region
            request.output_regions[out.name] = OutputRegion(out.region, out.offset,
                                                            self.regions.writable(out.region, out.offset))
        return request

    def _refuse(self, to: SlotAddress, status: Status, message: str, request_id: Any,
                **fields: Any) -> None:
        header = error_header(status, message, request_id, model=self.name, version=self.version, **fields)
        self._reply(to, encode_reply(header), Outcome(int(status), 1, 0, 0, 0))

    def _reply(self, to: ReplyTo, frames: list[Any], outcome: Outcome | None = None) -> None:
        """An executor's reply (every request here has a SlotAddress). Outputs the backend computed
        into the request's slot are only pointed at; others are copied there when they fit (and teach
        the slot outputs their shapes, for the next request of this kind), else sent inline."""
        address = cast(SlotAddress, to)
        seq, slot, placement = address.seq, address.slot, address.outputs
        header, outputs = frames[0], frames[1:]
        outcome = outcome or Outcome(0, 1, 0, 0, 0)
        places = None
        if slot is not None and outputs:
            metas = json.loads(header).get("outputs") or []  # names, dtypes and shapes of the outputs
            places = placement.where(metas) if placement is not None else None
            if places is None:
                if outcome.status == 200 and placement is not None:
                    self.shapes.learn(placement.kind, metas)
                places = _copy_into(slot, outputs)
        if places is not None:
            self.send_fast([wire.Reply(seq, outcome, places).encode(), header])
        else:
            sizes = sum(memoryview(f).nbytes for f in outputs)
            self.send_fast([wire.Reply(seq, outcome).encode(), header, *outputs], copy=sizes < 1 << 20)

    def _late(self, job: Job) -> None:
        self.send_fast([wire.Late(cast(SlotAddress, job.reply_to).seq).encode()])

    # -- endings ---------------------------------------------------------------------

    def _exit(self) -> int:
        if self.scheduler is not None:
            self.scheduler.stop(30.0)
        if self.engine is not None:
            self.engine.close()
        self.send([wire.Bye().encode()])
        self.up.close(linger=2000)
        self.down.close(linger=0)
        self.lane.close()
        return 0

    def _orphaned(self) -> None:
        log.warning("worker %d: the daemon is gone; removing its shared memory and exiting", os.getpid())
        self.slots.unlink_all()
        logging.shutdown()
        os._exit(0)  # executors may be inside the backend: do not wait for them


def _copy_into(slot: Slot, outputs: list[Any]) -> list[list[int]] | None:
    """Copy big outputs into the slot (the inputs are dead by now); their [offset, nbytes], or None
    to send them inline (small, or too big for the slot)."""
    sizes = [memoryview(f).nbytes for f in outputs]
    offsets, span = layout(sizes)
    if span > slot.size or sum(sizes) <= wire.INLINE_MAX_BYTES:
        return None
    view = slot.view
    for offset, size, frame in zip(offsets, sizes, outputs):
        view[offset:offset + size] = memoryview(frame).cast("B")
    return [[o, n] for o, n in zip(offsets, sizes)]


def _prefer_me_for_oom() -> None:
    """Out of memory, the kernel should kill a worker (the daemon restarts it), not the daemon."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(levelname)s infermux.workers.child[{os.getpid()}]: %(message)s")
    limit_tracebacks()  # as in the daemon: one traceback per kind, then counts (events.py)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    _prefer_me_for_oom()
    limit_malloc_arenas()  # as in the daemon, before any thread (budget.MALLOC_ARENAS)
    sys.setswitchinterval(1e-4)  # as in the daemon: executors get the GIL back promptly
    preload([n for n in args.preload.split(",") if n])
    return Worker(args).run()


if __name__ == "__main__":
    sys.exit(main())
