"""The private protocol between the daemon and its worker processes.

Two ZeroMQ ipc pipes per worker, both bound by the daemon in its runtime
directory: `down` (daemon PUSH → worker PULL) and `up` (worker PUSH →
daemon PULL), plus the fast lane (lane.py), a socketpair that INFER, REPLY
and LATE take whenever they fit one packet; everything else, and whatever
the lane refuses, goes by the pipes. Every message is multipart; frame 0 is
one kind byte followed by that kind's payload (fewer frames: pyzmq costs a
few µs per frame).

daemon → worker
    LOAD   [b"l" config JSON]               load, warm up, then READY or ERROR
    INFER  [b"I" meta JSON, *inline tensors]
           meta: {"s": seq, "slot": name|null, "off": [[offset, nbytes], ...], "r": received_ns,
                  "d": deadline_ns, "fb": fallback|null, "id", "o": outputs, "k": key, "m": model,
                  "t": [[name, dtype, shape], ...]}: the request as the daemon parsed and checked it
           optional: "oo": where outputs may start in the slot; "rg": [[input index, region token,
           offset, nbytes], ...]: inputs read in a mapped region, not in "off" or the frames;
           "or": [[output name, region token, offset], ...]: outputs to write into a mapped region
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
    REPLY  [b"R" seq+stats (struct) layout JSON | nothing, reply header, *inline outputs]
           layout: [[offset, nbytes], ...] of the outputs in the request's slot (after the
           inputs when the backend computed them there, slotoutputs.py)
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
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from infermux.config import ModelConfig
from infermux.plugins.base import TensorSpec
from infermux.serving.placement import Change

LOAD, INFER, FORGET, SET, EXIT, MAP, UNMAP = b"l", b"I", b"F", b"C", b"X", b"M", b"U"
HELLO, STAGE, READY, ERROR, REPLY, LATE, BEAT, BYE = b"h", b"s", b"r", b"e", b"R", b"L", b"H", b"b"

_SEQ = struct.Struct("<Q")
# seq, status, batch, queue µs, compute µs, total µs: what the daemon's statistics
# need, without parsing the reply header.
_REPLY = struct.Struct("<QHHqqq")
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


def reply_head(seq: int, status: int, batch: int, queue_us: int, compute_us: int, total_us: int,
               layout: bytes = b"") -> bytes:
    return REPLY + _REPLY.pack(seq, status, batch, queue_us, compute_us, total_us) + layout


def parse_reply_head(frame: bytes) -> tuple[tuple[int, int, int, int, int, int], bytes]:
    """((seq, status, batch, queue µs, compute µs, total µs), layout JSON or b"")."""
    return _REPLY.unpack_from(frame, 1), frame[REPLY_HEAD:]


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
