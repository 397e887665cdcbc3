"""What a client learns of the daemon's size limit before it sends a large request.

libzmq caps each frame the daemon reads at `max_message_bytes` + 64 KiB and
drops a connection whose frame is larger, unread: the request gets no reply,
and every other request pipelined on that connection loses its reply too. So
before a message over 64 KiB (smaller ones are always answered, with 413 at
worst) a client asks each daemon once for its limits (protocol.limits_reply)
and refuses a message over `max_message_bytes` itself, saying so.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import zmq

from infermux.transport.limits import FRAME_SLACK

ASK_TIMEOUT_S = 5.0  # the most one question waits; unanswered, the request is sent and the daemon judges it


class RequestTooLarge(ValueError):
    """A request over the daemon's max_message_bytes, refused before it was sent."""

    def __init__(self, size: int, limit: int, endpoint: str) -> None:
        super().__init__(f"the request is {size} bytes, over the daemon's limit of {limit} bytes (max_message_bytes "
                         f"at {endpoint}); send smaller inputs, put them in shared memory (SharedMemory), or raise "
                         "[daemon] max_message_bytes")
        self.size = size
        self.limit = limit


def message_bytes(frames: Sequence[Any]) -> int:
    """What the daemon counts against max_message_bytes: every frame's bytes."""
    return sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)


def ask_limit(endpoint: str, context: zmq.Context, curve: Mapping[str, bytes] | None, timeout_s: float) -> int | None:
    """The daemon's max_message_bytes at `endpoint`, asked on a connection of its own (so the answer
    never mixes with replies); None when it does not answer in time or does not know the question."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for option, value in (curve or {}).items():
        setattr(sock, option, value)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", b'{"limits":true}'])
        if not sock.poll(int(timeout_s * 1000)):
            return None
        header = json.loads(sock.recv_multipart()[-1])
        limit = header.get("limits", {}).get("max_message_bytes") if isinstance(header, dict) else None
        return limit if isinstance(limit, int) and not isinstance(limit, bool) else None
    except (zmq.ZMQError, ValueError, AttributeError):
        return None
    finally:
        sock.close(0)


class SizeCheck:
    """Refuses a request over the smallest max_message_bytes of `endpoints`, learned on first need."""

    def __init__(self, endpoints: Sequence[str], context: zmq.Context | None, curve: Mapping[str, bytes] | None,
                 timeout_s: float | None) -> None:
        self._endpoints = list(endpoints)
        self._ctx = context or zmq.Context.instance()
        self._curve = curve
        self._wait = min(timeout_s or ASK_TIMEOUT_S, ASK_TIMEOUT_S)
        self._limits: dict[str, int] = {}

    def check(self, frames: Sequence[Any]) -> None:
        """Raise RequestTooLarge if the daemon would not read `frames`, or read them only to refuse them."""
        size = message_bytes(frames)
        if size <= FRAME_SLACK:
            return  # never dropped unread: the daemon answers it, if only with 413
        for endpoint in self._endpoints:
            if endpoint not in self._limits:
                limit = ask_limit(endpoint, self._ctx, self._curve, self._wait)
                if limit is not None:  # unanswered: asked again next time
                    self._limits[endpoint] = limit
        if self._limits:
            endpoint, limit = min(self._limits.items(), key=lambda item: item[1])
            if size > limit:
                raise RequestTooLarge(size, limit, endpoint)
