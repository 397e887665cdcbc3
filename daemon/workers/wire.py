"""The private protocol between the daemon and its worker processes: every message, typed.

Two ZeroMQ ipc pipes per worker, both bound by the daemon in its runtime
directory: `down` (daemon PUSH → worker PULL) and `up` (worker PUSH →
daemon PULL), plus the fast lane (lane.py), a socketpair that INFER, REPLY,
LATE and SET take whenever they fit one packet (SET there so that requests
sent after it find it applied); everything else, and whatever the lane
refuses, goes by the pipes. Every message is multipart; frame 0 is one kind
byte followed by that kind's payload (fewer frames: pyzmq costs a few µs
per frame), and INFER and REPLY carry tensors in the frames after it.

Each kind is a dataclass below, defined here once for both sides:
`message.encode()` is its frame 0, and `decode(frame)` turns any frame 0
back into its dataclass, or raises `MalformedMessage`, which says what did
not decode. The receiving side's reaction to one is its own: the daemon
logs it and stops that worker (the next request starts another), the
worker logs it (and answers a LOAD it cannot read with ERROR).

daemon → worker
    Load    [b"l" {"config", "shapes"}]      load, warm up (at the shapes its pipelines send too), then
                                             READY or ERROR
    Infer   [b"I" JSON array, *inline tensors]
                                             one request as the daemon parsed and checked it, and
                                             where its tensors are (its fields, in order)
    Forget  [b"F" slot name]                 the daemon unlinked that slot: unmap it
    Map     [b"M" region token] + fd         a client's shared-memory region (regions.py), lane only
    Unmap   [b"U" region token]              that client let go of it
    Set     [b"C" JSON]                      a placement.Change: contexts / max_batch / batch_delay_us /
                                             preferred_batch (the fields that change)
    Exit    [b"X"]                           finish what is queued, then exit

worker → daemon
    Hello   [b"h" {"pid", "rss"}]            libraries imported, waiting for LOAD
    Stage   [b"s" {"state", "backend"}]      engine loaded, warming up
    Ready   [b"r" {"inputs", "outputs", "memory_bytes", "row_us", "backend", "load_ms", "allowed"}]
                                             warmed up: the engine's tensors, footprint, compute per row
    Error   [b"e" {"reason", "during"}]      the load or warm-up failed
    Reply   [b"R" seq + Outcome (struct) + places JSON | nothing, reply header, *inline outputs]
            places: [[offset, nbytes], ...] of the outputs in the request's slot (after the
            inputs when the backend computed them there, workers/slotoutputs.py)
    Late    [b"L" seq]                       past its deadline: the daemon decides (fallback/504)
    Beat    [b"H" {"ctx": [[queued, in_flight, served], ...]}]
                                             heartbeat, with each context's queue
    Bye     [b"b"]                           exiting after EXIT

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
from typing import Any, ClassVar, Sequence, TypeVar

from infermux.config import ModelConfig
from infermux.plugins.base import TensorSpec
from infermux.protocol import Request, dtype_name
from infermux.execution.job import Outcome
from infermux.execution.placement import Change
from infermux.models.hot import WarmShape

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


class MalformedMessage(ValueError):
    """A frame that is no message of this protocol: unknown kind, or a payload that does not decode.

    Both sides run the same code, so it means a bug or a corrupted process, never a client's doing."""


M = TypeVar("M", bound="Message")


class Message:
    """One message: `KIND` is its first byte, `encode()` its frame 0, `decode(frame)` the way back."""

    __slots__ = ()
    KIND: ClassVar[bytes]

    def encode(self) -> bytes:
        raise NotImplementedError

    @classmethod
    def decode(cls: type[M], frame: bytes) -> M:
        """The message in `frame` (of this kind); ValueError, TypeError or KeyError where it does
        not decode (the module's `decode` turns those into MalformedMessage)."""
        raise NotImplementedError


def _json(frame: bytes) -> dict[str, Any]:
    body = json.loads(frame[1:])
    if not isinstance(body, dict):
        raise TypeError(f"expected a JSON object, got {type(body).__name__}")
    return body


def _text(frame: bytes) -> str:
    if len(frame) < 2:
        raise ValueError("no payload")
    return bytes(frame[1:]).decode()


def _only(frame: bytes) -> None:
    if len(frame) != 1:
        raise ValueError(f"{len(frame) - 1} unexpected payload bytes")


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
class Infer(Message):
    """INFER: one request, as the daemon parsed and checked it, and where its tensors are.

    Its inputs are in the slot at `offsets` (one [offset, nbytes] per copied input), or
    else in the message's frames, in order; those in `regions` in neither.
    """

    KIND: ClassVar[bytes] = INFER
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


