"""Attackers that re-open what the daemon drops: slowloris on the metrics port from many loopback
addresses, and peers of regions.sock that keep sending packets it refuses.

Each runs on a thread of its own (`start`, `stop`); the hostile-clients benchmark runs them in an
attacker process. Linux routes all of 127.0.0.0/8 to loopback, so binding a connection's source to
127.0.0.2 ... 127.0.0.9 makes as many distinct peers as the daemon can tell.
"""

from __future__ import annotations

import random
import select
import socket
import threading
import time

LOOPBACK_PEERS = tuple(f"127.0.0.{i}" for i in range(2, 10))
_DRIP = b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 60_000


class ChurningSlowloris:
    """`per_address` connections from each of `addresses` to the metrics port, each sending one byte
    of a request that never ends every `drip_s`, and re-opened within `reopen_s` of being dropped
    (answered, closed or refused)."""

    def __init__(self, port: int, addresses: tuple[str, ...] = LOOPBACK_PEERS, per_address: int = 8,
                 drip_s: float = 0.2, reopen_s: float = 0.5) -> None:
        self.port, self.drip_s, self.reopen_s = port, drip_s, reopen_s
        self.sources = [a for a in addresses for _ in range(per_address)]
        self.dropped = 0  # connections the daemon ended (each one re-opened)
        self.open = 0  # connections open now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def start(self) -> "ChurningSlowloris":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _open(self, source: str) -> socket.socket | None:
        conn = socket.socket()
        try:
            conn.bind((source, 0))
            conn.connect(("127.0.0.1", self.port))
        except OSError:
            conn.close()
            return None
        conn.setblocking(False)
        return conn

    def _run(self) -> None:
        rng = random.Random(7)
        conns: dict[int, socket.socket | None] = {i: self._open(s) for i, s in enumerate(self.sources)}
        sent = dict.fromkeys(conns, 0)
        due: dict[int, float] = {}  # dropped ones: when they are re-opened
        next_drip = time.monotonic()
        while not self._stop.is_set():
            live = [c for c in conns.values() if c is not None]
            self.open = len(live)
            readable = select.select(live, [], [], 0.02)[0] if live else []
            now = time.monotonic()
            for i, conn in conns.items():
                if conn is not None and conn in readable:  # a 503, or the end: dropped
                    conn.close()
                    conns[i], due[i] = None, now + rng.uniform(0.05, self.reopen_s)
                    self.dropped += 1
            for i, when in list(due.items()):
                if now >= when:
                    del due[i]
                    conns[i], sent[i] = self._open(self.sources[i]), 0
                    if conns[i] is None:
                        due[i] = now + self.reopen_s
            if now >= next_drip:
                next_drip = now + self.drip_s
                for i, conn in conns.items():
                    if conn is not None:
                        try:
                            sent[i] += conn.send(_DRIP[sent[i]:sent[i] + 1])
                        except OSError:
                            pass  # seen as readable (its end) on the next turn
        for conn in conns.values():
            if conn is not None:
                conn.close()


class ChattyRegionPeers:
    """`count` connections to regions.sock, each sending a packet the daemon refuses every `every_s`
    and reading the answer; one the daemon closes is re-opened at once."""

    def __init__(self, path: str, count: int = 64, every_s: float = 0.3) -> None:
        self.path, self.count, self.every_s = path, count, every_s
        self.refused = 0  # refusals read
        self.dropped = 0  # connections the daemon closed (each one re-opened)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chatty-regions", daemon=True)

    def start(self) -> "ChattyRegionPeers":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _open(self) -> socket.socket | None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self.path)
        except OSError:
            conn.close()
            return None
        conn.setblocking(False)
        return conn

    def _run(self) -> None:
        conns: list[socket.socket | None] = [self._open() for _ in range(self.count)]
        while not self._stop.is_set():
            for i, conn in enumerate(conns):
                try:
                    if conn is None:
                        raise ConnectionResetError
                    conn.send(b'{"op": "unregister", "region": "not-mine"}')
                except OSError:
                    if conn is not None:
                        conn.close()
                        self.dropped += 1
                    conns[i] = self._open()
            if self._stop.wait(self.every_s):
                break
            for conn in conns:
                self._drain(conn)
        for conn in conns:
            if conn is not None:
                conn.close()

    def _drain(self, conn: socket.socket | None) -> None:
        while conn is not None:
            try:
                answer = conn.recv(4096)
            except OSError:
                return
            if not answer:
                return  # closed: the next send fails and re-opens it
            self.refused += b'"ok": false' in answer
