"""Recording live traffic: the next N requests' inputs and the answers the serving version gave them.

`infermux record MODEL --count N --out DIR` arms a `Recording` through the
admin socket (`record`), then takes what it has captured (`record_take`)
until it ends, and writes it as plain .npz files (cli/record.py;
docs/hot-swap.md#record-and-replay). `infermux replay` runs those inputs
through another engine and compares.

Both halves run on the frontend thread, which reads every request and sends
every reply: `on_request` copies the inputs of a request for a recorded
model (they are views on ZeroMQ's buffers), `on_reply` pairs a reply with
its request by the client's envelope and the request's `id`, and copies
the outputs. Only answers the model itself gave (200, no fallback) are
kept; a request refused or answered by a fallback makes room for another.
Requests whose outputs go to the client's shared-memory regions, and
requests that cannot be told apart from one still waiting (same connection,
same id), are left out. Without a recording the frontend pays one
dictionary test per request and one truthiness test per reply.

A recording holds at most `[daemon] record_max_bytes` of tensors in all,
inputs and outputs; the request that would pass it ends the recording.
What it captured waits here until taken; a recording nobody takes from
for `ABANDON_S` is dropped.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from infermux.protocol import MalformedReply, Request, decode_reply, dtype_name

ABANDON_S = 30.0
FRAMES = "_frames"  # the key of a command's reply that holds frames to send after its JSON (admin/channel.py)


@dataclass
class Recorded:
    """One recorded request: its inputs, the serving version's outputs and how long it took."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    version: str = ""
    latency_us: int = 0
    when: float = field(default_factory=time.time)
    received_ns: int = field(default_factory=time.perf_counter_ns)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.inputs.values()) + sum(a.nbytes for a in self.outputs.values())


@dataclass
class Progress:
    """How far a recording is: what was asked, kept, is waiting for its answer, was left out; why it ended."""

    count: int
    recorded: int
    waiting: int
    skipped: int
    bytes: int
    max_bytes: int
    ended: str

    def as_json(self) -> dict[str, Any]:
        return {"count": self.count, "recorded": self.recorded, "waiting": self.waiting, "skipped": self.skipped,
                "bytes": self.bytes, "max_bytes": self.max_bytes, "ended": self.ended}


class Recording:
    """The next `count` answered requests for `model`, at most `max_bytes` of tensors."""

    def __init__(self, model: str, count: int, max_bytes: int) -> None:
        self.model, self.count, self.max_bytes = model, count, max_bytes
        self._pending: dict[tuple[Any, ...], Recorded] = {}
        self._done: deque[Recorded] = deque()
        self._lock = threading.Lock()  # the frontend adds, the admin thread takes
        self.recorded = 0  # answers kept
        self.skipped = 0
        self.bytes = 0
        self.ended = ""  # why it ended: "" while it records
        self.last_taken = time.monotonic()

    def wants(self) -> bool:
        return not self.ended and self.recorded + len(self._pending) < self.count

    def on_request(self, key: tuple[Any, ...], request: Request) -> None:
        if request.output_regions or key in self._pending:
            self.skipped += 1
            return
        inputs = {name: np.array(value, copy=True) for name, value in request.inputs.items()}
        entry = Recorded(inputs)
        if not self._fits(entry.nbytes()):
            return
        self._pending[key] = entry

    def on_reply(self, key: tuple[Any, ...], frames: Sequence[Any]) -> None:
        entry = self._pending.pop(key, None)
        if entry is None:
            return
        try:
            reply = decode_reply(frames)
        except MalformedReply:
            reply = None
        if reply is None or reply.status != 200 or reply.header.get("fallback") or reply.header.get("model") not in (
                None, self.model):
            self.bytes -= entry.nbytes()
            self.skipped += 1  # another request takes its place
            return
        entry.outputs = {name: np.array(value, copy=True) for name, value in reply.outputs.items()}
        entry.version = str(reply.header.get("version", ""))
        entry.latency_us = (time.perf_counter_ns() - entry.received_ns) // 1000
        outputs = sum(a.nbytes for a in entry.outputs.values())
        if not self._fits(outputs):
            self.bytes -= entry.nbytes() - outputs
            return
        with self._lock:
            self._done.append(entry)
            self.recorded += 1
        if self.recorded >= self.count:
            self.ended = "done"

    def _fits(self, nbytes: int) -> bool:
        if self.bytes + nbytes > self.max_bytes:
            self.ended = (f"record_max_bytes reached: {self.recorded} requests recorded hold {self.bytes} bytes, "
                          f"the next needs {nbytes} more than the {self.max_bytes} allowed")
            return False
        self.bytes += nbytes
        return True

    def take(self, limit_bytes: int) -> list[Recorded]:
        """What was recorded and not yet taken, up to about `limit_bytes` (at least one entry)."""
        taken: list[Recorded] = []
        size = 0
        with self._lock:
            self.last_taken = time.monotonic()
            while self._done and (not taken or size + self._done[0].nbytes() <= limit_bytes):
                entry = self._done.popleft()
                size += entry.nbytes()
                taken.append(entry)
        return taken

    def finished(self) -> bool:
        """Ended, and everything it recorded was taken."""
        return bool(self.ended) and not self._done

    def progress(self) -> Progress:
        return Progress(self.count, self.recorded, len(self._pending), self.skipped, self.bytes, self.max_bytes,
                        self.ended)


