"""What one peer of the inference socket may cost the daemon (docs/security.md).

Two bounds, both kept on the frontend thread that owns the ROUTER:

- **Connections.** libzmq accepts every connection to a listener itself
  and has no hook to refuse one; when `accept` meets a full descriptor
  table on an ipc:// listener it asserts and the whole daemon dies
  (libzmq 4.3: `Too many open files (src/ipc_listener.cpp)`). So the
  ROUTER's monitor reports each accepted connection's fd, and one beyond
  `[daemon] max_connections` live ones, or one whose fd number comes near
  RLIMIT_NOFILE, is shut down at once: libzmq sees EOF and frees the fd
  itself (we never close a descriptor libzmq owns). The bound also keeps
  `reserved_fds` free for engine files, workers and shared-memory regions.
- **Replies.** A reply to a peer whose pipe is full (it does not read) is
  dropped rather than waited for: the frontend would otherwise block in
  `send` and serve nobody. Drops are counted, and logged once per peer.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import socket
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("infermux.peers")

_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_SLOW_PEERS_KEPT = 10_000  # peers remembered as logged; past this the memory starts over
_libc = ctypes.CDLL(None, use_errno=True)


def raise_fd_limit() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to the hard one (systemd starts services at 1024 soft);
    returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a hard limit of RLIM_INFINITY cannot be the soft one on Linux
            pass
    return soft, hard


def connection_bound(max_connections: int, reserved_fds: int) -> int:
    """The live connections the inference socket takes: the configured bound, lowered so that
    `reserved_fds` stay free under the soft RLIMIT_NOFILE (at least 1)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - reserved_fds))


@dataclass
class PeerCounts:
    """What the stats stream and metrics show under `clients`."""

    connections: int = 0
    max_connections: int = 0
    refused_connections: int = 0
    dropped_replies: int = 0
    slow_peers: int = 0


class PeerGuard:
    """The ROUTER's connection bound and reply drops; every method runs on the frontend thread."""

    def __init__(self, max_connections: int, reserved_fds: int) -> None:
        self.bound = connection_bound(max_connections, reserved_fds)
        self.reserved_fds = reserved_fds
        self.counts = PeerCounts(max_connections=self.bound)
        self._live: set[int] = set()
        self._refused: set[int] = set()
        self._slow: set[bytes] = set()
        self.monitor: zmq.Socket | None = None
        self._last_refusal_log = 0

    def attach(self, ctx: zmq.Context, sock: zmq.Socket) -> zmq.Socket:
        """Start monitoring `sock`; returns the monitor socket for the caller's poller."""
        address = f"inproc://infermux-peers-{id(self)}"
        sock.monitor(address, _EVENTS)
        monitor = ctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.RCVHWM, 0)  # a lost ACCEPTED event would be a connection never counted
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        self.monitor = monitor
        return monitor

    def on_events(self) -> None:
        """Handle every monitor event waiting (the poller found the monitor socket readable)."""
        assert self.monitor is not None
        while True:
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._accepted(fd)
            else:
                self._live.discard(fd)
                self._refused.discard(fd)
            self.counts.connections = len(self._live)

    def _accepted(self, fd: int) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        table_full = soft != resource.RLIM_INFINITY and fd >= soft - self.reserved_fds // 2
        if len(self._live) < self.bound and not table_full:
            self._live.add(fd)
            return
        self._refused.add(fd)
        self.counts.refused_connections += 1
        _shut_down(fd)
        if self.counts.refused_connections >= 2 * self._last_refusal_log:  # 1, 2, 4, 8...: never a flood
            self._last_refusal_log = self.counts.refused_connections
            log.warning("refused a connection to the inference socket: %d are open (max_connections %d)%s; "
                        "%d refused so far", len(self._live), self.bound,
                        ", and the descriptor table is nearly full" if table_full else "",
                        self.counts.refused_connections)

    def dropped(self, identity: Any) -> None:
        """A reply could not be queued: the peer's pipe is full. Count it, log the peer once."""
        self.counts.dropped_replies += 1
        key = bytes(identity)
        if key in self._slow:
            return
        if len(self._slow) >= _SLOW_PEERS_KEPT:
            self._slow.clear()
        self._slow.add(key)
        self.counts.slow_peers += 1
        log.warning("client %s is not reading its replies (its queue is full): dropping them until it "
                    "reads again; other clients are not held up", key.hex()[:16])

    def info(self) -> dict[str, int]:
        """For the daemon view (`clients`): connections, refusals and dropped replies."""
        c = self.counts
        return {"connections": c.connections, "max_connections": c.max_connections,
                "refused_connections": c.refused_connections, "dropped_replies": c.dropped_replies,
                "slow_peers": c.slow_peers}

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close(0)
            self.monitor = None


def _shut_down(fd: int) -> None:
    """End the connection on `fd` without closing the descriptor, which libzmq owns: libzmq then
    reads EOF and closes its own fd. shutdown(2) straight from libc: a dup() would need a free
    descriptor just when there may be none."""
    if _libc.shutdown(fd, socket.SHUT_RDWR) != 0:
        log.debug("cannot shut down connection fd %d: %s", fd, os.strerror(ctypes.get_errno()))
