"""The fast lane: one SOCK_SEQPACKET socketpair between the daemon and a worker.

The worker's ZeroMQ pipes (wire.py) carry a message across four
threads: the sender, its ZeroMQ I/O thread, the receiver's I/O thread and
the receiver. On a 2-core edge box every one of those wake-ups waits for a
CPU. Requests and replies, the messages on every cold request's path, take
this lane instead when they fit in one packet: the sending thread writes
the packet, and the receiving thread, woken by poll on the socket, reads it.

The lane never blocks. A message that is too big, or that finds the
socket's buffer full, is refused (`send` returns False) and the caller
sends it through ZeroMQ, which queues without a limit. Messages on the two
paths may overtake each other; requests and replies are matched by their
sequence number, so that is harmless (docs/decisions.md).

A packet is: frame count (u16), each frame's length (u32), the frames.
A packet may also carry one file descriptor (`send_fd`): the daemon hands
its worker a client's shared-memory region that way (regions.py).
"""

from __future__ import annotations

import array
import os
import select
import socket
import struct
from collections import deque
from typing import Any, Sequence

MAX_PACKET = 96 * 1024  # inline tensors (wire.INLINE_MAX_BYTES) plus their meta fit
_COUNT = struct.Struct("<H")
_FD_SPACE = socket.CMSG_SPACE(array.array("i").itemsize)  # room for one descriptor
_SNDBUF = 1 << 20  # the kernel caps this at net.core.wmem_max; more room only means fewer refusals


class LaneClosed(Exception):
    """The other process closed its end (it exited or crashed)."""


class Lane:
    """One end of the socketpair; `send` from any thread, `recv` from one thread at a time."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
        except OSError:
            pass
        self.sock = sock
        self.fds: deque[int] = deque()  # descriptors that came with packets, oldest first (take_fd)
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    @classmethod
    def pair(cls) -> tuple["Lane", socket.socket]:
        """The daemon's end, and the socket whose fd the worker inherits."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(mine), theirs

    @classmethod
    def from_fd(cls, fd: int) -> "Lane":
        """The worker's end, from the fd it inherited."""
        return cls(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=fd))

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, frames: Sequence[Any]) -> bool:
        """Send `frames` as one packet; False if they do not fit now (use the slow path)."""
        return self._send(frames, [])

    def send_fd(self, frames: Sequence[Any], fd: int) -> bool:
        """Send `frames` with a duplicate of `fd` (SCM_RIGHTS); False if it cannot go now."""
        return self._send(frames, [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])

    def _send(self, frames: Sequence[Any], ancillary: list[Any]) -> bool:
        views = [memoryview(f) for f in frames]
        sizes = [v.nbytes for v in views]
        head = _COUNT.pack(len(views)) + struct.pack(f"<{len(views)}I", *sizes)
        if len(head) + sum(sizes) > MAX_PACKET:
            return False
        try:
            self.sock.sendmsg([head, *views], ancillary, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False  # the buffer is full: the slow path queues it
        except OSError:
            return False  # the peer is gone (EPIPE) or the packet is too big (EMSGSIZE)
        return True

    def recv(self) -> list[Any] | None:
        """The next message (frame 0 as bytes, the rest as memoryviews), or None if none waits.

        Raises LaneClosed once the other end is closed and every packet was read."""
        try:
            data, ancillary, _, _ = self.sock.recvmsg(MAX_PACKET, _FD_SPACE)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            raise LaneClosed(str(exc)) from None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
                self.fds.extend(fds)
        if not data:
            raise LaneClosed("the other end closed")
        count = _COUNT.unpack_from(data)[0]
        sizes = struct.unpack_from(f"<{count}I", data, _COUNT.size)
        view, at = memoryview(data), _COUNT.size + 4 * count
        frames: list[Any] = []
        for size in sizes:
            frames.append(view[at:at + size])
            at += size
        if frames:
            frames[0] = bytes(frames[0])  # the kind byte and JSON: json.loads wants bytes
        return frames

    def readable(self) -> bool:
        """Whether a packet (or the end) is waiting, without reading it."""
        return bool(self._poll.poll(0))

    def take_fd(self) -> int | None:
        """The oldest descriptor received and not yet taken (the caller closes it)."""
        return self.fds.popleft() if self.fds else None

    def close(self) -> None:
        self.sock.close()
        while self.fds:
            os.close(self.fds.popleft())
