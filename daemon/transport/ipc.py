"""ipc:// socket files: made, guarded by permissions, removed.

Local sockets are the daemon's access control: files mode 0660, group
`infermux` when that group exists, so only its members reach the GPU.
"""

from __future__ import annotations

import grp
import logging
import os
from pathlib import Path

log = logging.getLogger("infermux.ipc")

GROUP = "infermux"
# admin.sock's group by default: who may drain the daemon or unload models is not every
# camera pipeline that may run them ([daemon] admin_group, docs/security.md).
ADMIN_GROUP = "infermux-admin"
# What the unit's RuntimeDirectory= makes (/run/infermux, 0750): members of
# the group reach the sockets, nobody else lists them.
DIR_MODE = 0o750


def path_of(endpoint: str) -> Path | None:
    """The socket file of an ipc:// endpoint (None for tcp and abstract sockets)."""
    if not endpoint.startswith("ipc://") or endpoint.startswith("ipc://@"):
        return None
    return Path(endpoint[len("ipc://"):])


def prepare(endpoint: str) -> None:
    """Create the folder the socket file goes in."""
    path = path_of(endpoint)
    if path is not None:
        make_dir(path.parent)


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


def secure(endpoint: str, group: str = GROUP) -> None:
    """Mode 0660 and `group` (when it exists) on a freshly bound socket file.

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
    os.chmod(path, 0o660)
    _give_to_group(path, group)


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
