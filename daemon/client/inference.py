"""Client library for the inference socket.

    from infermux.client import Client
    reply = Client("ipc:///run/infermux/infer.sock").infer("classifier", {"images": x})
    reply.outputs["probs"], reply.header["timing_us"]

On the same machine, inputs and outputs can stay in shared memory instead
of travelling through the socket (regions.py):

    with SharedMemory.beside(endpoint, 8 << 20) as shm:
        x = shm.ndarray((1, 3, 224, 224), "float32")
        probs = shm.ndarray((1, 1000), "float32", offset=x.nbytes)
        x[:] = frame
        reply = client.infer("classifier", {"images": shm.ref(x)}, output_regions={"probs": shm.ref(probs)})
        # reply.outputs["probs"] is a view on `probs`

`Client` is blocking (a REQ-like exchange on a DEALER socket, so a lost
reply never wedges the socket). `Pipeline` keeps many requests in flight on
one DEALER socket and matches replies by `id`.

A camera frame for a pipeline is a `Frame` (JPEG/PNG bytes, or raw pixels
with their geometry); a bare Frame goes to the input "image":

    reply = client.infer("ocr", Frame.of(bgr_image), key="gate-3")
    reply.header["regions"]

One camera sending frames is a `Stream` (stream.py): at most one frame in
flight, a newer frame replacing one not sent yet.

Both take several endpoints, one daemon each, and then fail over between
them (failover.py):

    with Pipeline(["tcp://box1:5555", "tcp://box2:5555"]) as p: ...

Requests go to the endpoint holding fewest; those an endpoint held when it
stopped answering (its connection broke, or no reply for `failover_s`
while it held some) are resent to another with their `id`s, as are those a
draining daemon refused with 503. A request may then be computed twice (it
is delivered once). When every endpoint is down, the wait for a reply
raises `EndpointsDown` (a TimeoutError naming each endpoint and why) within
`failover_s` of the last one going down. One endpoint keeps the plain
single socket, as before.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import zmq

from infermux.protocol import Frame, Reply, SharedTensor, decode_reply, encode_request
from infermux.transport import ipc
from infermux.client.failover import FAILOVER_S, EndpointsDown, Fleet
from infermux.client.limits import RequestTooLarge, SizeCheck
from infermux.client.shared_memory import SharedMemory, local_view

__all__ = ["AdminClient", "AdminError", "Client", "EndpointsDown", "Frame", "InferError", "NotAdminSocket",
           "Pipeline", "RequestTooLarge", "SharedMemory", "SharedTensor"]

Endpoints = str | Sequence[str]  # one endpoint, or several daemons to fail over between
Inputs = Mapping[str, np.ndarray | SharedTensor | Frame] | Frame  # a bare Frame: the input "image"
FRAME_INPUT = "image"  # a pipeline's input unless its configuration names another


def _inputs(inputs: Inputs) -> Mapping[str, np.ndarray | SharedTensor | Frame]:
    """The inputs as a mapping, each Frame checked (a frame the daemon would refuse is a ValueError here)."""
    named = {FRAME_INPUT: inputs} if isinstance(inputs, Frame) else inputs
    for value in named.values():
        if isinstance(value, Frame):
            value.check()
    return named


class InferError(Exception):
    """A reply whose status is not 200 (raised only with `check=True`)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"{reply.status}: {reply.error}")
        self.reply = reply


class _Dealer:
    """A DEALER socket that speaks REQ's envelope (empty delimiter first)."""

    def __init__(self, endpoint: str, context: zmq.Context | None,
                 curve: Mapping[str, bytes] | None, timeout_s: float | None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._ctx = context or zmq.Context.instance()
        self.socket = self._ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if timeout_s is not None:
            # A DEALER with no connection blocks on send: after a refused handshake (CURVE keys
            # that do not match) libzmq drops the pipe, and the send would wait for ever.
            self.socket.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_s * 1000)))
        for option, value in (curve or {}).items():
            setattr(self.socket, option, value)
        ipc.check_directory(endpoint)  # a socket anyone could have put there is not the daemon's
        self.socket.connect(endpoint)

    def send(self, frames: list[Any], ident: Any = None) -> None:
        copy = sum(len(f) for f in frames) < 1 << 20  # zero-copy only pays from ~1 MiB
        try:
            self.socket.send_multipart([b"", *frames], copy=copy)
        except zmq.Again:
            raise TimeoutError(f"cannot send to {self.endpoint} within {self.timeout_s:.1f} s: no connection "
                               f"(is `infermux serve` running, and do the CURVE keys match?)") from None

    def recv(self, timeout_s: float | None) -> Reply:
        if timeout_s is not None and not self.socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no reply from {self.endpoint} within {timeout_s:.1f} s "
                               f"(is `infermux serve` running?)")
        frames = self.socket.recv_multipart(copy=False)
        if frames and len(frames[0]) == 0:
            frames = frames[1:]
        return decode_reply([f.buffer for f in frames], local_view)

    def forget(self) -> None:
        """Nothing to drop: one socket keeps no request to resend (a stale reply is skipped by id)."""

    def close(self) -> None:
        self.socket.close(0)


