"""The registration socket's bound on connections, driven in one process: the server's handlers are
called as the frontend's loop would call them, on real SOCK_SEQPACKET connections."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Callable

from infermux.transport.regions import MAX_CLIENTS, RegionServer, RegionTable


class Loop:
    """The frontend's watch table: what the server asked to be called for."""

    def __init__(self) -> None:
        self.watched: dict[int, Callable[[], bool]] = {}

    def watch(self, fd: int, on_ready: Callable[[], bool]) -> None:
        self.watched[fd] = on_ready

    def ready(self, fd: int) -> None:
        if not self.watched[fd]():
            del self.watched[fd]


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(path))
    return sock


def accept(loop: Loop, server: RegionServer) -> int:
    """The listener's turn; the descriptor of the connection the server took."""
    before = set(server._clients)
    loop.ready(server.sock.fileno())
    (fd,) = set(server._clients) - before
    return fd


def test_clients_that_sent_garbage_and_left_do_not_keep_a_newcomer_out(tmp_path: Path) -> None:
    loop = Loop()
    server = RegionServer(tmp_path / "regions.sock", RegionTable(), loop.watch)
    try:
        for _ in range(MAX_CLIENTS):  # each sends a bad packet, is paused for it, and hangs up at once
            with connect(server.path) as client:
                fd = accept(loop, server)
                client.send(b"not json")
                loop.ready(fd)
                assert json.loads(client.recv(4096))["ok"] is False and fd in server._paused
        assert len(server._clients) == MAX_CLIENTS  # still paused, so their hang-up is not read yet
        with connect(server.path) as newcomer:
            fd = accept(loop, server)
            newcomer.send(json.dumps({"op": "unregister", "region": "nosuch"}).encode())
            loop.ready(fd)
            answer = json.loads(newcomer.recv(4096))
            assert "clients hold shared memory already" not in answer.get("error", ""), answer
            assert server.counts["refused_connections"] == 0 and len(server._clients) == 1
    finally:
        server.close()
