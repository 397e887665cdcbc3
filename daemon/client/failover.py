"""Client failover across daemons: one DEALER per endpoint; requests spread, held and resent.

`Client` and `Pipeline` use a `Fleet` when given several endpoints (one
endpoint keeps inference.py's single socket, untouched). A fleet:

- spreads requests by least outstanding, ties taken in turn (so equal
  boxes get round-robin): a box that answers more slowly (a Jetson beside a
  dGPU box, or one busy with other clients) holds more requests and is
  given fewer, where plain round-robin would let its queue grow;
- keeps each request's frames until it is answered, and knows which
  endpoint holds it;
- gives an endpoint up when its socket monitor reports the connection
  broken (DISCONNECTED: a daemon killed, a box whose ZMTP heartbeats stop
  for `failover_s`), a connection refused or a handshake failed, or when
  it holds requests and has sent no reply for `failover_s` (a wedged
  daemon, a box gone without closing its connections);
- then resends what it held to another endpoint with the same `id`s, and
  replaces its socket, so a late reply from it is never delivered: each
  request is delivered once, but may have been computed twice;
- moves a request that a draining daemon refused (503 with `"draining":
  true`) to another endpoint, and sends that one nothing new for its
  `retry_after_ms`;
- raises `EndpointsDown` (a TimeoutError) naming every endpoint and why, when
  every one has been down for `failover_s` with requests waiting.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Sequence

import zmq

from infermux.transport import ipc
from zmq.utils.monitor import recv_monitor_message

from infermux.client.shared_memory import local_view
from infermux.protocol import Reply, Status, decode_reply

__all__ = ["FAILOVER_S", "EndpointsDown", "Fleet"]

FAILOVER_S = 2.0  # longer than a request takes on an edge box; short enough for a camera pipeline

_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | _HANDSHAKE_FAILED


class EndpointsDown(TimeoutError):
    """No endpoint of a fleet answers; `reasons` maps each endpoint to why it was given up."""

    def __init__(self, reasons: Mapping[str, str], waiting: int, bound_s: float) -> None:
        listed = "; ".join(f"{endpoint}: {why}" for endpoint, why in reasons.items())
        super().__init__(f"no daemon answers ({waiting} request(s) waited {bound_s:g} s with every endpoint "
                         f"down): {listed} (is `infermux serve` running there?)")
        self.reasons = dict(reasons)


class _State(Enum):
    FRESH = "connecting"  # never connected yet: sent to (libzmq queues until it connects)
    UP = "up"
    DOWN = "down"  # given up; its new socket reconnects, and a handshake brings it back


@dataclass(eq=False)
class _Held:
    """A request not yet delivered: its frames, kept to resend them."""

    ident: Any
    frames: list[Any]


class _Link:
    """One endpoint: its DEALER and that socket's monitor, its state, and the requests it holds."""

    def __init__(self, endpoint: str, context: zmq.Context, curve: Mapping[str, bytes] | None,
                 failover_s: float) -> None:
        self.endpoint = endpoint
        self._context, self._curve, self._failover_ms = context, curve, max(1, int(failover_s * 1000))
        self.held: dict[Any, _Held] = {}
        self.state = _State.FRESH
        self.why, self.down_at = "", 0.0
        self.quiet_since = 0.0  # its last reply, or when it began to hold requests
        self.resting_until = 0.0  # draining, or just given up for silence: nothing new until then
        ipc.check_directory(endpoint)  # a socket anyone could have put there is not the daemon's
        self.socket, self.monitor = self._open()

    def _open(self) -> tuple[zmq.Socket, zmq.Socket]:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # the fleet holds every request anyway; a send must never block
        # ZMTP heartbeats: a box that vanished without closing its connections (power, network)
        # is reported as DISCONNECTED even when nothing is waiting on it.
        sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, self._failover_ms // 2))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self._failover_ms)
        for option, value in (self._curve or {}).items():
            setattr(sock, option, value)
        monitor = sock.get_monitor_socket(_EVENTS)
        sock.connect(self.endpoint)
        return sock, monitor

    def eligible(self, now: float) -> bool:
        return self.state is not _State.DOWN and now >= self.resting_until

    def send(self, held: _Held, now: float) -> None:
        if not self.held:
            self.quiet_since = now
        copy = sum(len(f) for f in held.frames) < 1 << 20  # zero-copy only pays from ~1 MiB
        self.socket.send_multipart([b"", *held.frames], zmq.NOBLOCK, copy=copy)
        self.held[held.ident] = held

    def recv(self) -> Reply | None:
        """One reply already queued on the socket, or None."""
        try:
            frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        if frames and len(frames[0]) == 0:
            frames = frames[1:]
        return decode_reply([f.buffer for f in frames], local_view)

    def events(self) -> list[int]:
        """The monitor events queued since the last call."""
        found = []
        while self.monitor.poll(0):
            found.append(recv_monitor_message(self.monitor)["event"])
        return found

    def give_up(self, why: str, now: float) -> list[_Held]:
        """Mark it down and start over on a fresh socket (the old one's queued requests die with
        it, so it never answers them late); returns the requests it held."""
        orphans = list(self.held.values())
        self.held.clear()
        self.state, self.why, self.down_at = _State.DOWN, why, now
        self.close()
        self.socket, self.monitor = self._open()
        return orphans

    def describe(self, now: float) -> str:
        if self.state is _State.DOWN:
            return f"{self.why} ({now - self.down_at:.1f} s ago)"
        return f"{self.state.value}, {len(self.held)} waiting"

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(0)
        self.socket.close(0)


