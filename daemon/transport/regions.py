"""Shared memory for tensors: a local client hands the daemon sealed memory, requests point into it.

A camera pipeline on the same box need not push every frame through the
socket: it registers a region of its own memory once, writes frames into
it, and each request names a region and an offset for an input instead of
sending its bytes (Triton's "system shared memory" extension does the
same). Hot models read the inputs where they lie; cold workers map the
same region, so a 4.9 MB tensor crosses no process boundary by copy. A
request may also name regions for its outputs (`output_regions`): the
daemon, or the worker, writes them there when they fit, and the reply
says where they are instead of carrying them.

Regions are memfds passed as file descriptors, not names in /dev/shm
(docs/decisions.md):
- the daemon accepts only a memfd sealed against shrinking (F_SEAL_SHRINK),
  so its owner cannot truncate it under a read: with a named segment that
  would be SIGBUS, and the daemon would die mid-request;
- there is no file to name, guess or leave behind, and no permissions but
  the registration socket's own (mode 0660, like the inference socket);
- a region lives as long as the connection that registered it: a client
  that exits or crashes takes its regions with it.

Registration, one JSON object per SOCK_SEQPACKET packet on the socket
`[daemon] shared_memory` (default `regions.sock` in the runtime directory):

    → {"op": "register", "name": "cam0"}  with the fd as SCM_RIGHTS
    ← {"ok": true, "region": "<token>", "bytes": N}   or   {"ok": false, "error": "..."}
    → {"op": "unregister", "region": "<token>"}
    ← {"ok": true}

The token is random: a request can name only regions its client was told
of. Inputs then carry `"region": token, "offset": bytes` in the request
header and have no frame; `"output_regions": {name: {"region", "offset"}}`
asks for outputs there, and their entries in the reply header carry the
same two fields and no frame (protocol.py). A memfd sealed against writes
(F_SEAL_WRITE) is mapped read-only: it takes inputs, not outputs.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import select
import socket
import time
from pathlib import Path
from typing import Any, Callable

from infermux.events import Throttle
from infermux.transport import ipc
from infermux.transport.mappings import MappedRegions as MappedRegions
from infermux.transport.mappings import RegionTable, map_memfd
from infermux.transport.peers import SILENT_GRACE_S

log = logging.getLogger("infermux.regions")

MAX_CLIENTS = 64
MAX_REGIONS_PER_CLIENT = 64
# Each region holds a descriptor in the daemon (to hand to workers); the bound keeps
# clients from spending the daemon's RLIMIT_NOFILE (1024 under systemd by default).
MAX_REGIONS = 256
_PACKET = 4096
# A connection whose packet was refused (bad JSON, an unknown op, a region it does not own) is not
# read again for this long: a loop of bad packets then costs the frontend thread, which serves this
# socket between requests, a few percent of its time instead of all of it.
BAD_PACKET_PAUSE_S = 0.01
# Good packets are paced too, by a bucket per connection: a client registers its regions at once
# (up to MAX_REGIONS_PER_CLIENT, and as many unregistrations), then rarely; a loop of them runs at
# PACKETS_PER_S. Each registration maps and unmaps memory on the frontend thread (~12,000 a second
# in a loop used to raise the other clients' p99 five-fold).
PACKET_BURST = 2 * MAX_REGIONS_PER_CLIENT
PACKETS_PER_S = 100.0
# A connection that holds no region and whose last this many packets were all refused is told so
# and closed: it takes a slot of MAX_CLIENTS and does nothing with it. Before that, when all the
# slots are taken, one whose last packet was refused (and that holds no region) makes room for a
# newcomer at once, as a silent one does after SILENT_GRACE_S: peers that keep sending refused
# packets can no longer keep a client that registers out.
MAX_REFUSED_IN_A_ROW = 8
# A newcomer that finds every slot taken by connections not yet to be closed (silent for less than
# SILENT_GRACE_S, their packets not refused) waits this long, unread, for one of them to be; up to
# MAX_PARKED at once. Peers closed together and re-opened together have all slots young for a moment.
PARK_S = 1.0
MAX_PARKED = 16
# accept() errors that say "not now", not "closed": the socket stays watched (a full
# descriptor table must not end registrations for good).
_TRANSIENT_ACCEPT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO}

Watch = Callable[[int, Callable[[], bool]], None]


class RegionServer:
    """The registration socket; every handler runs on the frontend thread (Server.watch)."""

    def __init__(self, path: Path, table: RegionTable, watch: Watch, events: Any = None) -> None:
        self.path = path
        self.table = table
        self.events = events
        self._watch = watch
        self._clients: dict[int, socket.socket] = {}
        # Connections that have not sent a packet yet, with when they were accepted (oldest first):
        # one silent for SILENT_GRACE_S makes room for a newcomer when MAX_CLIENTS are open, as on
        # the inference socket (peers.py).
        self._silent: dict[int, float] = {}
        self._paused: dict[int, float] = {}  # fd -> when it is read again (BAD_PACKET_PAUSE_S, the bucket)
        self._buckets: dict[int, tuple[float, float]] = {}  # fd -> (packets it may send now, as of when)
        # Connections holding no region whose last packet was refused -> how many in a row, oldest first.
        self._refusing: dict[int, int] = {}
        self._parked: dict[int, tuple[socket.socket, float]] = {}  # newcomers waiting for a slot, until when
        # Registrations and releases are events (a log line each, and the ring): a client in a loop
        # gets a few per interval, then a count (events.Throttle).
        self._throttle = Throttle()
        self.counts = table.counts
        self.counts.update({"refused_connections": 0, "idle_closed": 0, "bad_packets": 0, "refusing_closed": 0})
        # A descriptor kept free for the moment the table is full: closing it lets accept()
        # take the waiting client so it can be told why, instead of the listener spinning.
        self._spare: int | None = _open_spare()
        self._full_logged = 0.0
        path.unlink(missing_ok=True)  # a stale file from a daemon that was killed
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ipc.private_files():
            self.sock.bind(str(path))
        ipc.secure(f"ipc://{path}")  # 0660 and group infermux, like the inference socket
        self.sock.listen(16)
        self.sock.setblocking(False)
        watch(self.sock.fileno(), self._accept)

    def _accept(self) -> bool:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                if exc.errno not in _TRANSIENT_ACCEPT:
                    return False  # closed at shutdown
                return self._refuse_one(exc)
            now = time.monotonic()
            if self._room(now):
                self._admit(conn, now)
            elif len(self._parked) < MAX_PARKED:
                self._parked[conn.fileno()] = (conn, now + PARK_S)
            else:
                self._refuse_full(conn)

    def _room(self, now: float) -> bool:
        """Whether a connection may be admitted, after closing one to make room if one must."""
        return len(self._clients) < MAX_CLIENTS or self._close_gone() or self._close_refusing() or \
            self._close_oldest_silent(now)

    def _admit(self, conn: socket.socket, now: float) -> None:
        conn.setblocking(False)
        fd = conn.fileno()
        self._clients[fd] = conn
        self._silent[fd] = now
        self._watch(fd, functools.partial(self._serve, fd))

    def _refuse_full(self, conn: socket.socket) -> None:
        self.counts["refused_connections"] += 1
        self._log_limited("refused", "regions.sock: refused a connection: %d clients are connected, none "
                          "of them silent for %g s or refused (%d refused so far)", MAX_CLIENTS, SILENT_GRACE_S,
                          self.counts["refused_connections"])
        _answer(conn, {"ok": False, "error": f"{MAX_CLIENTS} clients hold shared memory already; "
                                             "close one, or send tensors in frames"})
        conn.close()

    def _unpark(self, now: float) -> None:
        """Admit the newcomers waiting for a slot, oldest first, as slots come free; refuse those
        that waited PARK_S."""
        room = True
        for fd, (conn, until) in list(self._parked.items()):
            room = room and self._room(now)  # no room for one: none for those after it either
            if room or now >= until:
                del self._parked[fd]
                if room:
                    self._admit(conn, now)
                else:
                    self._refuse_full(conn)

    def _close_gone(self) -> bool:
        """Close the paused connections whose client has hung up. A paused one is read again (and its
        end seen) only after its pause, so a loop of clients sending garbage and leaving would
        otherwise fill the table with the departed and have a newcomer refused."""
        probe = select.poll()
        for fd in self._paused:
            probe.register(fd, select.POLLRDHUP)
        gone = [fd for fd, events in probe.poll(0) if events & (select.POLLRDHUP | select.POLLHUP)]
        for fd in gone:
            self._closed(fd)
        return bool(gone)

    def _close_refusing(self, fd: int | None = None, why: str = "to make room for a new one") -> bool:
        """Close `fd`, or else the connection holding no region whose refused packets began longest ago,
        if there is one."""
        fd = next(iter(self._refusing), None) if fd is None else fd
        if fd is None:
            return False
        self.counts["refusing_closed"] += 1
        self._log_limited("refusing", "regions.sock: closed a connection holding no region whose last %d packet(s) "
                          "were refused, %s (%d closed so far)", self._refusing[fd], why,
                          self.counts["refusing_closed"])
        self._closed(fd)
        return True

    def _close_oldest_silent(self, now: float) -> bool:
        """Close the oldest connection that has sent nothing for SILENT_GRACE_S, if there is one."""
        fd, accepted = next(iter(self._silent.items()), (None, now))
        if fd is None or now - accepted < SILENT_GRACE_S:
            return False  # the oldest silent one is too young, and so is every one after it
        self.counts["idle_closed"] += 1
        self._log_limited("idle", "regions.sock: closed a connection that had sent nothing for %g s, to make room "
                          "for a new one (%d closed so far)", SILENT_GRACE_S, self.counts["idle_closed"])
        self._closed(fd)
        return True

    def _log_limited(self, kind: str, message: str, *args: object) -> None:
        held = self._throttle.admit(kind)
        if held is not None:
            log.warning(message + (f" ({held} more like this not logged)" if held else ""), *args)

    def due(self, now: float) -> float | None:
        """Seconds from `now` until a paused connection is read again (the frontend's wait), None
        when none is paused: the held-back counts wait for the loop's next turn."""
        return min(self._paused.values()) - now if self._paused else None

    def tick(self) -> None:
        """On the frontend thread's ticks: admit newcomers as slots come free; read paused connections
        again; tell held-back counts."""
        if self._parked:
            self._unpark(time.monotonic())
        if self._paused:
            now = time.monotonic()
            for fd, until in list(self._paused.items()):
                if now >= until:
                    del self._paused[fd]
                    if fd in self._clients:
                        self._watch(fd, functools.partial(self._serve, fd))
        for kind, count in self._throttle.held().items():
            if kind.startswith("region_"):
                self._emit_now("regions_throttled", of=kind, count=count)
            else:
                log.warning("regions.sock: %d more %s connection(s) in the last %.0f s, not logged one by one",
                            count, kind, self._throttle.interval_s)

    def _refuse_one(self, exc: OSError) -> bool:
        """The descriptor table is full (EMFILE...): spend the spare fd to take one waiting client
        and tell it so; the listener stays watched and serves again once fds are free."""
        now = time.monotonic()
        if now - self._full_logged >= 60:
            self._full_logged = now
            log.warning("shared-memory registrations refused for now: %s (the daemon's descriptor table "
                        "is full; see LimitNOFILE and [daemon] reserved_fds)", exc.strerror)
        if self._spare is None:
            self._spare = _open_spare()
            return True
        os.close(self._spare)
        try:
            conn, _ = self.sock.accept()
            _answer(conn, {"ok": False, "error": "the daemon is out of file descriptors; retry later, "
                                                 "or send tensors in frames"})
            conn.close()
        except OSError:
            pass
        finally:  # the slot just freed again: keep it for the next one
            self._spare = _open_spare()
        return True

    def _serve(self, fd: int) -> bool:
        conn = self._clients.get(fd)
        if conn is None:  # closed to make room (_close_oldest_silent) while still watched: forget it
            return False
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(conn, _PACKET, 4)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                data, fds = b"", []
            try:
                # A zero-length packet may still carry descriptors: they are closed here too.
                answer = self._handle_safely(fd, data, fds) if data else None
            finally:
                for extra in fds:
                    os.close(extra)  # the handler dup()s what it keeps
            if answer is None:  # end of file (or an empty packet, which SEQPACKET cannot tell apart)
                self._closed(fd)
                return False
            self._silent.pop(fd, None)  # it speaks: no longer closed to make room for being silent
            # Counted before it is answered: a peer holding its answer finds it in the counts.
            wait = self._paced(fd, bad=not answer.get("ok"))
            if self._refusals(fd, bad=not answer.get("ok")) >= MAX_REFUSED_IN_A_ROW:
                answer["error"] = f"{answer['error']} ({MAX_REFUSED_IN_A_ROW} packets refused in a row on a " \
                                  "connection holding no region: closing it)"
                _answer(conn, answer)
                self._close_refusing(fd, "and will not be read again")
                return False
            _answer(conn, answer)
            if wait:  # not read again for a moment (tick() takes it up)
                self._paused[fd] = time.monotonic() + wait
                return False

    def _refusals(self, fd: int, bad: bool) -> int:
        """Packets refused in a row on `fd` while it holds no region (0 once one is accepted or it holds one)."""
        if not bad or self.table.owned_by(fd):
            self._refusing.pop(fd, None)
            return 0
        # A new entry goes last (an existing one keeps its place): the order is when its refusals began.
        self._refusing[fd] = self._refusing.get(fd, 0) + 1
        return self._refusing[fd]

    def _paced(self, fd: int, bad: bool) -> float:
        """Seconds before `fd` is read again after this packet: BAD_PACKET_PAUSE_S after a refused one,
        else as long as its bucket (PACKET_BURST, refilled at PACKETS_PER_S) needs to hold one more."""
        now = time.monotonic()
        tokens, then = self._buckets.get(fd, (float(PACKET_BURST), now))
        tokens = min(float(PACKET_BURST), tokens + (now - then) * PACKETS_PER_S) - 1
        self._buckets[fd] = (tokens, now)
        if bad:
            self.counts["bad_packets"] += 1
            return max(BAD_PACKET_PAUSE_S, -tokens / PACKETS_PER_S)
        return max(0.0, -tokens / PACKETS_PER_S)

    def _handle_safely(self, owner: int, data: bytes, fds: list[int]) -> dict[str, Any]:
        """`_handle`, but a bug there answers this packet instead of unwatching the connection,
        which would leave its regions served after it is gone."""
        try:
            return self._handle(owner, data, fds)
        except Exception:
            log.exception("internal error on a shared-memory registration; answered it")
            return {"ok": False, "error": "internal error in infermux (logged)"}

    def _handle(self, owner: int, data: bytes, fds: list[int]) -> dict[str, Any]:
        try:
            message = json.loads(data)
            op = message.get("op")
        except (ValueError, AttributeError, RecursionError):  # RecursionError: JSON nested too deep
            return {"ok": False, "error": "expected a JSON object with \"op\": register or unregister"}
        if op == "unregister":
            token = message.get("region")
            if token not in self.table.owned_by(owner):
                return {"ok": False, "error": f"no region {str(token)[:40]!r} registered on this connection"}
            self._drop(token, "unregistered")
            return {"ok": True}
        if op != "register":
            return {"ok": False, "error": f"unknown op {str(op)[:40]!r}: register or unregister"}
        if len(fds) != 1:
            return {"ok": False, "error": f"register takes exactly one file descriptor (SCM_RIGHTS), got {len(fds)}"}
        if len(self.table.owned_by(owner)) >= MAX_REGIONS_PER_CLIENT:
            return {"ok": False, "error": f"{MAX_REGIONS_PER_CLIENT} regions per connection at most; "
                                          "unregister one or use one bigger region"}
        if len(self.table.regions) >= MAX_REGIONS:
            return {"ok": False, "error": f"the daemon holds {MAX_REGIONS} regions, its limit; "
                                          "unregister some, or use fewer, bigger regions"}
        try:
            name = "".join(c for c in str(message.get("name") or "")[:64] if c.isprintable())  # it is logged
            region = map_memfd(fds[0], name, owner)
        except (OSError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}
        self.table.add(region)
        self._emit("region_registered", name=region.name, bytes=region.size, regions=len(self.table.regions))
        return {"ok": True, "region": region.token, "bytes": region.size}

    def _closed(self, fd: int) -> None:
        for token in self.table.owned_by(fd):
            self._drop(token, "client closed its connection")
        self._silent.pop(fd, None)
        self._paused.pop(fd, None)
        self._buckets.pop(fd, None)
        self._refusing.pop(fd, None)
        self._clients.pop(fd).close()

    def _drop(self, token: str, reason: str) -> None:
        region = self.table.regions[token]
        self.table.drop(token)
        self._emit("region_released", name=region.name, bytes=region.size, reason=reason)

    def _emit(self, kind: str, **fields: Any) -> None:
        """A registration's event, unless its kind came too often this interval (then counted)."""
        held = self._throttle.admit(kind)
        if held is None:
            return
        if held:
            fields["not_logged_before"] = held
        self._emit_now(kind, **fields)

    def _emit_now(self, kind: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(kind, **fields)
        else:
            log.info("%s %s", kind, fields)

    def close(self) -> None:
        """Stop taking registrations and forget every region (at shutdown)."""
        for fd in list(self._clients):
            self._closed(fd)
        for conn, _ in self._parked.values():
            conn.close()
        self._parked.clear()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        self.sock.close()
        self.path.unlink(missing_ok=True)


def _open_spare() -> int | None:
    try:
        return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _answer(conn: socket.socket, answer: dict[str, Any]) -> None:
    try:
        conn.send(json.dumps(answer).encode())
    except OSError:
        pass  # the client is gone; its close is seen next
