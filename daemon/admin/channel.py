"""The admin socket and the stats stream (docs/architecture.md#admin-and-stats), on their own thread.

Admin: a ROUTER on a local ipc socket (mode 0660, group `infermux` when it
exists), one JSON object in, one out. Commands that block (load, drain...)
run on a short-lived thread so `status` keeps answering meanwhile. Every
command that changes the daemon is audited once done: an `admin` event naming the
command, its model, its arguments, its outcome and, on ipc, the peer's uid and pid.

Stats: a PUB socket (an XPUB, to hear subscriptions); topic `snapshot` carries
the whole daemon a few times a second, topic `event` each event as it happens,
each only while some subscriber wants it: with nobody subscribed the thread
sleeps until a command, a subscription or an event wakes it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import zmq

from infermux.transport import ipc
from infermux.transport.peers import PeerGuard
from infermux.admin import snapshot
from infermux.admin.commands import COMMANDS, CommandError, audit
from infermux.config import resolve_endpoint
from infermux.events import Event
from infermux.frontend.recorder import FRAMES

if TYPE_CHECKING:
    from infermux.admin.daemon import Daemon

log = logging.getLogger("infermux.admin")

MAX_REQUEST_BYTES = 64 * 1024
# An admin request is a small object: more brackets than this cannot be one, and counting
# them (bytes.count, in C) is cheaper than letting json.loads recurse into them.
MAX_BRACKETS = 1000
# A request that is not one (bad JSON, unknown command) is answered after this pause: a
# peer sending garbage in a loop holds the GIL a few percent of the time, not all of it.
BAD_REQUEST_PAUSE_S = 0.01
# While nothing happens (no request read, no event, no admin command since the last snapshot) a
# subscriber gets a snapshot this often instead of every `interval_s`: the figures stand still,
# the console's clocks move by the second, and its link stays up (it calls it down after 2 s).
QUIET_SNAPSHOT_S = 1.0
# Connections each of admin.sock and stats.sock takes (consoles, ctl): libzmq aborts when an
# ipc accept meets a full descriptor table, so these listeners are guarded too (peers.py).
MAX_LISTENER_CONNECTIONS = 256


def peer(frame: zmq.Frame) -> dict[str, Any]:
    """uid/gid/pid of an ipc peer: libzmq appends them to Peer-Address ("host:uid:gid:pid")."""
    try:
        address = frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):
        return {}
    if not isinstance(address, str):  # get() is typed for int properties too
        return {}
    parts = address.split(":")
    if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
        return {"uid": int(parts[1]), "gid": int(parts[2]), "pid": int(parts[3])}
    return {"address": ":".join(parts)}


class AdminServer:
    """Owns the admin ROUTER and the stats PUB; both live on this object's thread."""

    def __init__(self, server: "Daemon", interval_s: float = 0.25) -> None:
        self.server = server
        self.interval_s = interval_s
        daemon = server.config.daemon
        self.admin_endpoint = resolve_endpoint(daemon.admin, server.run_dir) if daemon.admin else ""
        self.stats_endpoint = resolve_endpoint(daemon.stats, server.run_dir) if daemon.stats else ""
        self._ctx = server.ctx
        self._done: deque[list[Any]] = deque()  # replies of slow commands, sent by our thread
        self._events: deque[Event] = deque(maxlen=10000)
        # The prefixes subscribers asked for (XPUB tells the first and the last of each); replaced
        # whole, never changed in place: other threads' events read it.
        self._topics: frozenset[bytes] = frozenset()
        self._happened = 0  # events and admin commands so far: with the requests read, what moves a snapshot
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # events and slow commands' replies
        self._wake_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admin", daemon=True)
        self.admin: zmq.Socket | None = None
        self.stats: zmq.Socket | None = None
        self._guards: dict[str, PeerGuard] = {}  # by endpoint

    def start(self) -> None:
        """Bind both sockets and start the thread."""
        if self.admin_endpoint:
            # MAXMSGSIZE before bind: libzmq copies a listener's options when it binds.
            self.admin = self._bind(zmq.ROUTER, self.admin_endpoint, {zmq.MAXMSGSIZE: MAX_REQUEST_BYTES},
                                    group=self.server.config.daemon.admin_group)
        if self.stats_endpoint:
            self.stats = self._bind(zmq.XPUB, self.stats_endpoint)
            self.stats.setsockopt(zmq.SNDHWM, 100)  # a slow console drops snapshots, never blocks us
        self.server.events.subscribe(self._on_event)
        self._thread.start()

    def _on_event(self, event: Event) -> None:
        """An event, from any thread: queued for the stats stream while someone subscribes to it."""
        self._happened += 1  # a lost update under a race only delays one snapshot to the quiet pace
        if self._wants(b"event"):
            self._events.append(event)
            self._ring()

    def _wants(self, topic: bytes) -> bool:
        return any(topic.startswith(prefix) for prefix in self._topics)

    def _ring(self) -> None:
        with self._wake_lock:  # never after `stop` closed it: the number may be another file's by then
            if self._wake >= 0:
                os.eventfd_write(self._wake, 1)

    def _bind(self, kind: int, endpoint: str, options: dict[int, int] | None = None,
              group: str = ipc.GROUP) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        for option, value in (options or {}).items():
            sock.setsockopt(option, value)
        guard = PeerGuard(MAX_LISTENER_CONNECTIONS, self.server.config.daemon.reserved_fds, endpoint,
                          speaks=kind == zmq.ROUTER)  # a console's SUB sends us nothing we read
        guard.attach(self._ctx, sock)  # before bind: every accept
        self._guards[endpoint] = guard
        ipc.prepare(endpoint)
        try:
            with ipc.private_files():  # nobody but us until secure(): admin.sock's group is not the clients'
                sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise RuntimeError(f"cannot bind {endpoint}: {exc}") from None
        ipc.secure(endpoint, group)
        self.server.events.emit("listening", endpoint=endpoint)
        return sock

    def stop(self) -> None:
        self._stop.set()
        self._ring()
        if self._thread.is_alive():
            self._thread.join(2)
        for sock, endpoint in ((self.admin, self.admin_endpoint), (self.stats, self.stats_endpoint)):
            if sock is not None:
                sock.close(0)
                ipc.remove(endpoint)
        for guard in self._guards.values():
            guard.close(1.0)
        if not self._thread.is_alive():
            with self._wake_lock:
                os.close(self._wake)
                self._wake = -1

    # -- the thread --------------------------------------------------------------

    def _run(self) -> None:
        """Serve until stopped, asleep until a command, a subscription, an event or the next snapshot
        a subscriber wants: nothing wakes an idle daemon's admin thread on a timer."""
        poller = self._poller()
        pace = _Pace(self.interval_s)
        while not self._stop.is_set():
            wants = self.stats is not None and self._wants(b"snapshot")
            activity = (self.server.requests, self._happened)
            ready = dict(poller.poll(pace.wait_ms(activity) if wants else None))
            if self._wake in ready:
                self._take_wake()
            if self.admin is not None and self.admin in ready:
                self._answer()
            while self._done and self.admin is not None:
                self.admin.send_multipart(self._done.popleft())
            if self.stats is not None and self.stats in ready:
                self._hear_subscriptions()
            self._publish_events()
            if self.stats is not None and self._wants(b"snapshot") and pace.due((self.server.requests, self._happened)):
                self._publish("snapshot", snapshot.full(self.server))

    def _poller(self) -> zmq.Poller:
        """What the thread waits on: the admin and stats sockets it has, and its wake-up."""
        poller = zmq.Poller()
        for sock in (self.admin, self.stats):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        return poller

    def _answer(self) -> None:
        self._happened += 1
        try:
            self._serve_one()
        except Exception:  # one bad request must not end admin and stats for good
            log.exception("internal error on an admin request; serving on")

    def _take_wake(self) -> None:
        try:
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass

    def _hear_subscriptions(self) -> None:
        """XPUB passes a topic's first subscription (b"\\x01" + prefix) and, once no subscriber is left
        for it, its unsubscription (b"\\x00" + prefix): what the stream must build and send."""
        assert self.stats is not None
        while True:
            try:
                message = self.stats.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if message[:1] == b"\x01":
                self._topics = self._topics | {message[1:]}
            elif message[:1] == b"\x00":
                self._topics = self._topics - {message[1:]}
                if not self._wants(b"event"):
                    self._events.clear()

    def _publish(self, topic: str, body: dict[str, Any]) -> None:
        try:
            self.stats.send_multipart([topic.encode(), json.dumps(body).encode()], zmq.NOBLOCK)  # type: ignore[union-attr]
        except zmq.Again:
            pass

    def _publish_events(self) -> None:
        while self._events:
            event = self._events.popleft()
            if self.stats is not None:
                self._publish("event", event.as_json())

    def _serve_one(self) -> None:
        assert self.admin is not None
        frames = self.admin.recv_multipart(copy=False)
        self._guards[self.admin_endpoint].hear(frames)  # never closed as idle (peers.py)
        split = next((i + 1 for i, f in enumerate(frames) if len(f) == 0), 1)
        envelope = [f.bytes for f in frames[:split]]
        who = peer(frames[-1])
        try:
            request = _parse(frames[split:])
            name = request.get("cmd")
            command = COMMANDS.get(name) if isinstance(name, str) else None
            if command is None:
                raise CommandError(f"unknown command {name!r}; commands: {', '.join(COMMANDS)}")
        except CommandError as exc:
            self.admin.send_multipart(envelope + _reply({"ok": False, "error": str(exc)}))
            self._stop.wait(BAD_REQUEST_PAUSE_S)
            return
        if command.slow:
            threading.Thread(target=self._finish, args=(envelope, command, request, who), daemon=True,
                             name=f"admin-{name}").start()
        else:
            self.admin.send_multipart(envelope + _reply(self._audited(command, request, who)))

    def _finish(self, envelope: list[bytes], command: Any, request: dict[str, Any], who: dict[str, Any]) -> None:
        self._done.append(envelope + _reply(self._audited(command, request, who)))
        self._ring()

    def _audited(self, command: Any, request: dict[str, Any], who: dict[str, Any]) -> dict[str, Any]:
        reply = _execute(self.server, command, request)
        if command.changes:  # after the fact, so the audit says whether it was done
            audit(self.server.events, request, reply, who)
        return reply


