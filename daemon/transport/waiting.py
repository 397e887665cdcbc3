"""Whether a message waits on a ZeroMQ socket, asked without trying to receive one.

The frontend and a worker's I/O thread ask this once or twice a request
(inline.py's limits depend on it, and a burst of reads stops on it). A
receive that finds nothing raises zmq.Again, whose construction (strerror,
an import inside pyzmq) showed in the frontend's profile at concurrency 1;
and `getsockopt(zmq.EVENTS) & zmq.POLLIN` goes through enum conversions that
a call with plain ints skips (docs/performance.md has the figures).
"""

from __future__ import annotations

import zmq

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


def message_waiting(sock: zmq.Socket) -> bool:
    """True if `sock` has a message ready to receive now."""
    events = sock.get(_EVENTS)  # an int for this option
    return isinstance(events, int) and bool(events & _POLLIN)
