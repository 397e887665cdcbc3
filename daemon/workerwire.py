"""The private protocol between the daemon and its worker processes.

Two ZeroMQ ipc pipes per worker, both bound by the daemon in its runtime
directory: `down` (daemon PUSH → worker PULL) and `up` (worker PUSH →
daemon PULL). Every message is multipart; frame 0 names its kind.

daemon → worker
    LOAD   [b"load", config JSON]           load, warm up, then READY or ERROR
    INFER  [b"I", meta JSON, client header, *inline tensors]
           meta: {"s": seq, "slot": name|null, "off": [[offset, nbytes], ...], "r": received_ns,
                  "d": deadline_ns, "fb": fallback|null}
    FORGET [b"F", slot name]                the daemon unlinked that slot: unmap it
    SET    [b"C", JSON]                     contexts / max_batch / batch_delay_us
    EXIT   [b"X"]                           finish what is queued, then exit

worker → daemon
    HELLO  [b"hello", {"pid", "rss"}]       libraries imported, waiting for LOAD
    STAGE  [b"stage", {"state"}]            engine loaded, warming up
    READY  [b"ready", {"inputs", "outputs", "memory_bytes", "row_us", "load_ms"}]
    ERROR  [b"error", {"reason"}]
    REPLY  [b"R", seq, stats, reply header, layout JSON | b"", *inline outputs]
           layout: [[offset, nbytes], ...] of the outputs in the request's slot
    LATE   [b"L", seq]                      past its deadline: the daemon decides (fallback/504)
    BEAT   [b"H", {"ctx": [[queued, in_flight, served], ...]}]
    BYE    [b"bye"]

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

LOAD, INFER, FORGET, SET, EXIT = b"load", b"I", b"F", b"C", b"X"
HELLO, STAGE, READY, ERROR, REPLY, LATE, BEAT, BYE = b"hello", b"stage", b"ready", b"error", b"R", b"L", b"H", b"bye"

_SEQ = struct.Struct("<Q")
# status, batch, queue µs, compute µs, total µs: what the daemon's statistics need
# without parsing the reply header.
_STATS = struct.Struct("<HHqqq")

# Requests whose tensors total at most this many bytes travel inside the
# INFER message instead of a slot (docs/decisions.md has the measurement).
INLINE_MAX_BYTES = int(os.environ.get("INFERMUX_WORKER_INLINE_BYTES", 64 * 1024))

dumps = json.JSONEncoder(separators=(",", ":")).encode


def pack_seq(seq: int) -> bytes:
    return _SEQ.pack(seq)


def unpack_seq(raw: bytes) -> int:
    return _SEQ.unpack(raw)[0]


def pack_stats(status: int, batch: int, queue_us: int, compute_us: int, total_us: int) -> bytes:
    return _STATS.pack(status, batch, queue_us, compute_us, total_us)


def unpack_stats(raw: bytes) -> tuple[int, int, int, int, int]:
    return _STATS.unpack(raw)


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