def _endpoints(endpoint: Endpoints) -> list[str]:
    return [endpoint] if isinstance(endpoint, str) else list(endpoint)


def _link(endpoint: Endpoints, context: zmq.Context | None, curve: Mapping[str, bytes] | None,
          timeout_s: float | None, failover_s: float) -> _Dealer | Fleet:
    """The plain socket for one endpoint; a Fleet for several."""
    endpoints = _endpoints(endpoint)
    if not endpoints:
        raise ValueError("no endpoint given")
    if len(endpoints) == 1:
        return _Dealer(endpoints[0], context, curve, timeout_s)
    return Fleet(endpoints, context, curve, failover_s)


class Client:
    """Blocking inference calls: one request, one reply.

    `retries`: when no reply comes within `timeout_s`, reconnect on a fresh
    socket and send again, up to this many times. Inference is idempotent,
    and a request written into a connection that then broke (a daemon
    restart) is lost in transit, never seen by the daemon: resending is the
    only way to get it answered.

    `endpoint` may be a list of daemons: each request then goes to the next
    in turn, and to another when one stops answering (module docstring;
    `failover_s` is the silence after which an endpoint is given up).

    A request over the daemon's `max_message_bytes` raises RequestTooLarge
    before it is sent (limits.py): the daemon would drop it unanswered.
    """

    def __init__(self, endpoint: Endpoints, *, timeout_s: float | None = 10.0, retries: int = 0,
                 context: zmq.Context | None = None, curve: Mapping[str, bytes] | None = None,
                 failover_s: float = FAILOVER_S) -> None:
        self._connect = lambda: _link(endpoint, context, curve, timeout_s, failover_s)
        self._dealer = self._connect()
        self._size = SizeCheck(_endpoints(endpoint), context, curve, timeout_s)
        self._ids = itertools.count(1)
        self.timeout_s = timeout_s
        self.retries = retries

    def infer(self, model: str, inputs: Inputs, *, version: str | None = None,
              outputs: Sequence[str] | None = None, timeout_ms: int | None = None,
              key: str | None = None, check: bool = False,
              output_regions: Mapping[str, SharedTensor] | None = None) -> Reply:
        """Send one request and wait for its reply (stale replies are skipped).

        `inputs`: arrays (or SharedTensors, or a pipeline's Frame) by input name; a bare Frame goes
        to the input "image". `key` names the request's source (a camera): queues serve keys in
        turn, and under queue_policy newest_per_key its newer request replaces a waiting one (409).
        `output_regions`: outputs to be written into this process's shared memory
        (`SharedMemory.ref` of the array to fill); the reply's arrays are then views there."""
        inputs = _inputs(inputs)
        for attempt in range(self.retries + 1):
            ident = next(self._ids)
            frames = encode_request(model, inputs, id=ident, version=version, outputs=outputs,
                                    timeout_ms=timeout_ms, key=key, output_regions=output_regions)
            self._size.check(frames)
            try:
                self._dealer.send(frames, ident)
                reply = self._await(ident)
                break
            except TimeoutError:
                if attempt == self.retries:
                    self._dealer.forget()  # a fleet must not resend it when a daemon comes back
                    raise
                self._dealer.close()  # a late reply must not pair with the resent request
                self._dealer = self._connect()
        if check and not reply.ok:
            raise InferError(reply)
        return reply

    def _await(self, ident: int) -> Reply:
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            reply = self._dealer.recv(left)
            if reply.header.get("id") in (ident, None):
                return reply

    def send_raw(self, frames: list[Any]) -> Reply:
        """Send frames exactly as given (tests and fuzzers) and wait for a reply (one endpoint only)."""
        self._dealer.send(frames)
        return self._dealer.recv(self.timeout_s)

    def close(self) -> None:
        self._dealer.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pipeline:
    """Many requests in flight on one DEALER socket, matched by `id`.

        with Pipeline(endpoint) as p:
            ids = [p.submit("mlp", {"features": x}) for x in batch]
            replies = p.gather(ids)

    With several endpoints, requests are spread over them and failed over
    (module docstring); each is still answered once. Its inputs are kept,
    not copied, until it is answered, to be resent: do not change them
    meanwhile. A request over the daemon's `max_message_bytes` raises
    RequestTooLarge in `submit`, unsent: the others on the socket keep theirs.
    """

    def __init__(self, endpoint: Endpoints, *, timeout_s: float | None = 10.0,
                 context: zmq.Context | None = None, curve: Mapping[str, bytes] | None = None,
                 failover_s: float = FAILOVER_S) -> None:
        self._dealer = _link(endpoint, context, curve, timeout_s, failover_s)
        self._size = SizeCheck(_endpoints(endpoint), context, curve, timeout_s)
        self._ids = itertools.count(1)
        self._done: dict[Any, Reply] = {}
        self.in_flight = 0
        self.timeout_s = timeout_s

    def submit(self, model: str, inputs: Inputs, **fields: Any) -> int:
        """Send a request without waiting; returns its id. `inputs` and `fields` (`version`, `key`,
        `timeout_ms`, `outputs`, `output_regions`) as for `Client.infer`."""
        ident = next(self._ids)
        frames = encode_request(model, _inputs(inputs), id=ident, **fields)
        self._size.check(frames)
        self._dealer.send(frames, ident)
        self.in_flight += 1
        return ident

    def next_reply(self) -> Reply:
        """The next reply to arrive, whichever request it answers."""
        reply = self._dealer.recv(self.timeout_s)
        self.in_flight -= 1
        return reply

    def result(self, ident: int) -> Reply:
        """The reply to request `ident`, keeping others that arrive first."""
        while ident not in self._done:
            reply = self.next_reply()
            self._done[reply.header.get("id")] = reply
        return self._done.pop(ident)

    def gather(self, idents: Sequence[int]) -> list[Reply]:
        return [self.result(i) for i in idents]

    def replies(self) -> Iterator[Reply]:
        """Every outstanding reply, in arrival order."""
        while self.in_flight:
            yield self.next_reply()

    @property
    def moved(self) -> int:
        """Requests resent to another endpoint so far (0 with one endpoint)."""
        return self._dealer.moved if isinstance(self._dealer, Fleet) else 0

    def holding(self, endpoint: str) -> frozenset[int]:
        """The ids of the requests waiting on `endpoint` now (several endpoints only)."""
        if not isinstance(self._dealer, Fleet):
            raise ValueError("holding() tells endpoints apart: this Pipeline has one")
        return self._dealer.holding(endpoint)

    def close(self) -> None:
        self._dealer.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AdminError(Exception):
    """The daemon refused an admin command; the message says why."""


