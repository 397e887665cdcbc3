"""The private protocol between the daemon and its worker processes.

Two ZeroMQ ipc pipes per worker, both bound by the daemon in its runtime
directory: `down` (daemon PUSH → worker PULL) and `up` (worker PUSH →
daemon PULL), plus the fast lane (lane.py), a socketpair that INFER, REPLY,
LATE and SET take whenever they fit one packet (SET there so that requests
sent after it find it applied); everything else, and whatever the lane
refuses, goes by the pipes. Every message is multipart; frame 0 is one kind
byte followed by that kind's payload (fewer frames: pyzmq costs a few µs
per frame). The messages with more than a few fields are dataclasses
below (`Infer`; `Outcome` in REPLY; `placement.Change` in SET), defined
here once for both sides.

daemon → worker
    LOAD   [b"l" config JSON]               load, warm up, then READY or ERROR
    INFER  [b"I" Infer, *inline tensors]   one request as the daemon parsed and checked it (`Infer`
                                            below: a JSON array in the order of its fields)
    FORGET [b"F" slot name]                 the daemon unlinked that slot: unmap it
    MAP    [b"M" region token] + fd         a client's shared-memory region (regions.py), lane only
    UNMAP  [b"U" region token]              that client let go of it
    SET    [b"C" JSON]                      a placement.Change: contexts / max_batch / batch_delay_us /
                                            preferred_batch (the fields that change)
    EXIT   [b"X"]                           finish what is queued, then exit

worker → daemon
    HELLO  [b"h" {"pid", "rss"}]            libraries imported, waiting for LOAD
    STAGE  [b"s" {"state"}]                 engine loaded, warming up
    READY  [b"r" {"inputs", "outputs", "memory_bytes", "row_us", "load_ms", ...}]
    ERROR  [b"e" {"reason", "during"}]
    REPLY  [b"R" seq + Outcome (struct) + layout JSON | nothing, reply header, *inline outputs]
           layout: [[offset, nbytes], ...] of the outputs in the request's slot (after the
           inputs when the backend computed them there, workers/slotoutputs.py)
    LATE   [b"L" seq]                       past its deadline: the daemon decides (fallback/504)
    BEAT   [b"H" {"ctx": [[queued, in_flight, served], ...]}]
    BYE    [b"b"]

Timestamps are `time.perf_counter_ns()`, CLOCK_MONOTONIC on Linux and so the
same clock in both processes: the worker's timing_us counts from the moment
the daemon received the request.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from infermux.config import ModelConfig
from infermux.plugins.base import TensorSpec
from infermux.protocol import Request, dtype_name
from infermux.execution.job import Outcome
from infermux.execution.placement import Change

LOAD, INFER, FORGET, SET, EXIT, MAP, UNMAP = b"l", b"I", b"F", b"C", b"X", b"M", b"U"
HELLO, STAGE, READY, ERROR, REPLY, LATE, BEAT, BYE = b"h", b"s", b"r", b"e", b"R", b"L", b"H", b"b"

_SEQ = struct.Struct("<Q")
# seq, status, batch, queue µs, compute µs, total µs: what the daemon's statistics
# need, without parsing the reply header.
_REPLY = struct.Struct("<QHIqqq")  # rows as uint32: one request may hold more than 65535
REPLY_HEAD = 1 + _REPLY.size

# Requests whose tensors total at most this many bytes travel inside the
# INFER message instead of a slot (docs/decisions.md has the measurement).
INLINE_MAX_BYTES = int(os.environ.get("INFERMUX_WORKER_INLINE_BYTES", 64 * 1024))

dumps = json.JSONEncoder(separators=(",", ":")).encode


def kind_of(frame: bytes) -> bytes:
    return frame[:1]


def control(what: bytes, body: Any = None) -> list[bytes]:
    """A one-frame message: the kind byte, then `body` as JSON (or raw bytes)."""
    if body is None:
        return [what]
    return [what + (body if isinstance(body, bytes) else dumps(body).encode())]


def body_of(frame: bytes) -> Any:
    """The JSON payload of a control message."""
    return json.loads(frame[1:]) if len(frame) > 1 else {}


def seq_message(what: bytes, seq: int) -> list[bytes]:
    return [what + _SEQ.pack(seq)]


def seq_of(frame: bytes) -> int:
    return _SEQ.unpack_from(frame, 1)[0]


@dataclass(slots=True)
class Tensor:
    """One input as the daemon checked it: the worker wraps its bytes in an array of this kind."""

    name: str
    dtype: str
    shape: list[int]


@dataclass(slots=True)
class RegionInput:
    """An input the worker reads where it lies, in a client's region it has mapped (MAP)."""

    index: int  # its place among the request's inputs
    region: str
    offset: int
    nbytes: int