@dataclass(frozen=True, slots=True)
class Load(Message):
    """LOAD: the configuration of the version to load (max_queue and strategy as the daemon set them),
    and the shapes its pipelines send it, to warm it at (pipelines/warmshapes.py)."""

    KIND: ClassVar[bytes] = LOAD
    config: ModelConfig
    shapes: tuple[WarmShape, ...] = ()

    def encode(self) -> bytes:
        mc = self.config
        raw = {f.name: getattr(mc, f.name) for f in fields(ModelConfig)}
        raw["engine"] = str(mc.engine)
        raw["options"] = dict(mc.options)
        raw["preferred_batch"] = list(mc.preferred_batch)
        raw["versions"] = list(mc.versions)
        return LOAD + dumps({"config": raw, "shapes": [asdict(s) for s in self.shapes]}).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Load":
        message = _json(frame)
        data = message["config"]
        data["engine"] = Path(data["engine"])
        data["preferred_batch"] = tuple(data["preferred_batch"])
        data["versions"] = tuple(data["versions"])
        shapes = tuple(WarmShape(s["input"], tuple(s["shape"]), s["dtype"], s["why"]) for s in message["shapes"])
        return cls(ModelConfig(**data), shapes)


@dataclass(frozen=True, slots=True)
class Forget(Message):
    """FORGET: the daemon unlinked shared-memory slot `slot`; the worker unmaps it."""

    KIND: ClassVar[bytes] = FORGET
    slot: str

    def encode(self) -> bytes:
        return FORGET + self.slot.encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Forget":
        return cls(_text(frame))


@dataclass(frozen=True, slots=True)
class Map(Message):
    """MAP: a client's region, its fd beside the message on the lane (SCM_RIGHTS)."""

    KIND: ClassVar[bytes] = MAP
    region: str  # the region's token (regions.py)

    def encode(self) -> bytes:
        return MAP + self.region.encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Map":
        return cls(_text(frame))


@dataclass(frozen=True, slots=True)
class Unmap(Message):
    """UNMAP: the client let go of region `region`; the worker does too."""

    KIND: ClassVar[bytes] = UNMAP
    region: str

    def encode(self) -> bytes:
        return UNMAP + self.region.encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Unmap":
        return cls(_text(frame))


@dataclass(frozen=True, slots=True)
class Set(Message):
    """SET: settings changed live (admin `set`, reload); only the fields that change travel."""

    KIND: ClassVar[bytes] = SET
    change: Change

    def encode(self) -> bytes:
        return SET + dumps({name: value for name, value in asdict(self.change).items()
                            if value is not None}).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Set":
        return cls(Change.of(_json(frame)))


@dataclass(frozen=True, slots=True)
class Exit(Message):
    """EXIT: finish what is queued, say BYE, exit."""

    KIND: ClassVar[bytes] = EXIT

    def encode(self) -> bytes:
        return EXIT

    @classmethod
    def decode(cls, frame: bytes) -> "Exit":
        _only(frame)
        return cls()


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """HELLO: a worker started, imported its libraries, and waits for LOAD."""

    KIND: ClassVar[bytes] = HELLO
    pid: int
    rss: int  # its resident memory now: what any worker costs before it loads a model

    def encode(self) -> bytes:
        return HELLO + dumps({"pid": self.pid, "rss": self.rss}).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Hello":
        body = _json(frame)
        return cls(_int(body["pid"]), _int(body["rss"]))


@dataclass(frozen=True, slots=True)
class Stage(Message):
    """STAGE: the engine is loaded and warming up."""

    KIND: ClassVar[bytes] = STAGE
    state: str
    backend: str

    def encode(self) -> bytes:
        return STAGE + dumps({"state": self.state, "backend": self.backend}).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Stage":
        body = _json(frame)
        return cls(_str(body["state"]), _str(body["backend"]))


@dataclass(frozen=True, slots=True)
class Ready(Message):
    """READY: warmed up and serving; what the daemon's proxy and views need of the engine."""

    KIND: ClassVar[bytes] = READY
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    memory_bytes: int  # the engine's own figure
    row_us: float  # compute per input row, from the warm-up
    backend: str
    load_ms: int  # the engine's load and warm-up, in the worker
    allowed: bool  # whether its tensors let requests merge into batches (batchcap.py)

    def encode(self) -> bytes:
        return READY + dumps({"inputs": [asdict(s) for s in self.inputs], "outputs": [asdict(s) for s in self.outputs],
                              "memory_bytes": self.memory_bytes, "row_us": self.row_us, "backend": self.backend,
                              "load_ms": self.load_ms, "allowed": self.allowed}).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Ready":
        body = _json(frame)
        return cls(_specs(body["inputs"]), _specs(body["outputs"]), _int(body["memory_bytes"]),
                   float(body["row_us"]), _str(body["backend"]), _int(body["load_ms"]), bool(body["allowed"]))


