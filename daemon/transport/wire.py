"""The frontend's socket calls: compiled where the extension was built, pyzmq's otherwise.

The frontend makes three calls on its ROUTER for every request: is a
message waiting, receive it, send the reply. Through pyzmq each frame of
a message is a Python call and a Frame object; `_wire.c` makes the same
libzmq calls for a whole message in one call, which saves a part of the
frontend's CPU a request that shows at high rates (docs/performance.md). The
extension is optional (packaging/infermux_build.py): without it, or with
INFERMUX_WIRE=python in the environment, the frontend runs pyzmq's calls,
which behave the same. `choose()` says which, and why.

Both kinds give a message as a list of frames, `bytes` under BIG_FRAME
and a memoryview into ZeroMQ's buffer from there on (no copy), with the
descriptor of the connection it came on (-1 where libzmq keeps none, as
on inproc); both raise pyzmq's own exceptions: zmq.Again when nothing
waits or a peer's pipe is full, zmq.ZMQError for the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sized

import zmq

from infermux.transport.multipart import recv_frames, send_frames
from infermux.transport.waiting import message_waiting

# Frames from this size on are parsed in place in ZeroMQ's buffer (no copy into a bytes
# object); smaller ones, headers and envelopes, are cheaper as bytes.
BIG_FRAME = 4096
MAX_FRAMES = 64  # what the compiled send takes in one call; a longer message goes through pyzmq
SRCFD = int(zmq.SRCFD)  # a message's descriptor (Frame.get); a plain int: pyzmq's enum conversion costs more
ENV = "INFERMUX_WIRE"  # "python": pyzmq's calls even where the compiled ones are built


class Wire(Protocol):
    """One socket's receive, send and "is a message waiting", without ever waiting."""

    kind: str  # "compiled" or "python"

    def recv(self) -> tuple[list[Any], int]:
        """The next message's frames and its connection's descriptor (-1: none); zmq.Again if none waits."""

    def send(self, frames: list[Any], copy: bool = True) -> None:
        """Queue `frames` as one message; zmq.Again if the peer's pipe is full (then nothing is queued).
        `copy=False` hands large frames to ZeroMQ without a copy. A frame that is not a buffer raises
        TypeError before any is sent."""

    def waiting(self) -> bool:
        """Whether a message is ready to receive now."""


@dataclass(frozen=True)
class Choice:
    """Which calls the frontend makes, and why: shown by `infermux status`, doctor and the log."""

    compiled: bool
    detail: str
    chosen: bool = False  # pyzmq's calls because INFERMUX_WIRE asked for them, not for want of the compiled ones

    @property
    def kind(self) -> str:
        return "compiled" if self.compiled else "python"

    def describe(self) -> str:
        """One line for people: what runs, and what to do about it."""
        if self.compiled:
            return f"compiled socket calls ({self.detail})"
        return f"pyzmq's socket calls: {self.detail}"


class PyzmqWire:
    """The calls through pyzmq: a call and a Frame per frame."""

    kind = "python"

    def __init__(self, sock: zmq.Socket, identities: bool = False) -> None:
        self.sock = sock
        # With `identities`, each message's User-Id (a CURVE client's key, z85) is kept in `user_id`
        # until the next: what `stream_keys = "bound"` holds keys by over CURVE (Server.bind).
        self.identities = identities
        self.user_id: str | None = None

    def recv(self) -> tuple[list[Any], int]:
        parts = recv_frames(self.sock, blocking=False)
        if self.identities:
            self.user_id = user_id(parts)
        return [p.bytes if len(p) < BIG_FRAME else p.buffer for p in parts], source_fd(parts)

    def send(self, frames: list[Any], copy: bool = True) -> None:
        send_frames(self.sock, frames, blocking=False, copy=copy)

    def waiting(self) -> bool:
        return message_waiting(self.sock)


