"""Connections libzmq dropped mid-message: a frame over the inference socket's cap (limits.py).

libzmq refuses a frame over MAXMSGSIZE by closing the connection unread and
says nothing of why: its monitor reports the same DISCONNECTED as for a
client that hung up, after the descriptor is closed. So the frontend keeps a
duplicate of each connection's descriptor from the first message it reads on
it (one descriptor per connection, only from the room the connection bound
leaves spare: `room`) and, once libzmq has let the connection go, the peer guard peeks
at it: a connection the peer did not end (no end of stream waiting there: the
rest of its frame, or nothing yet) was ended by libzmq, and after the
handshake (a connection that spoke has had it) libzmq ends one only for a
frame over the cap (or a hand-made malformed stream). Those are counted
(`infermux_requests_dropped_oversize_total`) and logged at most once per
LOG_INTERVAL_S with the peer: its descriptor, and its pid (ipc) or address
(tcp). A client that hung up, or one the guard shut down, reads as end of
stream and is not counted.

A connection whose very first message is over the cap is not counted: libzmq
closes it before any message was read on it, within microseconds of its
accept, and no thread of ours can hold its descriptor that early. The clients
that ask the limits first (client/limits.py) never send one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import time

log = logging.getLogger("infermux.peers")

LOG_INTERVAL_S = 60.0


class DropWatch:
    """Duplicates of live connections' descriptors, and the count of those dropped mid-message."""

    def __init__(self, frame_cap: int, room: int) -> None:
        self.frame_cap = frame_cap
        self.room = room  # duplicates it may hold: descriptors neither connections nor reserved_fds need
        self.dropped = 0
        self.closing = False  # set as the daemon closes the socket (Server.close): nothing is counted then
        self._dups: dict[int, int] = {}  # libzmq's descriptor -> ours
        self._logged_at = 0.0
        self._logged_count = 0

    def watch(self, fd: int) -> None:
        """A message was just read from connection `fd` (frontend thread): keep a duplicate of it,
        if the table has room. Right after the read, `fd` is that connection's."""
        if fd in self._dups or len(self._dups) >= self.room:
            return  # near the limit a connection is worth more than knowing why one ended
        try:
            self._dups[fd] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0)
        except OSError:
            pass  # no descriptor free

    def disconnected(self, fd: int) -> None:
        """libzmq let the connection on `fd` go: count it unless the peer had ended it (or the daemon
        is closing the socket)."""
        dup = self._dups.pop(fd, None)
        if dup is None:
            return
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            return
        with sock:
            if self.closing:
                return  # the daemon is closing the socket: every connection ends, none for its size
            try:
                ended_by_peer = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:  # the peer still holds it, and the rest of its frame is on the way
                ended_by_peer = False
            except OSError:  # reset by the peer
                ended_by_peer = True
            if not ended_by_peer:
                self.dropped += 1
                self._log(fd, _peer(sock))

    def close(self) -> None:
        for dup in list(self._dups.values()):
            try:
                os.close(dup)
            except OSError:
                pass
        self._dups.clear()

    def _log(self, fd: int, peer: str) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_INTERVAL_S:
            return
        since = self.dropped - self._logged_count
        self._logged_at, self._logged_count = now, self.dropped
        log.warning("dropped a connection (fd %d, %s) that sent a frame over %d bytes (max_message_bytes + 64 KiB), "
                    "which libzmq does not read: its requests get no reply; the client should ask the daemon's "
                    "limits first (docs/protocol.md, \"Size limits\") - %d such connection(s) since the last line, "
                    "%d in all", fd, peer, self.frame_cap, since, self.dropped)


def _peer(sock: socket.socket) -> str:
    """Who is at the other end: a pid for a unix socket, an address for tcp."""
    try:
        if sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _ = struct.unpack("3i", creds)
            return f"pid {pid}, uid {uid}"
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "peer unknown"
