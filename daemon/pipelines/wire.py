"""The client's side of a pipeline request: a frame as one input entry (docs/protocol.md#pipelines-on-the-wire).

An encoded frame is `{"name": "image", "dtype": "uint8", "shape": [nbytes],
"format": "jpeg"}`; a raw one adds `"width"`, `"height"` and `"stride"`
(protocol.Frame, which `infermux.client` takes as an input). These two
send one on a plain socket: the tests and `infermux infer --image` use them.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np
import zmq

from infermux.protocol import Frame, Reply, decode_reply, encode_request

_ids = itertools.count(1)


def encode_frame(model: str, data: bytes | np.ndarray, format: str, *, input: str = "image",
                 width: int | None = None, height: int | None = None, stride: int | None = None,
                 id: Any = None, timeout_ms: int | None = None,
                 outputs: Sequence[str] | None = None, key: str | int | None = None) -> list[Any]:
    """`[header, frame bytes]` of a request sending one frame to pipeline `model`; `key` names
    the stream (camera) it belongs to."""
    frame = Frame(data, format, width=width, height=height, stride=stride)
    return encode_request(model, {input: frame}, id=id, timeout_ms=timeout_ms, outputs=outputs, key=key)


def send_frame(sock: zmq.Socket, model: str, data: bytes | np.ndarray, format: str,
               timeout_s: float = 30.0, **fields: Any) -> Reply:
    """Send one frame on a DEALER socket and wait for its reply (raises TimeoutError)."""
    ident = fields.pop("id", None) or next(_ids)
    sock.send_multipart([b"", *encode_frame(model, data, format, id=ident, **fields)])
    while True:
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no reply from the daemon within {timeout_s} s")
        frames = sock.recv_multipart()
        reply = decode_reply(frames[1:])
        if reply.header.get("id") == ident:  # a late reply to an earlier request is skipped
            return reply