class CompiledWire:
    """The calls through `_wire.c`: one call a message, on the socket pyzmq made."""

    kind = "compiled"

    def __init__(self, sock: zmq.Socket) -> None:
        from infermux.transport import _wire  # importable: `choose()` checked it

        self.sock, self._wire, self._handle = sock, _wire, sock.underlying
        self._python = PyzmqWire(sock)

    def recv(self) -> tuple[list[Any], int]:
        self._open()
        return self._wire.recv(self._handle, BIG_FRAME)

    def send(self, frames: list[Any], copy: bool = True) -> None:
        self._open()
        if not copy or len(frames) > MAX_FRAMES:  # zero-copy sends need pyzmq's release of the buffer
            self._python.send(frames, copy)
            return
        self._wire.send(self._handle, frames)

    def waiting(self) -> bool:
        self._open()
        return bool(self._wire.waiting(self._handle))

    def serve(self, table: dict[bytes, Any], callback: Callable[..., Any], hear: Callable[[int], None],
              dropped: Callable[[Any], None], outbox: Sized, budget: int,
              asked: int) -> tuple[int, tuple[list[Any], int] | None]:
        """The express lane's burst (frontend/express.py; `serve` in _wire.c says what it does)."""
        self._open()
        return self._wire.serve(self._handle, BIG_FRAME, table, callback, hear, dropped, outbox, budget, asked)

    def _open(self) -> None:
        # The handle of a closed socket is freed memory: a call on it would crash the process.
        if self.sock.closed:
            raise zmq.ZMQError(zmq.ENOTSOCK)


def source_fd(parts: list[zmq.Frame]) -> int:
    """The descriptor of the connection message `parts` came on, -1 where libzmq keeps none
    (inproc). Read off the last frame, one from the wire: libzmq 4.3.4 (Debian 12, Ubuntu 22.04)
    gives the identity frame of a message the ROUTER prefetched for a poll no properties."""
    try:
        fd = parts[-1].get(SRCFD)
    except zmq.ZMQError:
        return -1
    return fd if isinstance(fd, int) else -1


def user_id(parts: list[zmq.Frame]) -> str | None:
    """The User-Id the ZAP handler gave the connection message `parts` came on (a CURVE client's
    public key), None where there is none (ipc, plain tcp). Read off the last frame, as source_fd."""
    try:
        value = parts[-1].get("User-Id")
    except zmq.ZMQError:
        return None
    return value or None if isinstance(value, str) else None


_CHOICE: Choice | None = None


def choose() -> Choice:
    """Whether the compiled calls can run in this process (checked once): built, and bound to the
    very libzmq pyzmq loaded; INFERMUX_WIRE=python turns them off."""
    global _CHOICE
    if _CHOICE is None:
        _CHOICE = _check()
    return _CHOICE


def _check() -> Choice:
    if os.environ.get(ENV, "").strip().lower() == "python":
        return Choice(False, f"{ENV}=python is set", chosen=True)
    try:
        from infermux.transport import _wire
    except ImportError:
        return Choice(False, "the compiled module infermux.transport._wire is not installed; install the "
                             "infermux-wire package (Debian), or reinstall infermux where a C compiler and "
                             "Python's headers are present (pip)")
    problems = []
    for path in _libzmq_candidates():
        try:
            version = tuple(_wire.load(str(path), zmq.Again, zmq.ZMQError))
        except Exception as exc:  # a module built for another libzmq must not keep the daemon from serving
            problems.append(f"{path}: {exc}")
            continue
        if version != zmq.zmq_version_info():  # another libzmq than the one that made pyzmq's sockets
            problems.append(f"{path} is libzmq {version}, pyzmq runs {zmq.zmq_version_info()}")
            continue
        return Choice(True, f"libzmq {zmq.zmq_version()} at {path}")
    return Choice(False, "pyzmq's libzmq was not found in this process ("
                  + ("; ".join(problems) or "no libzmq mapped") + "); running pyzmq's calls")


def _libzmq_candidates() -> list[Path]:
    """The shared objects that may hold pyzmq's libzmq: a mapped libzmq (the wheel's bundled copy, or
    the system's), then pyzmq's compiled backend itself, where a build linked libzmq in statically."""
    found: list[Path] = []
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        path = Path(fields[5]) if len(fields) == 6 and fields[5].startswith("/") else None
        if path is not None and "libzmq" in path.name and ".so" in path.name and path not in found:
            found.append(path)
    backend = getattr(getattr(zmq, "backend", None), "cython", None)
    module = getattr(getattr(backend, "_zmq", None), "__file__", None)
    if module:
        found.append(Path(module))
    return found


def wire_for(sock: zmq.Socket, choice: Choice | None = None) -> Wire:
    """The calls `sock` gets: compiled where `choice` (default: `choose()`) allows."""
    choice = choice or choose()
    return CompiledWire(sock) if choice.compiled else PyzmqWire(sock)