@dataclass(frozen=True, slots=True)
class Error(Message):
    """ERROR: the load or warm-up failed; `during` says which, `reason` why."""

    KIND: ClassVar[bytes] = ERROR
    reason: str
    during: str

    def encode(self) -> bytes:
        return ERROR + dumps({"reason": self.reason, "during": self.during}).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Error":
        body = _json(frame)
        return cls(_str(body["reason"]), _str(body["during"]))


@dataclass(frozen=True, slots=True)
class Reply(Message):
    """REPLY's frame 0: the request it answers and the figures the daemon's statistics need,
    without parsing the reply header, which follows as frame 1. The outputs follow it as
    frames, or lie in the request's slot at `places` ([offset, nbytes] each)."""

    KIND: ClassVar[bytes] = REPLY
    seq: int
    outcome: Outcome
    places: list[list[int]] | None = None

    def encode(self) -> bytes:
        outcome = self.outcome
        head = REPLY + _REPLY.pack(self.seq, outcome.status, outcome.batch, outcome.queue_us, outcome.compute_us,
                                   outcome.total_us)
        return head if self.places is None else head + dumps(self.places).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Reply":
        seq, status, batch, queue_us, compute_us, total_us = _REPLY.unpack_from(frame, 1)
        places = frame[REPLY_HEAD:]
        return cls(seq, Outcome(status, batch, queue_us, compute_us, total_us),
                   [[_int(offset), _int(nbytes)] for offset, nbytes in json.loads(places)] if places else None)


@dataclass(frozen=True, slots=True)
class Late(Message):
    """LATE: request `seq` passed its deadline in the worker's queue, uncomputed."""

    KIND: ClassVar[bytes] = LATE
    seq: int

    def encode(self) -> bytes:
        return LATE + _SEQ.pack(self.seq)

    @classmethod
    def decode(cls, frame: bytes) -> "Late":
        return cls(_SEQ.unpack_from(frame, 1)[0])


@dataclass(frozen=True, slots=True)
class Beat(Message):
    """BEAT: the worker is alive; each execution context's (queued, in_flight, served)."""

    KIND: ClassVar[bytes] = BEAT
    contexts: list[tuple[int, int, int]]

    def encode(self) -> bytes:
        return BEAT + dumps({"ctx": self.contexts}).encode()

    @classmethod
    def decode(cls, frame: bytes) -> "Beat":
        return cls([(_int(queued), _int(running), _int(served)) for queued, running, served in _json(frame)["ctx"]])


@dataclass(frozen=True, slots=True)
class Bye(Message):
    """BYE: the worker finished what it held after EXIT and exits."""

    KIND: ClassVar[bytes] = BYE

    def encode(self) -> bytes:
        return BYE

    @classmethod
    def decode(cls, frame: bytes) -> "Bye":
        _only(frame)
        return cls()


_KINDS: dict[bytes, type[Message]] = {cls.KIND: cls for cls in (
    Load, Infer, Forget, Map, Unmap, Set, Exit, Hello, Stage, Ready, Error, Reply, Late, Beat, Bye)}


def kind_of(frame: bytes) -> bytes:
    """The kind byte of a message's frame 0."""
    return bytes(frame[:1])


def decode(frame: bytes) -> Message:
    """The message whose frame 0 is `frame`; MalformedMessage naming the kind and the fault."""
    kind = kind_of(frame)
    cls = _KINDS.get(kind)
    if cls is None:
        raise MalformedMessage(f"unknown message kind {kind!r}" if kind else "an empty message")
    try:
        return cls.decode(frame)
    except (ValueError, TypeError, KeyError, IndexError, struct.error) as exc:
        raise MalformedMessage(f"{cls.__name__.upper()} does not decode: {type(exc).__name__}: {exc}") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _specs(items: Sequence[dict[str, Any]]) -> list[TensorSpec]:
    def shape(value: Any) -> tuple[int, ...] | None:
        return None if value is None else tuple(value)

    return [TensorSpec(_str(i["name"]), _str(i["dtype"]), tuple(i["shape"]), shape(i.get("min_shape")),
                       shape(i.get("max_shape"))) for i in items]