class Fleet:
    """Several daemons behind one Client or Pipeline (the module docstring says how)."""

    def __init__(self, endpoints: Sequence[str], context: zmq.Context | None,
                 curve: Mapping[str, bytes] | None, failover_s: float = FAILOVER_S) -> None:
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"an endpoint is given twice: {list(endpoints)}")
        if failover_s <= 0:
            raise ValueError(f"failover_s must be > 0, not {failover_s}")
        self.failover_s = failover_s
        ctx = context or zmq.Context.instance()
        self._links = [_Link(endpoint, ctx, curve, failover_s) for endpoint in endpoints]
        self._pending: deque[_Held] = deque()  # no endpoint could take them yet
        self._ready: deque[Reply] = deque()
        self._turn = 0
        self._all_down_since: float | None = None
        self._poller: zmq.Poller | None = None
        self._sockets: dict[zmq.Socket, _Link] = {}
        self.moved = 0  # requests resent to another endpoint

    @property
    def endpoints(self) -> list[str]:
        return [link.endpoint for link in self._links]

    def send(self, frames: list[Any], ident: Any = None) -> None:
        """Send a request (its frames as encode_request made them) to the least busy endpoint."""
        if ident is None:
            raise ValueError("a request without an id cannot be failed over: use one endpoint to send raw frames")
        if b'"region":' in bytes(frames[0]):
            raise ValueError("shared-memory regions belong to one daemon: use a Client or Pipeline "
                             "with that daemon's endpoint alone")
        self._place(_Held(ident, frames), time.monotonic())

    def recv(self, timeout_s: float | None) -> Reply:
        """The next reply to a request this fleet holds; TimeoutError after `timeout_s`,
        EndpointsDown sooner when every endpoint is down."""
        start = time.monotonic()
        deadline = None if timeout_s is None else start + timeout_s
        while not self._ready:
            now = time.monotonic()
            self._watch(now, start)
            if deadline is not None and now >= deadline:
                states = ", ".join(f"{link.endpoint} ({link.describe(now)})" for link in self._links)
                raise TimeoutError(f"no reply within {timeout_s:.1f} s from {states} "
                                   f"(is `infermux serve` running?)")
            self._poll(self._wait_ms(now, start, deadline))
        return self._ready.popleft()

    def holding(self, endpoint: str) -> frozenset[Any]:
        """The ids of the requests waiting on `endpoint` now."""
        for link in self._links:
            if link.endpoint == endpoint:
                return frozenset(link.held)
        raise ValueError(f"{endpoint} is not one of {self.endpoints}")

    def forget(self) -> None:
        """Drop every request not yet delivered (a blocking Client gave up on it)."""
        for link in self._links:
            link.held.clear()
        self._pending.clear()
        self._ready.clear()

    def close(self) -> None:
        for link in self._links:
            link.close()

    # -- placing -------------------------------------------------------------------------

    def _place(self, held: _Held, now: float) -> None:
        link = self._pick(now)
        if link is None:
            self._pending.append(held)
            return
        try:
            link.send(held, now)
        except zmq.ZMQError as exc:
            self._give_up(link, f"cannot send ({exc})", now)
            self._place(held, now)  # `link` is down now: the next pick is another, or none

    def _pick(self, now: float) -> _Link | None:
        """The eligible endpoint holding fewest requests; ties in turn, starting after the last pick."""
        best, count = None, len(self._links)
        for k in range(count):
            link = self._links[(self._turn + k) % count]
            if link.eligible(now) and (best is None or len(link.held) < len(best.held)):
                best = link
        if best is not None:
            self._turn = (self._links.index(best) + 1) % count
        return best

    def _any_eligible(self, now: float) -> bool:
        return any(link.eligible(now) for link in self._links)

    # -- watching ------------------------------------------------------------------------

    def _watch(self, now: float, start: float) -> None:
        """Give up silent endpoints, place what waits, and raise EndpointsDown past the bound."""
        for link in self._links:
            if link.held and now - link.quiet_since > self.failover_s:
                self._give_up(link, f"no reply for {self.failover_s:g} s while it held {len(link.held)} "
                              f"request(s)", now)
                link.resting_until = now + self.failover_s  # a wedged daemon still reconnects at once
        if self._pending and self._any_eligible(now):
            waiting = list(self._pending)
            self._pending.clear()
            for held in waiting:
                self._place(held, now)
        if self._pending and self._all_down_since is not None:
            bound = max(self._all_down_since, start) + self.failover_s
            if now >= bound:
                reasons = {link.endpoint: link.describe(now) for link in self._links}
                raise EndpointsDown(reasons, len(self._pending), self.failover_s)

    def _wait_ms(self, now: float, start: float, deadline: float | None) -> int:
        """How long the next poll may sleep: until the first bound that something here runs into."""
        times = [deadline] if deadline is not None else []
        times += [link.quiet_since + self.failover_s for link in self._links if link.held]
        if self._pending:
            times += [link.resting_until for link in self._links if link.state is not _State.DOWN]
            if self._all_down_since is not None:
                times.append(max(self._all_down_since, start) + self.failover_s)
        if not times:
            return -1  # nothing to watch: wait for a reply or an event
        return max(1, math.ceil((min(times) - now) * 1000))

    def _poll(self, timeout_ms: int) -> None:
        if self._poller is None:
            self._poller = zmq.Poller()
            self._sockets = {}
            for link in self._links:
                for sock in (link.monitor, link.socket):  # monitor first: a break is handled before reads
                    self._poller.register(sock, zmq.POLLIN)
                    self._sockets[sock] = link
        for sock, _ in self._poller.poll(None if timeout_ms < 0 else timeout_ms):
            link = self._sockets[sock]
            if sock is link.monitor:
                self._on_events(link, time.monotonic())
            elif sock is link.socket:  # not one a break just replaced
                reply = link.recv()
                if reply is not None:
                    self._take(link, reply, time.monotonic())

    def _on_events(self, link: _Link, now: float) -> None:
        for event in link.events():
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                link.state = _State.UP
                self._all_down_since = None
            elif event == zmq.EVENT_DISCONNECTED:
                self._give_up(link, "its connection broke (daemon stopped or killed, or heartbeats unanswered)",
                              now)
            elif event == zmq.EVENT_CONNECT_RETRIED:
                self._give_up(link, "nothing listens there (connection refused)", now)
            elif event & _HANDSHAKE_FAILED:
                self._give_up(link, "the handshake failed (do the CURVE keys match?)", now)
            if link.state is _State.DOWN:
                return  # later events in this batch were the old socket's

    def _take(self, link: _Link, reply: Reply, now: float) -> None:
        """A reply from `link`: deliver it, unless it is one already delivered or a draining 503
        that another endpoint can take."""
        link.quiet_since = now
        ident = reply.header.get("id")
        held = link.held.pop(ident, None) if isinstance(ident, (int, str)) else None
        if held is None:
            return  # answered already, or forgotten: a request is delivered at most once
        if reply.status == Status.NOT_READY and reply.header.get("draining"):
            link.resting_until = now + (reply.retry_after_ms or 1000) / 1000
            if self._any_eligible(now):
                self.moved += 1
                self._place(held, now)
                return
        self._ready.append(reply)

    def _give_up(self, link: _Link, why: str, now: float) -> None:
        if link.state is _State.DOWN:
            return
        while (reply := link.recv()) is not None:  # replies that made it before the break still count
            self._take(link, reply, now)
        orphans = link.give_up(why, now)
        self._poller = None
        if all(other.state is _State.DOWN for other in self._links):
            self._all_down_since = now
        self.moved += len(orphans)
        for held in orphans:
            self._place(held, now)
