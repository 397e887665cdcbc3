"""The `zmq` sink: a PUB socket; each event on topic `<key>/<type>`, each frame's result on `<key>/result`.

PUB has no acknowledgement: an event is delivered once libzmq took it. A
subscriber that is slow or absent loses messages past the high-water mark
(`hwm`), as PUB does; the socket never blocks the daemon.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any, Mapping

import zmq

from infermux.plugins.sinks.base import OutEvent, SinkConfigError, SinkDown, SinkInUse, bounded, known, option, topic_key

KIND = "zmq"
OPTIONS = {"bind", "results", "hwm"}


class ZmqSink:
    """A PUB socket bound to `bind` (tcp:// or ipc://)."""

    immediate = True  # deliver never blocks: the hub may hand it an event on the thread that made it

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        known(KIND, options, OPTIONS)
        bind = option(KIND, options, "bind", str, "")
        if not bind.startswith(("tcp://", "ipc://")):
            raise SinkConfigError(KIND, f"option 'bind' must be a tcp:// or ipc:// endpoint, got {bind!r}", "bind")
        option(KIND, options, "results", bool, False)
        bounded(KIND, "hwm", option(KIND, options, "hwm", int, 10000), 1, 1 << 24)

    @staticmethod
    def probe(options: Mapping[str, Any], timeout_s: float) -> str:
        """A tcp:// address is bound once and let go; an ipc:// one only looked at, since binding it would
        take the path from the daemon that holds it."""
        ZmqSink.check(options)
        bind = str(options["bind"])
        if bind.startswith("ipc://"):
            path = Path(bind[len("ipc://"):])
            if path.exists():
                raise SinkInUse(f"{path} exists: the running daemon's socket, or one left over")
            if not os.access(path.parent, os.W_OK | os.X_OK):
                raise SinkDown(f"cannot make {path}: this user may not write {path.parent}")
            return f"{bind} can be bound"
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.PUB)
        try:
            sock.bind(bind)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SinkInUse(f"{bind} is in use: the running daemon's, or another program's") from None
            raise SinkDown(f"cannot bind {bind}: {exc}") from None
        finally:
            sock.close(linger=0)
        return f"{bind} can be bound"

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        self.check(options)
        self.bind = str(options["bind"])
        self.results = bool(options.get("results", False))
        self._lock = threading.Lock()  # the sink's thread sends events, the pipelines' threads results
        self._ctx: zmq.Context = zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._hwm = int(options.get("hwm", 10000))
        try:  # bound now, so that subscribers connect before the first event; else on the first delivery
            self._socket()
        except SinkDown:
            pass

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            sock = self._ctx.socket(zmq.PUB)
            sock.setsockopt(zmq.SNDHWM, self._hwm)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.bind(self.bind)
            except zmq.ZMQError as exc:
                sock.close()
                raise SinkDown(f"cannot bind {self.bind}: {exc}") from None
            self._sock = sock
        return self._sock

    def deliver(self, events: list[OutEvent]) -> int:
        """Publish each event (never blocking: past the high-water mark libzmq drops, as PUB does)."""
        with self._lock:
            sock = self._socket()
            for event in events:
                topic = f"{topic_key(event.key)}/{event.type}".encode()
                try:
                    sock.send_multipart([topic, event.data], flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a PUB socket at its high-water mark: that subscriber loses it
        return len(events)

    def result(self, key: str, payload: bytes) -> None:
        """A frame's result on `<key>/result`, when `results = true`."""
        if not self.results:
            return
        with self._lock:
            try:
                self._socket().send_multipart([f"{topic_key(key)}/result".encode(), payload], flags=zmq.NOBLOCK)
            except (zmq.Again, SinkDown):
                pass

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None
