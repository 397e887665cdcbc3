"""Where the console's data comes from, delivered to the app as Textual messages.

`LiveFeed` subscribes to the daemon's stats PUB socket on its own thread and
sends admin commands on whichever thread calls `call` (the app uses worker
threads, so the UI never waits on the daemon). `StaticFeed` shows snapshots
it is given: a saved `infermux status --json` file, or a test's fixed data.

Snapshots are offered, not queued: the feed keeps only the newest one and
posts `SnapshotReady` when the app has taken the previous, so a console that
falls behind skips snapshots instead of piling them up.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import zmq
from textual.message import Message
from textual.message_pump import MessagePump

from infermux.client import AdminClient


class SnapshotReady(Message):
    """A newer snapshot is waiting in the feed (take it with `Feed.take_snapshot`)."""


class EventsArrived(Message):
    """Daemon events (dicts as on the stats stream's `event` topic), oldest first."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__()
        self.events = events


class LinkChanged(Message):
    """The daemon became reachable (`ok`) or stopped being; `text` says what the operator should know."""

    def __init__(self, ok: bool, text: str) -> None:
        super().__init__()
        self.ok = ok
        self.text = text


@dataclass(frozen=True)
class Endpoints:
    """The daemon's admin ROUTER and stats PUB sockets."""

    admin: str
    stats: str


class Feed(Protocol):
    """What the app needs from a data source."""

    endpoints: Endpoints

    def start(self, target: MessagePump) -> None:
        """Begin posting messages to `target`."""

    def stop(self) -> None:
        """Stop posting; release sockets and threads."""

    def take_snapshot(self) -> dict[str, Any] | None:
        """The newest snapshot not yet taken, else None."""

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Run one admin command and return the reply (`ok` false with `error` on any failure). Blocks."""


class _Offer:
    """The newest snapshot and whether the app has been told about it (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, Any] | None = None
        self._told = False
        self.target: MessagePump | None = None

    def offer(self, snapshot: dict[str, Any]) -> None:
        with self._lock:
            self._latest = snapshot
            tell = not self._told
            self._told = True
        if tell and self.target is not None:
            self.target.post_message(SnapshotReady())

    def take(self) -> dict[str, Any] | None:
        with self._lock:
            latest, self._latest, self._told = self._latest, None, False
        return latest

    def post(self, message: Message) -> None:
        if self.target is not None:
            self.target.post_message(message)


class LiveFeed:
    """Stats stream subscriber and admin client of one running daemon.

    No snapshot for `stall_s` puts the link down: the feed asks the admin
    socket whether the daemon is there at all, says which it is, reopens its
    subscription and keeps retrying every `stall_s` until snapshots flow again.
    """

    def __init__(self, endpoints: Endpoints, *, stall_s: float = 2.0, probe_timeout_s: float = 1.0,
                 call_timeout_s: float = 600.0, backlog: int = 50) -> None:
        self.endpoints = endpoints
        self.stall_s = stall_s
        self.probe_timeout_s = probe_timeout_s
        self.call_timeout_s = call_timeout_s
        self.backlog = backlog  # events fetched from the admin socket on (re)connect
        self._ctx = zmq.Context()
        self._offer = _Offer()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infermux-top-feed", daemon=True)

    def start(self, target: MessagePump) -> None:
        self._offer.target = target
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        self._ctx.term()

    def take_snapshot(self) -> dict[str, Any] | None:
        return self._offer.take()

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        return self._call(cmd, self.call_timeout_s, **args)

    def _call(self, cmd: str, timeout_s: float, **args: Any) -> dict[str, Any]:
        try:
            with AdminClient(self.endpoints.admin, timeout_s=timeout_s, context=self._ctx) as admin:
                return admin.call(cmd, check=False, **args)
        except TimeoutError:
            return {"ok": False, "error": f"daemon not reachable at {self.endpoints.admin} "
                                          f"(no answer within {timeout_s:g} s)"}
        except Exception as exc:  # a console must report, not crash
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    # -- the thread ---------------------------------------------------------------

    def _subscribe(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 64)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoints.stats)
        return sock

    def _run(self) -> None:
        sock = self._subscribe()
        last = time.monotonic()
        up: bool | None = None  # None until the first verdict
        next_probe = last + self.stall_s
        try:
            while not self._stop.is_set():
                if sock.poll(100):
                    snapshot = self._drain(sock)
                    if snapshot is not None:
                        last = time.monotonic()
                        first = not up
                        if first:  # before the snapshot: its tables never show under "connecting …"
                            up = True
                            self._offer.post(LinkChanged(True, f"connected to {self.endpoints.stats}"))
                        self._offer.offer(snapshot)
                        if first:
                            self._backfill()
                    continue
                now = time.monotonic()
                if now - last > self.stall_s and now >= next_probe:
                    up = False
                    self._offer.post(LinkChanged(False, self._diagnose(now - last)))
                    sock.close(0)  # a fresh subscription finds a restarted daemon's new socket file
                    sock = self._subscribe()
                    next_probe = time.monotonic() + self.stall_s
        except zmq.ContextTerminated:
            pass
        finally:
            sock.close(0)

    def _drain(self, sock: zmq.Socket) -> dict[str, Any] | None:
        """Read everything waiting; post events in order and return the newest snapshot."""
        snapshot: bytes | None = None
        events: list[dict[str, Any]] = []
        for _ in range(1000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                continue
            if frames[0] == b"snapshot":
                snapshot = frames[1]
            elif frames[0] == b"event":
                event = _json(frames[1])
                if isinstance(event, dict):
                    events.append(event)
        if events:
            self._offer.post(EventsArrived(events))
        data = _json(snapshot) if snapshot is not None else None
        if isinstance(data, dict) and isinstance(data.get("models"), list):
            return data
        return None

    def _diagnose(self, silent_s: float) -> str:
        reply = self._call("status", self.probe_timeout_s)
        if not reply.get("ok"):
            return f"daemon not reachable at {self.endpoints.admin}, retrying"
        return (f"no statistics from {self.endpoints.stats} for {silent_s:.0f} s "
                f"(the daemon answers on its admin socket), retrying")

    def _backfill(self) -> None:
        """Recent events from before we connected, so the log is not empty after a (re)start."""
        reply = self._call("events", self.probe_timeout_s, limit=self.backlog)
        if reply.get("ok") and reply.get("events"):
            self._offer.post(EventsArrived(list(reply["events"])))


def _json(body: bytes | None) -> Any:
    try:
        return json.loads(body) if body is not None else None
    except ValueError:
        return None


class StaticFeed:
    """Snapshots given by the caller: a saved file, or a test's fixed data. Read-only."""

    def __init__(self, snapshot: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None,
                 source: str = "a saved snapshot") -> None:
        self.endpoints = Endpoints(admin=source, stats=source)
        self._offer = _Offer()
        self._first = snapshot
        self._events = list(events or [])

    @classmethod
    def from_file(cls, path: str | Path) -> "StaticFeed":
        """A file written by `infermux status --json` or saved from the stats stream."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("models"), list) or "daemon" not in data:
            raise ValueError(f"{path}: expected the JSON of `infermux status --json` or a stats snapshot")
        data.setdefault("time", Path(path).stat().st_mtime)
        return cls(data, data.get("events"), source=str(path))

    def start(self, target: MessagePump) -> None:
        self._offer.target = target
        self._offer.post(LinkChanged(True, f"showing {self.endpoints.stats}"))
        if self._events:
            self._offer.post(EventsArrived(self._events))
        if self._first is not None:
            self._offer.offer(self._first)

    def push(self, snapshot: dict[str, Any], events: list[dict[str, Any]] | None = None) -> None:
        """Deliver another snapshot (and events), as the stats stream would."""
        if events:
            self._offer.post(EventsArrived(events))
        self._offer.offer(snapshot)

    def stop(self) -> None:
        self._offer.target = None

    def take_snapshot(self) -> dict[str, Any] | None:
        return self._offer.take()

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        return {"ok": False, "error": f"read-only: this console shows {self.endpoints.stats}, not a daemon"}