class _Pace:
    """When the stats stream's next snapshot is due: `interval_s` after the last while the daemon
    does something (requests read, events, admin commands), QUIET_SNAPSHOT_S while it does not.
    What wakes a quiet daemon (an event, a command) brings the next one to `interval_s` after it
    was seen, not to at once: the burst it begins shows whole, as it did on the steady 4 Hz."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last = -math.inf  # when the last snapshot went
        self._seen: object = None  # the activity it showed
        self._moved = True  # whether that differed from the one before: the daemon is doing something
        self._noticed: float | None = None  # when activity was first seen to differ from `_seen`

    def _next(self, activity: object, now: float) -> float:
        if self._moved:
            return self._last + self.interval_s
        if activity != self._seen:
            if self._noticed is None:
                self._noticed = now
            return min(self._last + QUIET_SNAPSHOT_S, self._noticed + self.interval_s)
        return self._last + QUIET_SNAPSHOT_S

    def wait_ms(self, activity: object) -> int:
        """How long the thread may sleep before the next snapshot (given what it knows now)."""
        now = time.monotonic()
        return max(0, math.ceil((self._next(activity, now) - now) * 1000))

    def due(self, activity: object) -> bool:
        """Whether a snapshot is due now; if so it is taken as sent."""
        now = time.monotonic()
        if now < self._next(activity, now):
            return False
        self._last, self._moved, self._seen, self._noticed = now, activity != self._seen, activity, None
        return True


def _parse(body: list[zmq.Frame]) -> dict[str, Any]:
    if len(body) != 1:
        raise CommandError(f"expected one JSON frame, got {len(body)}")
    raw = body[0].bytes
    if raw.count(b"[") + raw.count(b"{") > MAX_BRACKETS:
        raise CommandError(f"request JSON is nested too deeply (or holds more than {MAX_BRACKETS} brackets)")
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise CommandError(f"request is not JSON: {exc}") from None
    except RecursionError:
        raise CommandError("request JSON is nested too deeply") from None
    if not isinstance(request, dict):
        raise CommandError("request must be a JSON object like {\"cmd\": \"status\"}")
    return request


def _execute(server: "Daemon", command: Any, request: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": True, **command.run(server, request)}
    except CommandError as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # a bug in a command must not kill the admin thread
        log.exception("admin command %r failed", request.get("cmd"))
        return {"ok": False, "error": f"internal error: {exc}"}


def _reply(body: dict[str, Any]) -> list[Any]:
    """The reply's frames: its JSON, then the raw frames a command returned under FRAMES (`record_take`)."""
    frames = body.pop(FRAMES, [])
    return [json.dumps(body, default=str).encode(), *frames]