class NotAdminSocket(AdminError):
    """The socket answered, but as the inference socket does: the wrong endpoint was given."""


class AdminClient:
    """Talks to the admin socket: one JSON request, one JSON reply.

        AdminClient(endpoint).call("set", model="det_v2", contexts=3)
    """

    def __init__(self, endpoint: str, *, timeout_s: float = 30.0, context: zmq.Context | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._ctx = context or zmq.Context.instance()
        self._socket = self._connect()

    def _connect(self) -> zmq.Socket:
        ipc.check_directory(self.endpoint)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        return sock

    def call(self, cmd: str, check: bool = True, *, timeout_s: float | None = None,
             **args: Any) -> dict[str, Any]:
        """Send a command; raises AdminError on `ok: false` when `check`.

        `timeout_s` overrides the client's for this call. TimeoutError when
        nothing answers in time; NotAdminSocket when the endpoint is another
        of the daemon's sockets (the inference one answers with a status
        header, not `ok`)."""
        return self.call_frames(cmd, check, timeout_s=timeout_s, **args)[0]

    def call_frames(self, cmd: str, check: bool = True, *, timeout_s: float | None = None,
                    **args: Any) -> tuple[dict[str, Any], list[zmq.Frame]]:
        """`call`, for a command that answers with frames after its JSON (`record_take`): (reply, frames)."""
        import json

        wait = self.timeout_s if timeout_s is None else timeout_s
        self._socket.send_multipart([b"", json.dumps({"cmd": cmd, **args}).encode()])
        if not self._socket.poll(int(wait * 1000)):
            # A late reply would pair with the next request: start on a fresh socket.
            self._socket.close(0)
            self._socket = self._connect()
            raise TimeoutError(f"no answer from {self.endpoint} within {wait:.0f} s "
                               f"(is `infermux serve` running?)")
        message = self._socket.recv_multipart(copy=False)
        body = message[1:] if message and not len(message[0]) else message  # after the delimiter
        try:
            reply = json.loads(body[0].bytes) if body else None
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or "ok" not in reply:
            what = "the inference socket" if isinstance(reply, dict) and "status" in reply else "something else"
            raise NotAdminSocket(f"{self.endpoint} is not the admin socket (it answered as {what}); "
                                 f"give the admin socket ([daemon] admin, usually admin.sock)")
        if check and not reply.get("ok"):
            raise AdminError(reply.get("error", "unknown error"))
        return reply, list(body[1:])

    def ping(self, timeout_s: float = 5.0) -> None:
        """Check within `timeout_s` that the daemon answers (TimeoutError if not), before a long command."""
        self.call("status", timeout_s=timeout_s)

    def close(self) -> None:
        self._socket.close(0)

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
