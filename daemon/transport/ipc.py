"""ipc:// socket files: made, guarded by permissions, removed.

Local sockets are the daemon's access control: files mode 0660, group
`infermux` when that group exists, so only its members reach the GPU.
A socket file is made under umask 077 (`private_files`), so that at bind
only the daemon's own user may connect; it is then given to its group
and only after that opened to the group (`secure`): a connection made in
between would stay open after the permissions change, and with the
unit's `UMask=0007` admin.sock used to be the clients' group's until the
chown.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Iterator

log = logging.getLogger("infermux.ipc")

GROUP = "infermux"
# What the unit's RuntimeDirectory= makes (/run/infermux, 0750): members of
# the group reach the sockets, nobody else lists them.
DIR_MODE = 0o750


def path_of(endpoint: str) -> Path | None:
    """The socket file of an ipc:// endpoint (None for tcp and abstract sockets)."""
    if not endpoint.startswith("ipc://") or endpoint.startswith("ipc://@"):
        return None
    return Path(endpoint[len("ipc://"):])


class UnsafeDirectory(PermissionError):
    """A socket file's directory that every user may write (docs/security.md, "runtime directory")."""


def unsafe_directory(path: Path, risk: str = "another user could put a socket of their own there") -> str | None:
    """Why sockets must not be bound, or connected to, in folder `path`, or None.

    Every user may write it (mode o+w): another user can then put a socket of
    their own under the name a client connects to, or in place of the
    daemon's, and read what clients send. The sticky bit (/tmp) does not make
    it safe: it keeps others from removing or renaming an existing file, not
    from making one first, while the daemon is stopped or before it binds.
    A folder that does not exist (yet) is judged when it does.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if not mode & stat.S_IWOTH:
        return None
    sticky = ", sticky" if mode & stat.S_ISVTX else ""
    return (f"{path} is writable by every user (mode {stat.S_IMODE(mode):o}{sticky}): {risk}; "
            f"use a folder only the daemon's user (and group) may write, e.g. mode 0750")


def check_directory(endpoint: str) -> None:
    """UnsafeDirectory when an ipc:// endpoint's socket lies in a folder every user may write; the daemon
    checks before it binds, a client before it connects (tcp:// and abstract sockets have no folder)."""
    path = path_of(endpoint)
    why = unsafe_directory(path.parent) if path is not None else None
    if why:
        raise UnsafeDirectory(f"refusing {endpoint}: {why}")


def prepare(endpoint: str) -> None:
    """Create the folder the socket file goes in, and refuse one every user may write."""
    path = path_of(endpoint)
    if path is not None:
        make_dir(path.parent)
        check_directory(endpoint)


def make_dir(path: Path) -> None:
    """Create a folder for socket files as systemd would: mode 0750, group `infermux`.

    Started by hand (no RuntimeDirectory=), the daemon makes its runtime
    folder itself. A folder that exists is left as it is: systemd or the
    operator chose its mode and owner.
    """
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=DIR_MODE)
    except FileExistsError:
        return  # another process made it meanwhile
    os.chmod(path, DIR_MODE)  # mkdir's mode went through the umask
    _give_to_group(path)


_umask_lock = threading.Lock()  # umask is the process's: one private_files at a time


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Files (socket files) created meanwhile are the daemon's user's alone: umask 077, restored
    after. Wrap the bind that creates a socket file, then `secure` it."""
    with _umask_lock:
        before = os.umask(0o077)
        try:
            yield
        finally:
            os.umask(before)


def secure(endpoint: str, group: str = GROUP) -> None:
    """`group` (when it exists), then mode 0660, on a socket file bound under `private_files`:
    in that order, nobody outside `group` can connect at any moment.

    An abstract socket (`ipc://@name`) has no file, so nothing guards it:
    the daemon says so at start (config.py refuses one for admin).
    """
    if endpoint.startswith("ipc://@"):
        log.warning("%s is an abstract socket: no file permission guards it, so any local user "
                    "(in this network namespace) can connect; use an ipc:// path", endpoint)
        return
    path = path_of(endpoint)
    if path is None:
        return
    bound(endpoint)
    _give_to_group(path, group)
    os.chmod(path, 0o660)


def _give_to_group(path: Path, group: str = GROUP) -> None:
    if not group:
        return  # configured off: the file keeps the daemon's own group
    try:
        os.chown(path, -1, grp.getgrnam(group).gr_gid)
    except (KeyError, PermissionError):
        pass  # no such group (a developer box), or not ours to give


# The socket files this process bound (secure() runs right after each bind), by inode: remove()
# deletes only those, never a file another daemon bound at the same path since.
_created: dict[Path, int] = {}


def bound(endpoint: str) -> None:
    """Note that this process just bound `endpoint`, so that remove() may delete its file."""
    path = path_of(endpoint)
    if path is not None:
        _created[path] = os.stat(path).st_ino


def remove(endpoint: str) -> None:
    """Delete the socket file of `endpoint` if it is still the one this process bound."""
    path = path_of(endpoint)
    ours = _created.pop(path, None) if path is not None else None
    if path is None or ours is None:
        return
    try:
        if os.stat(path).st_ino == ours:
            path.unlink()
    except FileNotFoundError:
        pass