class Recorder:
    """The recordings of one frontend, one per model at most.

    `active` is what the frontend looks at (replaced in one assignment, read without a lock);
    `recordings` also keeps those that ended until what they captured is taken.
    """

    def __init__(self) -> None:
        self.active: dict[str, Recording] = {}
        self.recordings: dict[str, Recording] = {}
        self._lock = threading.Lock()

    def start(self, model: str, count: int, max_bytes: int) -> Recording:
        """Arm a recording of `model`; ValueError if one is there for it already."""
        with self._lock:
            if model in self.recordings:
                raise ValueError(f"{model!r} is being recorded already; wait for it to end, or stop it "
                                 "(admin `record_stop`)")
            recording = Recording(model, count, max_bytes)
            self.recordings = {**self.recordings, model: recording}
            self.active = {**self.active, model: recording}
        return recording

    def get(self, model: str) -> Recording | None:
        return self.recordings.get(model)

    def stop(self, model: str, why: str = "stopped") -> None:
        """End `model`'s recording; what it captured can still be taken."""
        with self._lock:
            recording = self.recordings.get(model)
            if recording is not None:
                recording.ended = recording.ended or why
            self.active = {m: r for m, r in self.active.items() if m != model}

    def forget(self, model: str) -> None:
        """Drop `model`'s recording and whatever it still holds."""
        self.stop(model)
        with self._lock:
            self.recordings = {m: r for m, r in self.recordings.items() if m != model}

    def on_request(self, envelope: Sequence[Any], request: Request) -> None:
        """A request was admitted (the frontend thread): record it if its model is being recorded."""
        recording = self.active.get(request.model)
        if recording is None or not recording.wants():
            return
        recording.on_request(key_of(envelope, request.id), request)
        if recording.ended:
            self.stop(request.model)

    def on_reply(self, frames: Sequence[Any], split: int) -> None:
        """A reply is being sent (the frontend thread): `frames[:split]` is the client's envelope."""
        if not self.active:
            return
        try:
            ident = json.loads(bytes(frames[split])).get("id")
        except (ValueError, AttributeError, IndexError):
            return
        key = key_of(frames[:split], ident)
        for model, recording in list(self.active.items()):
            recording.on_reply(key, frames[split:])
            if recording.ended:
                self.stop(model)

    def expire(self) -> None:
        """A Server tick: drop recordings nobody took from for ABANDON_S."""
        now = time.monotonic()
        for model, recording in list(self.recordings.items()):
            if now - recording.last_taken > ABANDON_S:
                self.forget(model)


def wire(entries: list[Recorded]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Entries as JSON plus one frame per tensor, in the order the JSON lists them (`record_take`)."""
    out: list[dict[str, Any]] = []
    frames: list[Any] = []
    for entry in entries:
        tensors = {}
        for kind, arrays in (("inputs", entry.inputs), ("outputs", entry.outputs)):
            tensors[kind] = [{"name": name, "dtype": dtype_name(a.dtype), "shape": list(a.shape)}
                             for name, a in arrays.items()]
            frames += [np.ascontiguousarray(a).data for a in arrays.values()]
        out.append({**tensors, "version": entry.version, "latency_us": entry.latency_us, "time": entry.when})
    return out, frames


def key_of(envelope: Sequence[Any], ident: Any) -> tuple[Any, ...]:
    """What pairs a reply with its request: the client's envelope and the request's id."""
    return (*(bytes(f) for f in envelope), json.dumps(ident))
