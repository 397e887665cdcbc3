"""One camera's frames to a model or pipeline, the newest frame winning here as in the daemon.

    from infermux.client import Frame, Stream

    with Stream(endpoint, "ocr", key="gate-3") as camera:
        for image in frames_from_the_camera():
            camera.send(Frame.of(image))         # never blocks: replaces a frame not sent yet
            reply = camera.latest()              # the newest reply so far (None before the first)

A camera produces frames whatever the daemon does with them. `send` keeps
at most one request in flight on the stream's own socket: while one is,
the next frame waits here, and a newer frame replaces it (counted in
`replaced`); the moment the reply comes, the frame waiting is sent, its
header saying how many frames of the key were replaced since the last one
(`replaced`, docs/protocol.md#streams), so that the daemon counts them too
(`ctl streams`' CLIENT, the console's Streams view). So a
frame never waits behind older frames of its own camera, on the client
or, with `queue_policy = "newest_per_key"`, in the daemon (docs/protocol.md,
"Streams"). A thread of the stream's own owns the socket, sends and reads
replies; `send` and `latest` only hand over and read.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import zmq

from infermux.client.shared_memory import local_view
from infermux.protocol import MAX_REPLACED, Frame, MalformedReply, Reply, decode_reply, encode_header, encode_request

Input = Frame | np.ndarray | Mapping[str, Any]


@dataclass
class StreamCounts:
    """What a stream did so far."""

    sent: int = 0  # requests sent to the daemon
    replaced: int = 0  # frames given to `send` that a newer one replaced before they were sent
    replies: int = 0  # replies received (of every status)
    served: int = 0  # of those, 200
    timeouts: int = 0  # requests given up after `timeout_s` without a reply


class Stream:
    """A camera's stream of requests with one `key` to `model`; at most one in flight.

    `input` names the input a bare Frame or array goes to (a pipeline's is "image"); a mapping is
    sent as it is. `on_reply(reply)` is called for every reply, on the stream's thread. A request
    unanswered after `timeout_s` is given up (its late reply is ignored) so that the stream goes on.
    """

    def __init__(self, endpoint: str, model: str, key: str, *, input: str = "image", timeout_ms: int | None = None,
                 timeout_s: float = 10.0, context: zmq.Context | None = None,
                 curve: Mapping[str, bytes] | None = None, on_reply: Callable[[Reply], None] | None = None) -> None:
        self.endpoint, self.model, self.key, self.input = endpoint, model, key, input
        self.timeout_ms, self.timeout_s, self.on_reply = timeout_ms, timeout_s, on_reply
        self.counts = StreamCounts()
        self._socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        for option, value in (curve or {}).items():
            setattr(self._socket, option, value)
        self._socket.connect(endpoint)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._waiting: tuple[int, list[Any]] | None = None  # the request to send next: its id and frames
        self._in_flight: tuple[int, float] | None = None  # (id, when sent)
        self._latest: Reply | None = None
        self._unreported = 0  # frames replaced that no request sent has counted yet
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"stream-{model}-{key}", daemon=True)
        self._thread.start()

    # -- the caller's side ----------------------------------------------------------------------

    def send(self, frame: Input) -> int:
        """Send `frame` now if nothing is in flight, else keep it to send next (replacing one kept);
        the request's id (its reply's `id`; the id of a frame replaced before it was sent never comes back)."""
        inputs = frame if isinstance(frame, Mapping) else {self.input: frame}
        for value in inputs.values():
            if isinstance(value, Frame):
                value.check()
        ident = next(self._ids)  # a replaced frame's id is never sent
        frames = encode_request(self.model, inputs, id=ident, key=self.key, timeout_ms=self.timeout_ms)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"stream {self.key!r} is closed")
            if self._waiting is not None:
                self.counts.replaced += 1
                self._unreported += 1
            self._waiting = (ident, frames)
        os.write(self._wake_w, b"x")
        return ident

    def latest(self) -> Reply | None:
        """The newest reply received (whatever its status), None before the first."""
        return self._latest

    def wait(self, timeout_s: float | None = None) -> Reply | None:
        """Wait until nothing is in flight or waiting (every frame sent was answered or replaced);
        the newest reply then. None if `timeout_s` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._answered:
            while self._waiting is not None or self._in_flight is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._answered.wait(left)
            return self._latest

    def close(self) -> None:
        """Stop: what is in flight is not waited for."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._socket.close(0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the stream's thread -----------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._closed:
            in_flight = self._in_flight
            wait_ms = None if in_flight is None else max(0, int((in_flight[1] + self.timeout_s - time.monotonic()) * 1000))
            ready = dict(poller.poll(wait_ms))
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            if self._socket in ready:
                self._receive()
            self._expire()
            self._send_waiting()

    def _receive(self) -> None:
        while self._socket.poll(0):
            frames = self._socket.recv_multipart(copy=False)
            try:
                reply = decode_reply([f.buffer for f in frames[1:]], local_view)
            except MalformedReply:
                continue
            with self._answered:
                if self._in_flight is None or reply.header.get("id") != self._in_flight[0]:
                    continue  # the late reply to a request given up
                self._in_flight = None
                self._latest = reply
                self.counts.replies += 1
                self.counts.served += reply.status == 200
                self._answered.notify_all()
            if self.on_reply is not None:
                self.on_reply(reply)

    def _expire(self) -> None:
        with self._answered:
            if self._in_flight is not None and time.monotonic() - self._in_flight[1] > self.timeout_s:
                self._in_flight = None
                self.counts.timeouts += 1
                self._answered.notify_all()

    def _send_waiting(self) -> None:
        with self._lock:
            if self._in_flight is not None or self._waiting is None:
                return
            (ident, frames), self._waiting = self._waiting, None
            self._in_flight = (ident, time.monotonic())
            self.counts.sent += 1
            replaced = min(self._unreported, MAX_REPLACED)  # a larger backlog goes with the next requests
            self._unreported -= replaced
        if replaced:
            frames = [_with_replaced(frames[0], replaced), *frames[1:]]
        self._socket.send_multipart([b"", *frames], copy=sum(len(f) for f in frames) < 1 << 20)


def _with_replaced(header: bytes, replaced: int) -> bytes:
    """A request's encoded header with its `replaced` count set (a small header: decoded and encoded again)."""
    fields = json.loads(header)
    fields["replaced"] = replaced
    return encode_header(fields)
