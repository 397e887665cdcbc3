"""The connection guard's choice (transport/peers.py), on real descriptors: which connection a
full bound shuts down, and how the owner tells it which connections speak."""

from __future__ import annotations

import os
import socket
import stat
from contextlib import contextmanager
from typing import Iterator

import zmq

from infermux.transport.peers import PeerGuard


def _guard(bound: int, grace_s: float = 0.0) -> PeerGuard:
    """A guard whose silent connections may make room after `grace_s` (0: at once)."""
    guard = PeerGuard(bound, reserved_fds=64)
    assert guard.bound == bound
    guard.grace_s = grace_s
    return guard


def _accept(guard: PeerGuard, fd: int) -> None:
    guard._judge({"event": zmq.EVENT_ACCEPTED, "value": fd, "endpoint": b""})


@contextmanager
def _pairs(count: int) -> Iterator[list[tuple[int, socket.socket]]]:
    """`count` connected socket pairs: (our end's descriptor, as the guard sees it; the peer)."""
    pairs = [socket.socketpair() for _ in range(count)]
    try:
        yield [(ours.fileno(), peer) for ours, peer in pairs]
    finally:
        for ours, peer in pairs:
            ours.close()
            peer.close()


def _ended(peer: socket.socket) -> bool:
    """Whether the daemon's end of this pair was shut down: the peer reads EOF at once."""
    peer.settimeout(0)
    try:
        return peer.recv(1) == b""
    except BlockingIOError:
        return False


def test_a_full_bound_shuts_down_the_oldest_silent_connection_never_one_that_spoke() -> None:
    guard = _guard(2)
    with _pairs(4) as pairs:
        ours = [fd for fd, _ in pairs]
        _accept(guard, ours[0])
        guard.heard.add(ours[0])  # it sent a request
        _accept(guard, ours[1])
        _accept(guard, ours[2])  # full: the silent ours[1] makes room
        assert [_ended(peer) for _, peer in pairs] == [False, True, False, False]
        _accept(guard, ours[3])  # then ours[2], the oldest silent one left
        assert [_ended(peer) for _, peer in pairs] == [False, True, True, False]
        assert (guard.counts.idle_closed, guard.counts.refused_connections) == (2, 0)


def test_silent_connections_younger_than_the_grace_are_kept_and_the_newcomer_refused() -> None:
    # A young connection may have sent a request the frontend has not read yet: shutting it
    # down would lose that request in flight. Refused before it spoke, the newcomer's client
    # reconnects and sends on the new connection.
    guard = _guard(2, grace_s=60.0)
    with _pairs(3) as pairs:
        for fd, _ in pairs:
            _accept(guard, fd)
        assert [_ended(peer) for _, peer in pairs] == [False, False, True]
        assert (guard.counts.idle_closed, guard.counts.refused_connections) == (0, 1)


def test_a_newcomer_heard_before_it_was_judged_is_kept_over_the_bound() -> None:
    # The guard judges events late: a client may have been answered before its ACCEPTED is read.
    guard = _guard(1, grace_s=60.0)
    with _pairs(2) as pairs:
        _accept(guard, pairs[0][0])
        guard.heard.add(pairs[1][0])
        _accept(guard, pairs[1][0])
        assert [_ended(peer) for _, peer in pairs] == [False, False]
        assert guard.counts.connections == 2


def test_a_full_bound_that_has_heard_from_every_connection_refuses_the_newcomer() -> None:
    guard = _guard(2)
    with _pairs(3) as pairs:
        for fd, _ in pairs[:2]:
            _accept(guard, fd)
            guard.heard.add(fd)
        _accept(guard, pairs[2][0])
        assert [_ended(peer) for _, peer in pairs] == [False, False, True]
        assert (guard.counts.idle_closed, guard.counts.refused_connections) == (0, 1)


def test_a_guard_whose_peers_never_speak_refuses_the_newcomer() -> None:
    guard = PeerGuard(1, reserved_fds=64, speaks=False)  # stats.sock: consoles send nothing we read
    with _pairs(2) as pairs:
        for fd, _ in pairs:
            _accept(guard, fd)
        assert [_ended(peer) for _, peer in pairs] == [False, True]


def test_a_heard_message_names_its_connection_even_after_a_poll(tmp_path) -> None:
    # libzmq 4.3.4 (Debian 12's) gives the identity frame of a message a ROUTER prefetched for a
    # poll no properties; the guard reads the descriptor off a frame from the wire instead.
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind(f"ipc://{tmp_path}/s.sock")
        dealer.connect(f"ipc://{tmp_path}/s.sock")
        dealer.send_multipart([b"", b"request"])
        assert router.poll(10_000)
        guard = _guard(2)
        guard.hear(router.recv_multipart(copy=False))
        (fd,) = guard.heard
        assert stat.S_ISSOCK(os.fstat(fd).st_mode)
    finally:
        ctx.destroy(0)


def test_a_message_libzmq_keeps_no_descriptor_for_is_heard_as_nothing() -> None:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind("inproc://guarded")
        dealer.connect("inproc://guarded")
        dealer.send_multipart([b"", b"request"])
        guard = _guard(2)
        guard.hear(router.recv_multipart(copy=False))  # inproc: no descriptor, and no error
        assert guard.heard == set()
    finally:
        ctx.destroy(0)
