"""One multipart message in or out of a ZeroMQ socket, with plain-int flags.

pyzmq's `recv_multipart` asks `getsockopt(RCVMORE)` after every frame and
`send_multipart` ORs `zmq.SNDMORE` into the flags for every frame but the
last: each is an enum construction in Python (`SocketOption(...)`,
`Flag.__or__`), twelve a request on the frontend's path for a 2-frame
request and a 4-frame reply behind a 2-frame envelope. A received frame
says itself whether more follow (`Frame.more`), and the flags can be ints.
"""

from __future__ import annotations

from typing import Any

import zmq

_SNDMORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)
_BUFFERS = (bytes, memoryview, zmq.Frame)


def recv_frames(sock: zmq.Socket, blocking: bool = True) -> list[zmq.Frame]:
    """The next message's frames, uncopied; raises zmq.Again when not `blocking` and none waits
    (the frames after the first never do: a message arrives whole)."""
    flags = 0 if blocking else _NOBLOCK
    frame = sock.recv(flags, copy=False)
    parts = [frame]
    while frame.more:
        frame = sock.recv(flags, copy=False)
        parts.append(frame)
    return parts


def send_frames(sock: zmq.Socket, frames: list[Any], blocking: bool = True, copy: bool = True) -> None:
    """Queue `frames` as one message; when not `blocking`, raises zmq.Again if the peer's pipe is full
    (libzmq then queues none of it: only the first frame can meet a full pipe). A frame that is not
    a buffer raises TypeError before any is sent: half a message would join the next one."""
    for frame in frames:
        if type(frame) not in _BUFFERS:
            memoryview(frame)  # raises TypeError for what cannot be sent
    flags = 0 if blocking else _NOBLOCK
    more = flags | _SNDMORE
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, more if i < last else flags, copy=copy)
