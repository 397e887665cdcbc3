"""The frontend's sockets, opened: the ROUTER every client talks to, and the shared-memory regions' socket.

The frontend loop (server.py) owns both once they are open; what is set on
them, and how a bind that fails is told to the operator, is here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import zmq

from infermux import config as cfg
from infermux.events import EventLog
from infermux.transport import curve, ipc
from infermux.transport.limits import frame_cap
from infermux.transport.peers import PeerGuard
from infermux.transport.regions import RegionServer, RegionTable
from infermux.transport.wire import Choice, PyzmqWire, Wire, wire_for

RCVHWM = 10000  # requests libzmq queues for the frontend before it drops a peer's messages
SNDHWM = 1000  # replies queued for one peer before its pipe is full (the frontend then drops: peers.py)


def open_router(ctx: zmq.Context, daemon: cfg.DaemonConfig, endpoints: list[str], guard: curve.CurveGuard | None,
                peers: PeerGuard, events: EventLog) -> zmq.Socket:
    """The ROUTER bound to every endpoint in `endpoints`; raises RuntimeError, saying what to do, if
    one cannot be bound."""
    if guard is not None:
        guard.start()  # before any bind: without a ZAP handler libzmq admits every key
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full pipe says EAGAIN (we drop), a gone peer EHOSTUNREACH
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.MAXMSGSIZE, frame_cap(daemon))  # per frame: limits.py
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    sock.setsockopt(zmq.SNDHWM, SNDHWM)
    peers.attach(ctx, sock)  # before bind: every accept (its own thread: peers.py)
    for endpoint in endpoints:
        ipc.prepare(endpoint)
        curve.secure_listener(sock, endpoint, guard, events)
        try:
            with ipc.private_files():
                sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise RuntimeError(f"cannot listen on {endpoint}: {exc}; is another infermux running, "
                               f"or is the directory not writable? (see --runtime-dir)") from None
        ipc.secure(endpoint)
        events.emit("listening", endpoint=endpoint)
    return sock


def open_regions(daemon: cfg.DaemonConfig, run_dir: Path, regions: RegionTable,
                 watch: Callable[[int, Callable[[], bool]], None], events: EventLog) -> RegionServer | None:
    """The socket local clients register shared-memory regions on (regions.py), None where
    `shared_memory` is off; raises RuntimeError, saying what to do, if it cannot listen."""
    path = cfg.regions_path(daemon, run_dir)
    if path is None:
        return None
    try:
        ipc.prepare(f"ipc://{path}")
        server = RegionServer(path, regions, watch, events)
    except OSError as exc:
        raise RuntimeError(f"cannot listen for shared-memory regions on {path}: {exc}; "
                           "set [daemon] shared_memory to another name, or \"\" to turn it off") from None
    events.emit("listening", endpoint=f"unix://{path}", what="shared-memory regions")
    return server


def open_wire(sock: zmq.Socket, choice: Choice, guard: curve.CurveGuard | None,
              daemon: cfg.DaemonConfig) -> tuple[Wire, Choice]:
    """The calls the frontend makes on `sock` (wire.py), and the choice they follow: pyzmq's where a
    stream is keyed by the CURVE client's key, which only pyzmq's calls read off a message."""
    identities = guard is not None and daemon.stream_keys == "bound"
    if identities:
        choice = Choice(False, 'stream_keys = "bound" with CURVE reads each message\'s client key', chosen=True)
    wire = wire_for(sock, choice)
    if isinstance(wire, PyzmqWire):
        wire.identities = identities
    return wire, choice
