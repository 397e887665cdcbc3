"""What one peer of the inference socket may cost the daemon (docs/security.md).

Two bounds, both kept on the frontend thread that owns the ROUTER:

- **Connections.** libzmq accepts every connection to a listener itself
  and has no hook to refuse one; when `accept` meets a full descriptor
  table on an ipc:// listener it asserts and the whole daemon dies
  (libzmq 4.3: `Too many open files (src/ipc_listener.cpp)`). So the
  ROUTER's monitor reports each accepted connection's fd, and one beyond
  `[daemon] max_connections` live ones, or one whose fd number comes near
  RLIMIT_NOFILE, is shut down: libzmq sees EOF and frees the fd itself
  (we never close a descriptor libzmq owns). On a socket whose owner
  reads its peers' messages (`speaks`), a connection over the bound
  takes the place of the oldest one that has sent nothing for
  `SILENT_GRACE_S` since it was judged; only if there is none is the new
  one refused. Connections that never speak (a scanner, a leak, a flood)
  then lock out clients that do for that long at most, not until libzmq's
  handshake timeout (30 s). The grace is there because the guard judges
  events late and the frontend reads late: a young connection may have
  sent a request not yet read, and shutting it down would lose that
  request in flight. The owner tells the guard which descriptors it heard
  from (`hear`, from each message's ZMQ_SRCFD). The bound also keeps
  `reserved_fds` free for engine files, workers and shared-memory regions.
  The events are read on a thread of their own, not the frontend's, and
  the monitor's pipe is kept short (RCVHWM 1: libzmq's monitor pipe then
  holds about 1,000 events): libzmq's I/O thread accepts at C speed, and
  a guard that falls that far behind makes it wait in the event's send
  instead of accepting on (a busy frontend let a flood fill the table
  and the daemon abort). So at most `MONITOR_LEAD` descriptors are ever
  held by connections the guard has not yet judged or whose shutdown
  libzmq has not yet seen; the bound leaves room for them.
- **Replies.** A reply to a peer whose pipe is full (it does not read) is
  dropped rather than waited for: the frontend would otherwise block in
  `send` and serve nobody. Drops are counted, and logged once per peer.
  Until a reply to it goes through again, that peer is `stalled`: its
  requests are dropped as they are read, unvalidated and uncomputed (their
  replies would be dropped too), and one every `PROBE_S` is answered 429
  instead, to see whether it reads again: the first 429 that fits in its
  pipe ends the stall. A client that pipelines without reading then costs
  the others little more than reading its messages (bench_hostile.py).
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from infermux.transport.oversize import DropWatch
from infermux.transport.wire import source_fd

log = logging.getLogger("infermux.peers")

_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED
# Descriptors connections can hold before the guard has shut them down: the monitor pipe's
# ~1,001 unread events (our RCVHWM 1 + libzmq's SNDHWM 1000), as many again shut down but not
# yet closed by libzmq. The connection bound stays this far under the table's end.
MONITOR_LEAD = 2048
MIN_GUARANTEED = 64  # below this many connections the lead is not kept: the bound would be useless
# A connection that has sent nothing this long after the guard judged it is silent, and may be
# shut down to make room: a client's first request is read within milliseconds on a busy box.
SILENT_GRACE_S = 0.5
PROBE_S = 0.01  # how often a stalled peer's request is answered (429), to see whether it reads again
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
    `reserved_fds` and `MONITOR_LEAD` stay free under the soft RLIMIT_NOFILE. A limit too low
    for both (1024 with a hard limit of 1024) keeps only `reserved_fds` free, and says that a
    flood can then still outrun the guard (libzmq aborts on EMFILE in an ipc accept)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = soft - reserved_fds - MONITOR_LEAD
    if room >= min(max_connections, MIN_GUARANTEED):
        return min(max_connections, room)
    log.warning("the descriptor limit (%d) is too low to keep a flood of connections from exhausting it "
                "(libzmq aborts the daemon when that happens): raise LimitNOFILE to at least %d "
                "([daemon] reserved_fds + %d + max connections)", soft,
                reserved_fds + MONITOR_LEAD + MIN_GUARANTEED, MONITOR_LEAD)
    return max(1, min(max_connections, soft - reserved_fds))


@dataclass
class PeerCounts:
    """What the stats stream and metrics show under `clients`."""

    connections: int = 0
    max_connections: int = 0
    refused_connections: int = 0
    idle_closed: int = 0  # connections that had sent nothing, closed to make room for a new one
    dropped_replies: int = 0
    slow_peers: int = 0
    stalled_requests: int = 0  # requests of stalled peers, dropped or answered 429, never computed
    dropped_oversize: int = 0  # connections libzmq dropped mid-message: a frame over the cap (oversize.py)


class PeerGuard:
    """The ROUTER's connection bound (judged on the guard's thread, `attach`) and reply drops
    (`dropped`, on the frontend thread).

    `speaks`: the owner reads its peers' messages and tells `hear` of each (on its own thread:
    a set's add is atomic), so a connection over the bound may take the place of the oldest
    silent one. A PUB's peers never speak to its owner: its guard refuses the new connection
    instead."""

    def __init__(self, max_connections: int, reserved_fds: int, name: str = "the inference socket",
                 speaks: bool = True) -> None:
        self.name = name
        self.bound = connection_bound(max_connections, reserved_fds)
        self.reserved_fds = reserved_fds
        self.speaks = speaks
        self.counts = PeerCounts(max_connections=self.bound)
        self._live: set[int] = set()
        # Descriptors the owner read a message from. Only DISCONNECTED takes one out, never
        # ACCEPTED: the guard judges events late (up to MONITOR_LEAD behind), so a client's
        # first request may be heard before the guard has seen its connection accepted. (A message
        # read after its connection's DISCONNECTED was judged leaves a stale entry: it only spares
        # the next connection on that descriptor once.)
        self.heard: set[int] = set()
        # Live connections not yet seen speaking, oldest first, with when they were judged (guard
        # thread only). Heard ones are taken out lazily, when they reach the front.
        self._silent: dict[int, float] = {}
        self.grace_s = SILENT_GRACE_S
        self._slow: set[bytes] = set()
        # Peers whose last reply was dropped, with when the next 429 may probe them (frontend thread only).
        self.stalled: dict[bytes, float] = {}
        self.monitor: zmq.Socket | None = None
        self._thread: threading.Thread | None = None
        self._last_logged: dict[str, int] = {}  # by message: the count when it was last logged
        self.drops: DropWatch | None = None  # the inference socket's: connections dropped for a frame over its cap

    def watch_drops(self, frame_cap: int) -> None:
        """Count connections libzmq drops for a frame over `frame_cap` (oversize.py), with duplicate
        descriptors from what the table has beyond the bound, reserved_fds and MONITOR_LEAD."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = 1 << 16 if soft == resource.RLIM_INFINITY else soft - self.reserved_fds - MONITOR_LEAD - self.bound
        self.drops = DropWatch(frame_cap, max(0, room))

    def attach(self, ctx: zmq.Context, sock: zmq.Socket) -> None:
        """Start monitoring `sock` (before it binds) on the guard's own thread."""
        address = f"inproc://infermux-peers-{id(self)}"
        sock.monitor(address, _EVENTS)
        monitor = ctx.socket(zmq.PAIR)
        # Short: libzmq's I/O thread waits (PAIR never drops) rather than run ~1,000 accepts ahead.
        monitor.setsockopt(zmq.RCVHWM, 1)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        self.monitor = monitor
        self._thread = threading.Thread(target=self._run, name="peers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Judge each event as it comes, until libzmq says the monitor stopped (the socket closed):
        reading on to that end keeps libzmq's I/O thread from waiting for us forever."""
        assert self.monitor is not None
        try:
            while self._judge(parse_monitor_message(self.monitor.recv_multipart())):
                pass
        except zmq.ZMQError:  # the context is ending
            pass
        finally:
            self.monitor.close(0)  # here: a socket left open would hold up the context's term()

    def _judge(self, event: Any) -> bool:  # a zmq.utils.monitor._MonitorMessage (a TypedDict)
        """One monitor event; False once the monitor has stopped."""
        if event["event"] == zmq.EVENT_MONITOR_STOPPED:
            return False
        fd = int(event["value"])
        if event["event"] == zmq.EVENT_ACCEPTED:
            self._accepted(fd)
        else:
            if self.drops is not None:
                self.drops.disconnected(fd)
                self.counts.dropped_oversize = self.drops.dropped
            self._live.discard(fd)
            self._silent.pop(fd, None)
            self.heard.discard(fd)
        self.counts.connections = len(self._live)
        return True

    def _accepted(self, fd: int) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        table_full = soft != resource.RLIM_INFINITY and fd >= soft - self.reserved_fds // 2
        now = time.monotonic()
        if len(self._live) >= self.bound and not table_full:
            self._close_oldest_silent(now)
        # One heard before it was judged spoke while the guard lagged: refusing it would lose its
        # request. Such connections can pass the bound by at most the lag, which MONITOR_LEAD holds.
        if (len(self._live) < self.bound or fd in self.heard) and not table_full:
            self._live.add(fd)
            self._silent[fd] = now
            return
        self.counts.refused_connections += 1
        _shut_down(fd)
        self._log_shutdown(self.counts.refused_connections,
                           "refused a connection to %s: %d are open (max_connections %d)%s; %d refused so far",
                           len(self._live), self.bound, ", and the descriptor table is nearly full" if table_full
                           else f", none of them silent for {self.grace_s:g} s" if self.speaks else "",
                           self.counts.refused_connections)

    def _close_oldest_silent(self, now: float) -> None:
        """Shut down the oldest live connection that has sent nothing for `grace_s`, if there is
        one (`speaks`)."""
        while self.speaks and self._silent:
            fd, judged = next(iter(self._silent.items()))
            if fd in self.heard:
                del self._silent[fd]
                continue
            if now - judged < self.grace_s:
                return  # the oldest silent one is too young, and so is every one after it
            del self._silent[fd]
            self._live.discard(fd)
            self.counts.idle_closed += 1
            _shut_down(fd)
            self._log_shutdown(self.counts.idle_closed,
                               "closed a connection to %s that had sent nothing, to make room for a new one "
                               "(max_connections %d are open); %d closed so far", self.bound, self.counts.idle_closed)
            return

    def _log_shutdown(self, count: int, message: str, *args: object) -> None:
        """Log the 1st, 2nd, 4th, 8th... shutdown of one kind (`count` so far): never a flood."""
        if count >= 2 * self._last_logged.get(message, 0):
            self._last_logged[message] = count
            log.warning(message, self.name, *args)

    def hear(self, parts: list[zmq.Frame]) -> None:
        """The owner read the message `parts` (identity first) through pyzmq: its connection speaks."""
        self.hear_fd(source_fd(parts))

    def hear_fd(self, fd: int) -> None:
        """The owner read a message from the connection on descriptor `fd` (wire.py: -1 for none,
        as on inproc, which is not counted): it speaks, so it is never closed as idle."""
        if fd < 0:
            return
        self.heard.add(fd)
        if self.drops is not None:
            self.drops.watch(fd)

    def dropped(self, identity: Any) -> None:
        """A reply could not be queued: the peer's pipe is full. Count it, log the peer once."""
        self.counts.dropped_replies += 1
        key = bytes(identity)
        if len(self.stalled) >= _SLOW_PEERS_KEPT:
            self.stalled.clear()
        self.stalled[key] = time.monotonic() + PROBE_S
        if key in self._slow:
            return
        if len(self._slow) >= _SLOW_PEERS_KEPT:
            self._slow.clear()
        self._slow.add(key)
        self.counts.slow_peers += 1
        log.warning("client %s is not reading its replies (its queue is full): dropping them until it "
                    "reads again; other clients are not held up", key.hex()[:16])

    def probe(self, identity: bytes) -> bool:
        """A stalled peer's request: True if it is to be answered (429) to probe the peer's pipe,
        False if it is dropped unanswered (and counted) until the next probe is due."""
        now = time.monotonic()
        self.counts.stalled_requests += 1
        if now < self.stalled[identity]:
            self.counts.dropped_replies += 1
            return False
        self.stalled[identity] = now + PROBE_S
        return True

    def delivered(self, identity: Any) -> None:
        """A reply went into `identity`'s pipe: if it was stalled, it reads again."""
        self.stalled.pop(bytes(identity), None)

    def info(self) -> dict[str, int]:
        """For the daemon view (`clients`): connections, refusals and dropped replies."""
        c = self.counts
        return {"connections": c.connections, "max_connections": c.max_connections,
                "refused_connections": c.refused_connections, "idle_closed": c.idle_closed,
                "dropped_replies": c.dropped_replies,
                "slow_peers": c.slow_peers, "stalled_requests": c.stalled_requests,
                "dropped_oversize": c.dropped_oversize}

    def close(self, timeout_s: float = 5.0) -> None:
        """After the monitored socket is closed: wait for the guard to read libzmq's last event."""
        if self._thread is not None:
            self._thread.join(timeout_s)  # the thread closes the monitor socket itself
        if self.drops is not None:
            self.drops.close()


def _shut_down(fd: int) -> None:
    """End the connection on `fd` without closing the descriptor, which libzmq owns: libzmq then
    reads EOF and closes its own fd. shutdown(2) straight from libc: a dup() would need a free
    descriptor just when there may be none."""
    if _libc.shutdown(fd, socket.SHUT_RDWR) != 0:
        log.debug("cannot shut down connection fd %d: %s", fd, os.strerror(ctypes.get_errno()))