@dataclass(slots=True)
class RegionOutput:
    """An output the client wants written into its region (the worker maps it too)."""

    name: str
    region: str
    offset: int


@dataclass(slots=True)
class Infer:
    """INFER: one request, as the daemon parsed and checked it, and where its tensors are.

    Its inputs are in the slot at `offsets` (one [offset, nbytes] per copied input), or
    else in the message's frames, in order; those in `regions` in neither.
    """

    seq: int
    received_ns: int
    deadline_ns: int
    request_id: str | int | None
    model: str
    key: str | None
    outputs: list[str] | None  # the outputs the client asked for; None: all
    tensors: list[Tensor]
    fallback: dict[str, str] | None = None
    slot: str | None = None
    offsets: list[list[int]] = field(default_factory=list)
    outputs_at: int = 0  # where outputs may start in the slot, after the inputs
    regions: list[RegionInput] = field(default_factory=list)
    output_regions: list[RegionOutput] = field(default_factory=list)

    @classmethod
    def of(cls, seq: int, received_ns: int, deadline_ns: int, fallback: dict[str, str] | None,
           req: Request) -> "Infer":
        """The message for parsed request `req` (where its tensors go is filled in after)."""
        tensors = [Tensor(name, dtype_name(a.dtype), list(a.shape)) for name, a in req.inputs.items()]
        return cls(seq, received_ns, deadline_ns, req.id, req.model, req.key,
                   None if req.outputs is None else list(req.outputs), tensors, fallback)

    def encode(self) -> bytes:
        return INFER + dumps([self.seq, self.received_ns, self.deadline_ns, self.request_id, self.model,
                              self.key, self.outputs, [[t.name, t.dtype, t.shape] for t in self.tensors],
                              self.fallback, self.slot, self.offsets, self.outputs_at,
                              [[r.index, r.region, r.offset, r.nbytes] for r in self.regions],
                              [[r.name, r.region, r.offset] for r in self.output_regions]]).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Infer":
        (seq, received, deadline, rid, model, key, outputs, tensors, fallback, slot, offsets, outputs_at,
         regions, output_regions) = json.loads(frame[1:])
        return cls(seq, received, deadline, rid, model, key, outputs, [Tensor(*t) for t in tensors],
                   fallback, slot, offsets, outputs_at, [RegionInput(*r) for r in regions],
                   [RegionOutput(*r) for r in output_regions])


def reply_head(seq: int, outcome: Outcome, layout: bytes = b"") -> bytes:
    """REPLY's frame 0: what the daemon's statistics need, without parsing the reply header."""
    return REPLY + _REPLY.pack(seq, outcome.status, outcome.batch, outcome.queue_us, outcome.compute_us,
                               outcome.total_us) + layout


def parse_reply_head(frame: bytes) -> tuple[int, Outcome, bytes]:
    """(seq, outcome, layout JSON or b"") of a REPLY."""
    seq, status, batch, queue_us, compute_us, total_us = _REPLY.unpack_from(frame, 1)
    return seq, Outcome(status, batch, queue_us, compute_us, total_us), frame[REPLY_HEAD:]


def change_to_json(change: Change) -> dict[str, Any]:
    """The fields of `change` that change something (SET)."""
    return {name: value for name, value in asdict(change).items() if value is not None}


def config_to_json(mc: ModelConfig) -> bytes:
    raw = {f.name: getattr(mc, f.name) for f in fields(ModelConfig)}
    raw["engine"] = str(mc.engine)
    raw["options"] = dict(mc.options)
    raw["preferred_batch"] = list(mc.preferred_batch)
    return dumps(raw).encode()


def config_from_json(raw: bytes) -> ModelConfig:
    data = json.loads(raw)
    data["engine"] = Path(data["engine"])
    data["preferred_batch"] = tuple(data["preferred_batch"])
    return ModelConfig(**data)


def specs_to_json(specs: Any) -> list[dict[str, Any]]:
    return [asdict(s) for s in specs]


def specs_from_json(items: list[dict[str, Any]]) -> list[TensorSpec]:
    def shape(value: Any) -> tuple[int, ...] | None:
        return None if value is None else tuple(value)

    return [TensorSpec(i["name"], i["dtype"], tuple(i["shape"]), shape(i.get("min_shape")),
                       shape(i.get("max_shape"))) for i in items]
