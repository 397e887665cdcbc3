"""The snapshots' folder under the state directory: safe names, writes that follow no link, pruning.

Every name in it is made here from a sanitized form of untrusted text (a
camera's name, a stream key, a label): letters, digits, `-`, `_` and `.`,
never a leading dot, at most NAME_CHARS, and a short hash of the original
where anything was changed (so `a/b` and `a_b` stay apart). Folders are
opened one level at a time with O_NOFOLLOW relative to their parent's
descriptor and files created with O_EXCL | O_NOFOLLOW under a temporary
name, then renamed into place: a link planted in the folder is never
followed, and a reader never sees half a file. Files are 0640, folders
0750 (the daemon's group may read them).

Pruning keeps the folder under `max_bytes` (the oldest files go first) and
removes files older than `keep_s`; it only ever unlinks regular files it
finds by walking the folder without following links.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

NAME_CHARS = 64
UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TEMP_PREFIX = ".tmp-"  # a file left half-written by a crash: pruned like any other


def safe_name(text: str) -> str:
    """`text` as a file name that is one component, printable ASCII, and not hidden."""
    cleaned = UNSAFE.sub("_", text).lstrip(".")[:NAME_CHARS] or "_"
    if cleaned != text:
        cleaned = f"{cleaned[:NAME_CHARS - 9]}-{hashlib.sha256(text.encode('utf-8', 'replace')).hexdigest()[:8]}"
    return cleaned


@dataclass
class Entry:
    """A file of the folder: where it is (relative), its size and modification time."""

    path: str
    size: int
    mtime: float


class SnapFolder:
    """The folder `root` (made 0750 where missing); `write` puts a file in a sub-folder, `prune` bounds it."""

    def __init__(self, root: Path, max_bytes: int, keep_s: float) -> None:
        self.root, self.max_bytes, self.keep_s = root, max_bytes, keep_s
        self.pruned = 0  # files removed by size or age

    def write(self, folder: str, name: str, data: bytes) -> Path:
        """Write `data` as `folder/name` (both already safe names), replacing a file of that name."""
        root = self._open_root()
        try:
            sub = _open_dir(root, folder, create=True)
            try:
                temp = f"{TEMP_PREFIX}{os.getpid()}-{time.monotonic_ns()}"
                fd = os.open(temp, FILE_FLAGS, 0o640, dir_fd=sub)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
                os.rename(temp, name, src_dir_fd=sub, dst_dir_fd=sub)  # replaces a link, never follows it
            finally:
                os.close(sub)
        finally:
            os.close(root)
        return self.root / folder / name

    def _open_root(self) -> int:
        self.root.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        parent = os.open(self.root.parent, DIR_FLAGS)
        try:
            return _open_dir(parent, self.root.name, create=True)
        finally:
            os.close(parent)

    def entries(self) -> list[Entry]:
        """Every regular file under the folder (links and other things are left alone)."""
        out: list[Entry] = []
        try:
            with os.scandir(self.root) as folders:
                for folder in folders:
                    if folder.is_dir(follow_symlinks=False):
                        out.extend(_files(Path(folder.path), folder.name))
        except FileNotFoundError:
            pass
        return out

    def prune(self, now: float | None = None) -> int:
        """Remove files older than keep_s, then the oldest until the rest fit max_bytes; how many went."""
        now = time.time() if now is None else now
        entries = sorted(self.entries(), key=lambda e: e.mtime)
        gone = [e for e in entries if now - e.mtime > self.keep_s]
        kept = [e for e in entries if now - e.mtime <= self.keep_s]
        total = sum(e.size for e in kept)
        for entry in kept:
            if total <= self.max_bytes:
                break
            gone.append(entry)
            total -= entry.size
        removed = sum(1 for entry in gone if self._unlink(entry.path))
        self.pruned += removed
        return removed

    def _unlink(self, relative: str) -> bool:
        folder, _, name = relative.partition("/")
        try:
            root = os.open(self.root, DIR_FLAGS)
            try:
                sub = _open_dir(root, folder, create=False)  # a folder swapped for a link since: refused
                try:
                    os.unlink(name, dir_fd=sub)
                finally:
                    os.close(sub)
            finally:
                os.close(root)
        except OSError:
            return False
        return True


def _open_dir(parent: int, name: str, create: bool) -> int:
    """Folder `name` of the folder open as `parent`, made 0750 if missing; a link there is refused."""
    try:
        return _open_one(parent, name)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, 0o750, dir_fd=parent)
    except FileExistsError:
        pass
    return _open_one(parent, name)


def _open_one(parent: int, name: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(exc.errno, f"{name!r} in the snapshots' folder is not a folder (a link?): left alone") \
                from None
        raise


def _files(folder: Path, name: str) -> list[Entry]:
    out = []
    try:
        with os.scandir(folder) as files:
            for item in files:
                info = item.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):
                    out.append(Entry(f"{name}/{item.name}", info.st_size, info.st_mtime))
    except OSError:
        pass
    return out
