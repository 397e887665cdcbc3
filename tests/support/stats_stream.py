"""The daemon's stats stream (its XPUB socket: `event` and `snapshot` messages) as a test reads it."""

from __future__ import annotations

import json
from typing import Any

import zmq

from support.harness import Daemon
from support.polling import eventually


def subscribed(d: Daemon, topic: bytes = b"event") -> zmq.Socket:
    """A SUB on `d`'s stats endpoint for `topic`, returned once the daemon has its subscription: it asks
    for `snapshot` too, after `topic`, and waits for the first (the daemon hears a connection's
    subscriptions in the order they were sent), then drops it. The caller closes it."""
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.setsockopt(zmq.SUBSCRIBE, b"snapshot")
    sock.connect(d.stats_endpoint)
    eventually(lambda: sock.poll(100) and sock.recv_multipart()[0] == b"snapshot", "the first snapshot", 15)
    sock.setsockopt(zmq.UNSUBSCRIBE, b"snapshot")
    return sock


def event_of(sock: zmq.Socket, kind: str) -> dict[str, Any] | None:
    """The first event of `kind` among what `sock` (`subscribed`) holds now; None where none came."""
    while sock.poll(100):
        topic, payload = sock.recv_multipart()[:2]
        if topic == b"event" and (event := json.loads(payload))["kind"] == kind:
            return event
    return None
