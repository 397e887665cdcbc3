"""ipc:// socket files: made, guarded by permissions, removed.

Local sockets are the daemon's access control: files mode 0660, group
`infermux` when that group exists, so only its members reach the GPU.
"""

from __future__ import annotations

import grp
import os
from pathlib import Path

GROUP = "infermux"


def path_of(endpoint: str) -> Path | None:
    """The socket file of an ipc:// endpoint (None for tcp and abstract sockets)."""
    if not endpoint.startswith("ipc://") or endpoint.startswith("ipc://@"):
        return None
    return Path(endpoint[len("ipc://"):])


def prepare(endpoint: str) -> None:
    """Create the folder the socket file goes in."""
    path = path_of(endpoint)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def secure(endpoint: str) -> None:
    """Mode 0660 and group `infermux` (when it exists) on a freshly bound socket file."""
    path = path_of(endpoint)
    if path is None:
        return
    os.chmod(path, 0o660)
    try:
        os.chown(path, -1, grp.getgrnam(GROUP).gr_gid)
    except (KeyError, PermissionError):
        pass  # no such group (a developer box), or not ours to give


def remove(endpoint: str) -> None:
    path = path_of(endpoint)
    if path is not None:
        path.unlink(missing_ok=True)
