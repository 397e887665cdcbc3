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
  `per_peer` from one address; a connection over either bound goes to one
  of `reserve` slots kept apart, where it has `grace_s` to send a whole
  request: a probe's (GET /healthz, a few dozen bytes sent at once) is
  answered there and then; a scrape takes a slot of the pool, that of the
  oldest connection unfinished for `grace_s` if none is free; anything
  else is answered 503 and closed. A newcomer to a full reserve takes the
  place of its oldest. So connections re-opened as fast as they are
  dropped, from as many addresses as the attacker likes, never make room
  for each other in the pool (each waits its turn in the reserve), and
  what they cost a probe is a place in a queue `reserve` long that each
  of them leaves within `grace_s`;
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
    grace_s: float = 0.5  # a request unfinished this long may make room; what a reserve slot is held at most
    max_request_bytes: int = 8192  # request line and headers
    reserve: int = 16  # slots beyond the pool for requests sent whole at once (probes), when the pool is full


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
    reserve: bool = False  # in a reserve slot: it has until `accepted + grace_s` to finish its request


@dataclass
class HttpCounts:
    """What the server did to connections that misbehaved or came too many."""

    refused: int = 0
    evicted: int = 0
    timed_out: int = 0
    reserved: int = 0  # requests answered from a reserve slot, the pool being full


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
            reserve = not self._pool_has_room(peer)
            if reserve:
                self._make_reserve_room()
            sock.setblocking(False)
            conn = _Conn(sock, peer, now, now + (self.limits.grace_s if reserve else self.limits.deadline_s),
                         reserve=reserve)
            self._conns[sock.fileno()] = conn
            heapq.heappush(self._deadlines, (conn.deadline, sock.fileno(), conn.serial))
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._read(conn)  # a probe's request is often there already: answered before the next newcomer

    def _from(self, peer: str) -> int:
        return sum(1 for c in self._conns.values() if c.peer == peer and not c.reserve)

    def _pool_has_room(self, peer: str) -> bool:
        """Whether a slot of the pool is free for `peer` (its own bound and the pool's)."""
        return self._from(peer) < self.limits.per_peer and \
            sum(1 for c in self._conns.values() if not c.reserve) < self.limits.max_connections

    def _make_reserve_room(self) -> None:
        """Close the oldest connection in a reserve slot if all of them are taken (503: a probe's
        client retries), so that a newcomer always gets one."""
        held = [c for c in self._conns.values() if c.reserve and c.state == "reading"]
        if len(held) < self.limits.reserve:
            return
        self._refuse_reserved(min(held, key=lambda c: c.accepted), "a newer one needed its reserve slot")

    def _refuse_reserved(self, conn: _Conn, why: str) -> None:
        self.counts.refused += 1
        self._warn("refused", "metrics port: refused a connection from %s: the pool is full (%d open, %d from "
                   "it) and %s; %d refused so far", conn.peer, len(self._conns), self._from(conn.peer), why,
                   self.counts.refused)
        self._selector.unregister(conn.sock)
        del self._conns[conn.sock.fileno()]
        conn.state = "closed"
        _refuse(conn.sock)

    def _promote(self, conn: _Conn, now: float, evict: bool) -> bool:
        """Move `conn` from a reserve slot into the pool: a free slot, or (`evict`: it sent a whole
        request) that of the oldest request unfinished for `grace_s`, of its peer when it is the peer's
        bound that is full. False if none. One still unfinished itself never evicts: re-opened as fast
        as they are dropped, such connections would only ever make room for each other."""
        if not self._pool_has_room(conn.peer):
            if not evict:
                return False
            peer = conn.peer if self._from(conn.peer) >= self.limits.per_peer else None
            if not self._evict(now, peer):
                return False
        conn.reserve, conn.deadline = False, conn.accepted + self.limits.deadline_s
        heapq.heappush(self._deadlines, (conn.deadline, conn.sock.fileno(), conn.serial))
        return True

    def _evict(self, now: float, peer: str | None) -> bool:
        stalled = [c for c in self._conns.values() if c.state == "reading" and not c.reserve
                   and now - c.accepted >= self.limits.grace_s and (peer is None or c.peer == peer)]
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
        if conn.reserve and (route is None or not route.slow):
            self.counts.reserved += 1  # answered at once, small: the slot is free again by the return
        elif conn.reserve and not self._promote(conn, time.monotonic(), evict=True):
            self._respond(conn, _plain(503, "too many connections to the metrics port at once; retry"), head)
            return
        if route is None:
            self._respond(conn, _plain(404, f"served here: {', '.join(self.routes)}"), head)
        elif route.slow:
            conn.state = "waiting"
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)  # a hang-up is still seen
            self._renders.put((conn, route, head))
        else:
            self._respond(conn, _answer(route), head)

    def _respond(self, conn: _Conn, reply: Reply, head: bool) -> None:
        conn.outbox, conn.state = _rendered(lambda: reply, head), "writing"
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
        """Close every connection whose deadline has passed, whatever it was doing; one whose reserve
        slot's time is up goes into the pool if there is room there, else it is refused."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, fd, serial = heapq.heappop(self._deadlines)
            conn = self._conns.get(fd)
            if conn is None or conn.serial != serial or (not conn.reserve and conn.deadline > now):
                continue  # gone, or promoted into the pool since (its own entry is further on)
            if conn.reserve and conn.state == "reading":
                if not self._promote(conn, now, evict=False):
                    self._refuse_reserved(conn, f"it sent no whole request within {self.limits.grace_s:g} s")
            else:
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
            self._rendered.put((conn, _rendered(lambda: _answer(route), head)))
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


def _rendered(answer: Callable[[], Reply], head: bool) -> bytes:
    """The bytes of an answer; a 500 for this request when building or encoding it fails (text a
    client sent that UTF-8 cannot carry), so that the thread lives on to answer the next one."""
    try:
        return _encode(answer(), head)
    except Exception:
        log.exception("metrics port: internal error encoding an answer")
        return _encode(_plain(500, "internal error in infermux (logged)"), head)


def _plain(status: int, text: str) -> Reply:
    return status, "text/plain; charset=utf-8", text + "\n"


def _encode(reply: Reply, head: bool) -> bytes:
    status, content_type, text = reply
    body = text.encode()
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    lines = [f"HTTP/1.0 {status} {phrase}", "Server: infermux", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head else body)
