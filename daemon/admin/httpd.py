"""The metrics port's HTTP server: probes and scrapes that no slow or silent client can hold.

Anyone who reaches the port can open connections to it (a pod with
`hostNetwork` and `metrics_host = "0.0.0.0"`: anyone who reaches the node),
and a liveness probe that cannot get in restarts the pod. So:

- one thread serves every connection from a selector, without blocking on
  any: a client that drips its request a byte at a time, or never reads
  the reply, holds a buffer and a descriptor, not a thread;
- each connection has one deadline for the whole exchange, from accept to
  the last byte of the reply (`deadline_s`), not per read;
- there are more slots than probes need (`max_connections`), at most
  `per_peer` from one address; a connection over either bound takes the
  place of the oldest one of that peer (or of all) that has been sending
  its request for `grace_s` without finishing it, and is refused only when
  there is none;
- the exposition, which takes milliseconds to render, is rendered on a
  thread of its own (`slow` routes), so probes are answered at once even
  while scrapes wait or are held.

HTTP/1.0, one request per connection, GET and HEAD only: what Prometheus
and Kubernetes probes send.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Callable

log = logging.getLogger("infermux.metrics")

Reply = tuple[int, str, str]  # status, content type, body


@dataclass(frozen=True)
class Route:
    """What answers one path; `slow` ones (the exposition) are rendered off the serving thread."""

    answer: Callable[[], Reply]
    slow: bool = False


@dataclass(frozen=True)
class HttpLimits:
    """What connections to the port may hold (docs/security.md)."""

    max_connections: int = 64  # a scraper or two and a few probes need a handful
    per_peer: int = 8  # connections from one address at once
    deadline_s: float = 5.0  # accept to the reply's last byte, whatever the client does meanwhile
    grace_s: float = 0.5  # a request unfinished this long may make room for a newcomer
    max_request_bytes: int = 8192  # request line and headers


_serials = itertools.count()


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    accepted: float
    deadline: float
    serial: int = field(default_factory=lambda: next(_serials))  # its entry in the deadline heap
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytes = b""
    state: str = "reading"  # reading -> waiting (a slow route renders) -> writing
    sent: int = 0


@dataclass
class HttpCounts:
    """What the server did to connections that misbehaved or came too many."""

    refused: int = 0
    evicted: int = 0
    timed_out: int = 0


class HttpServer:
    """Serves `routes` on (host, port) from one thread (plus one that renders slow routes)."""

    def __init__(self, host: str, port: int, routes: dict[str, Route], limits: HttpLimits = HttpLimits()) -> None:
        self.routes, self.limits = routes, limits
        self.counts = HttpCounts()
        self._listener = socket.create_server((host, port), backlog=64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._conns: dict[int, _Conn] = {}
        self._deadlines: list[tuple[float, int, int]] = []  # (deadline, fd, the _Conn's serial): a heap
        self._renders: queue.Queue[tuple[_Conn, Route, bool] | None] = queue.Queue()
        self._rendered: queue.SimpleQueue[tuple[_Conn, bytes]] = queue.SimpleQueue()
        self._stopping = False
        self._logged: dict[str, int] = {}
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._renderer = threading.Thread(target=self._render, name="metrics-render", daemon=True)

    def start(self) -> None:
        self._renderer.start()
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._renders.put(None)
        self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(5)
        for conn in list(self._conns.values()):
            self._close(conn)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    # -- the serving thread ------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping:
            # Asleep until a connection, a rendered page, `stop` (the wake socket) or a deadline.
            timeout = max(0.0, self._deadlines[0][0] - time.monotonic()) if self._deadlines else None
            accept = False
            for key, events in self._selector.select(timeout):
                if key.fileobj is self._listener:
                    accept = True
                elif key.fileobj is self._wake_r:
                    self._take_rendered()
                else:
                    self._ready(key.data, events)
            self._expire(time.monotonic())
            if accept:  # after the hang-ups and expiries seen in the same turn: their slots are free
                self._accept()

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: not now; the backlog keeps the rest
                self._warn("accept", "metrics port: cannot accept a connection: %s", exc.strerror)
                return
            peer = str(address[0]) if isinstance(address, tuple) else str(address)
            now = time.monotonic()
            if not self._room_for(peer, now):
                self.counts.refused += 1
                self._warn("refused", "metrics port: refused a connection from %s: %d open (%d from it), none "
                           "of them unfinished for %g s; %d refused so far", peer, len(self._conns),
                           self._from(peer), self.limits.grace_s, self.counts.refused)
                _refuse(sock)
                continue
            sock.setblocking(False)
            conn = _Conn(sock, peer, now, now + self.limits.deadline_s)
            self._conns[sock.fileno()] = conn
            heapq.heappush(self._deadlines, (conn.deadline, sock.fileno(), conn.serial))
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _from(self, peer: str) -> int:
        return sum(1 for c in self._conns.values() if c.peer == peer)

    def _room_for(self, peer: str, now: float) -> bool:
        """Whether a new connection from `peer` fits, after closing the oldest stalled request
        (of that peer when it is the peer's bound that is full) if one must make room."""
        if self._from(peer) >= self.limits.per_peer:
            return self._evict(now, peer)
        if len(self._conns) >= self.limits.max_connections:
            return self._evict(now, None)
        return True

    def _evict(self, now: float, peer: str | None) -> bool:
        stalled = [c for c in self._conns.values() if c.state == "reading" and now - c.accepted >= self.limits.grace_s
                   and (peer is None or c.peer == peer)]
        if not stalled:
            return False
        self.counts.evicted += 1
        self._close(min(stalled, key=lambda c: c.accepted))
        self._warn("evicted", "metrics port: closed a connection from %s that had not finished its request, to "
                   "make room; %d so far", peer or "a client", self.counts.evicted)
        return True

    def _ready(self, conn: _Conn, events: int) -> None:
        if conn.state in ("reading", "waiting") and events & selectors.EVENT_READ:
            self._read(conn)
        elif conn.state == "writing" and events & selectors.EVENT_WRITE:
            self._write(conn)

    def _read(self, conn: _Conn) -> None:
        """What the client sent: its request, or (waiting for a render) more, discarded; or its hang-up."""
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.state != "reading":
            return
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbox.find(b"\n\n")
        if end < 0:
            if len(conn.inbox) > self.limits.max_request_bytes:
                self._respond(conn, _plain(431, "request headers too large"), head=False)
            return
        self._dispatch(conn, bytes(conn.inbox[:end]).decode("latin-1"))

    def _dispatch(self, conn: _Conn, request: str) -> None:
        parts = request.split("\r\n", 1)[0].split("\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._respond(conn, _plain(400, "a request line is METHOD PATH HTTP/1.x"), head=False)
            return
        method, target, _ = parts
        head = method == "HEAD"
        if method not in ("GET", "HEAD"):
            self._respond(conn, _plain(501, f"unsupported method {method[:20]!r}; GET or HEAD"), head=False)
            return
        route = self.routes.get(target.split("?", 1)[0])
        if route is None:
            self._respond(conn, _plain(404, f"served here: {', '.join(self.routes)}"), head)
        elif route.slow:
            conn.state = "waiting"
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)  # a hang-up is still seen
            self._renders.put((conn, route, head))
        else:
            self._respond(conn, _answer(route), head)

    def _respond(self, conn: _Conn, reply: Reply, head: bool) -> None:
        conn.outbox, conn.state = _encode(reply, head), "writing"
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            conn.sent += conn.sock.send(conn.outbox[conn.sent:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.sent >= len(conn.outbox):
            self._close(conn)

    def _take_rendered(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                conn, reply = self._rendered.get_nowait()
            except queue.Empty:
                return
            if conn.state == "waiting" and self._conns.get(conn.sock.fileno()) is conn:
                conn.outbox, conn.state = reply, "writing"
                self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
                self._write(conn)

    def _expire(self, now: float) -> None:
        """Close every connection whose deadline has passed, whatever it was doing."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, fd, serial = heapq.heappop(self._deadlines)
            conn = self._conns.get(fd)
            if conn is not None and conn.serial == serial:
                self.counts.timed_out += 1
                self._close(conn)

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0 and self._conns.get(fd) is conn:
            del self._conns[fd]
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.state = "closed"
        conn.sock.close()

    def _warn(self, kind: str, message: str, *args: object) -> None:
        """The 1st, 2nd, 4th, 8th... of a kind: a flood is seen, never floods the log."""
        count = self._logged.get(kind, 0) + 1
        self._logged[kind] = count
        if count & (count - 1) == 0:
            log.warning(message, *args)

    # -- the render thread -------------------------------------------------------------------

    def _render(self) -> None:
        while True:
            item = self._renders.get()
            if item is None:
                return
            conn, route, head = item
            if conn.state != "waiting" or time.monotonic() >= conn.deadline:
                continue  # closed, or past its deadline, while it waited: not worth rendering
            self._rendered.put((conn, _encode(_answer(route), head)))
            try:
                self._wake_w.send(b"x")
            except OSError:
                return  # stopping


def _refuse(sock: socket.socket) -> None:
    """Tell a connection there is no room (a probe sees a 503, not a reset), then close it."""
    try:
        sock.setblocking(False)
        sock.send(_encode(_plain(503, "too many connections to the metrics port at once; retry"), head=False))
    except OSError:
        pass
    sock.close()


def _answer(route: Route) -> Reply:
    try:
        return route.answer()
    except Exception:  # a bug in a page must not take the port down
        log.exception("metrics port: internal error answering a request")
        return _plain(500, "internal error in infermux (logged)")


def _plain(status: int, text: str) -> Reply:
    return status, "text/plain; charset=utf-8", text + "\n"


def _encode(reply: Reply, head: bool) -> bytes:
    status, content_type, text = reply
    body = text.encode()
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    lines = [f"HTTP/1.0 {status} {phrase}", "Server: infermux", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head else body)
