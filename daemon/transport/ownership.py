"""One daemon per socket: a lock beside each ipc:// socket file, and one in the runtime directory.

libzmq unlinks whatever file sits where it binds an ipc:// socket, so a second
daemon started with the same configuration would take the first one's sockets
over without a word, and delete them when it stops. Before binding, the daemon
therefore takes an flock(2) on `<socket>.lock` for each ipc:// endpoint and on
`daemon.lock` in the runtime directory (workers' sockets and stale shared
memory are swept from there). The kernel drops the locks of a daemon that was
killed, so its stale socket files are taken over; a socket file that a live
process still listens on without the lock (an older daemon, another program)
is refused too, naming that process (SO_PEERCRED).

Lock files stay behind on purpose: unlinking one while another process waits
on it would let two processes hold "the" lock at once.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import struct
from pathlib import Path
from typing import Iterable

from infermux.transport import ipc

log = logging.getLogger("infermux.ipc")

DIR_LOCK = "daemon.lock"
SOCKETS_REMEDY = "give this one other sockets ([daemon] listen, admin, stats) and another --runtime-dir"


class SocketsTaken(RuntimeError):
    """Another live daemon (or program) holds a socket or the runtime directory this one needs."""

    def __init__(self, pid: int | None, what: str, remedy: str = SOCKETS_REMEDY) -> None:
        who = f"pid {pid}" if pid else "a process whose pid is unknown"
        super().__init__(f"another infermux daemon ({who}) already serves {what}; stop it first "
                         f"(`systemctl stop infermux`, or `kill {pid or 'PID'}`), or {remedy}")
        self.pid = pid
        self.what = what


class Ownership:
    """The locks this daemon holds; released (closed) when it stops or dies."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def take(self, lock_path: Path, what: str, remedy: str = SOCKETS_REMEDY) -> None:
        """Lock `lock_path` (created if missing, never through a symlink) and write our pid in it;
        SocketsTaken if held."""
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(fd)
            os.close(fd)
            raise SocketsTaken(pid, what, remedy) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fds.append(fd)

    def release(self) -> None:
        """Drop every lock (the kernel does the same for a daemon that is killed)."""
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def claim(run_dir: Path, endpoints: Iterable[str]) -> Ownership:
    """Take the runtime directory and every ipc:// endpoint in `endpoints` for this daemon, and
    clear a stale socket file a killed daemon left; raises SocketsTaken when another one holds any."""
    owned = Ownership()
    try:
        owned.take(run_dir / DIR_LOCK, f"the runtime directory {run_dir}")
        for endpoint in endpoints:
            path = ipc.path_of(endpoint)
            if path is None:
                continue  # tcp:// and abstract sockets: bind itself fails when another holds them
            ipc.prepare(endpoint)
            owned.take(path.with_name(path.name + ".lock"), endpoint)
            _clear_stale(path, endpoint)
    except BaseException:
        owned.release()
        raise
    return owned


def _clear_stale(path: Path, endpoint: str) -> None:
    """With the lock held: a socket file nobody listens on is a killed daemon's, and removed; one a
    process still accepts on belongs to a daemon that takes no lock, and is left alone."""
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOTSOCK, errno.EPROTOTYPE):
            raise
        log.info("%s was left by a daemon that stopped without removing it (killed?): taking it over", path)
        path.unlink(missing_ok=True)
        return
    else:
        raise SocketsTaken(_peer_pid(probe), endpoint)
    finally:
        probe.close()


def _peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process listening at the other end of a connected unix socket."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, _, _ = struct.unpack("3i", creds)
    return pid or None


def _pid_in(fd: int) -> int | None:
    """The pid the holder of a lock file wrote in it."""
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None
