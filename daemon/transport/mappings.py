"""The memory behind shared-memory regions: a client's memfd checked and mapped, the daemon's table
of them that requests are read through, and a worker's mappings of the same memfds.

regions.py is the registration socket that fills the table; docs there say why regions are memfds
sealed against shrinking, and what a client sends.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import secrets
import stat
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from infermux.protocol import ProtocolError, Status

log = logging.getLogger("infermux.regions")

MAX_REGION_BYTES = 1 << 32


@dataclass
class Region:
    """One registered memfd, mapped in the daemon: writable unless its owner sealed it (F_SEAL_WRITE)."""

    token: str
    name: str
    size: int
    fd: int
    view: memoryview  # read-only, for inputs; numpy arrays on it keep the mapping alive
    owner: int  # the registering connection's fd
    out: memoryview | None = None  # the same mapping, writable, for outputs
    # The memfd opened again, read-only: an open file description of the daemon's own, whose file
    # position `_first_hole` may move (`fd` shares the client's); -1 where it could not be opened.
    probe: int = -1


@dataclass
class RegionTable:
    """Every registered region by token; looked up on the frontend thread for each request."""

    regions: dict[str, Region] = field(default_factory=dict)
    # What the registration socket did to connections and packets (RegionServer shares this dict).
    counts: dict[str, int] = field(default_factory=dict)
    _listeners: dict[int, Callable[[str], None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def view(self, token: str, offset: int, nbytes: int) -> memoryview:
        """`nbytes` at `offset` in region `token` (protocol.RegionLookup)."""
        region = self.regions.get(token)
        if region is None:
            raise ProtocolError(Status.BAD_REQUEST, f"no shared-memory region {token[:40]!r}: it was never "
                                "registered or its client closed it; register it again (client.SharedMemory)")
        if offset < 0 or offset + nbytes > region.size:
            raise ProtocolError(Status.BAD_REQUEST, f"bytes {offset}..{offset + nbytes} are outside region "
                                f"{region.name or token[:8]!r} of {region.size} bytes")
        absent = _first_hole(region.probe, offset, nbytes)
        if absent is not None:  # reading it would allocate pages, for the daemon
            raise ProtocolError(Status.BAD_REQUEST, f"bytes {offset}..{offset + nbytes} of region "
                                f"{region.name or token[:8]!r} were never written from byte {absent} (a hole in "
                                "the memfd): write the input before sending the request")
        return region.view[offset:offset + nbytes]

    def writable(self, token: str, offset: int) -> memoryview:
        """The region from `offset` on, for outputs (protocol.RegionLookup)."""
        region = self.regions.get(token)
        if region is None:
            self.view(token, offset, 0)  # raises, saying why
        assert region is not None
        if region.out is None:
            raise ProtocolError(Status.BAD_REQUEST, f"region {region.name or token[:8]!r} is sealed against "
                                "writes (F_SEAL_WRITE): outputs cannot go there; register one without that seal")
        if not 0 <= offset < region.size:
            raise ProtocolError(Status.BAD_REQUEST, f"output offset {offset} is outside region "
                                f"{region.name or token[:8]!r} of {region.size} bytes")
        return region.out[offset:]

    def with_fd(self, token: str, use: Callable[[int], bool]) -> bool:
        """`use(fd)` with region `token`'s descriptor, which stays open meanwhile (a request may be
        submitted on another thread while the frontend drops the region); False if it is gone."""
        with self._lock:
            region = self.regions.get(token)
            return region is not None and use(region.fd)

    def add(self, region: Region) -> None:
        with self._lock:
            self.regions[region.token] = region

    def drop(self, token: str) -> None:
        """Forget a region: the fd is closed, workers that mapped it are told. Arrays still
        being read keep the daemon's mapping until they are done."""
        with self._lock:
            region = self.regions.pop(token, None)
            if region is None:
                return
            os.close(region.fd)
            if region.probe >= 0:
                os.close(region.probe)
            listeners = list(self._listeners.values())
        for listener in listeners:  # outside the lock: a listener takes its proxy's lock
            listener(token)

    def owned_by(self, owner: int) -> list[str]:
        return [t for t, r in self.regions.items() if r.owner == owner]

    def subscribe(self, key: int, on_drop: Callable[[str], None]) -> None:
        """Call `on_drop(token)` whenever a region goes (a worker proxy unmaps it in its worker)."""
        with self._lock:
            self._listeners[key] = on_drop

    def unsubscribe(self, key: int) -> None:
        with self._lock:
            self._listeners.pop(key, None)

    def info(self) -> dict[str, Any]:
        """For the admin `status` view: how many regions, and their bytes."""
        regions = list(self.regions.values())
        return {"regions": len(regions), "bytes": sum(r.size for r in regions),
                "clients": len({r.owner for r in regions}), **self.counts}



class MappedRegions:
    """A worker's mappings of its clients' regions, by token (MAP and UNMAP from the daemon)."""

    def __init__(self) -> None:
        self._views: dict[str, tuple[memoryview, memoryview | None]] = {}
        self._gone: deque[str] = deque(maxlen=256)  # an UNMAP that overtook its MAP (lane vs pipe)

    def map(self, token: str, fd: int) -> None:
        try:
            if token not in self._gone:
                # The daemon checked the seal: it cannot shrink.
                self._views[token] = _mapped(fd, os.fstat(fd).st_size)
        except (OSError, ValueError) as exc:  # requests naming it then fail, not the worker
            log.warning("cannot map region %s: %s", token[:8], exc)
        finally:
            os.close(fd)

    def unmap(self, token: str) -> None:
        """Drop the mapping; requests still reading it keep it until they are done."""
        if self._views.pop(token, None) is None:
            self._gone.append(token)

    def view(self, token: str, offset: int, nbytes: int) -> memoryview:
        return self._views[token][0][offset:offset + nbytes]

    def writable(self, token: str, offset: int) -> memoryview:
        out = self._views[token][1]
        if out is None:
            raise KeyError(f"region {token[:8]} is sealed against writes")
        return out[offset:]

    def __len__(self) -> int:
        return len(self._views)


def _first_hole(probe: int, offset: int, nbytes: int) -> int | None:
    """The offset of the first byte of `offset`..`offset + nbytes` that lies in a hole of the memfd
    (a page the client never wrote or allocated: reading it through the mapping would make the
    kernel allocate one, for the daemon), or None. SEEK_HOLE asks the file, not this process's page
    tables: a page the client wrote that has since gone to swap is data, not a hole."""
    if probe < 0 or not nbytes:
        return None
    try:
        hole = os.lseek(probe, offset, os.SEEK_HOLE)
    except OSError:  # cannot tell: read it as before
        return None
    return max(offset, hole) if hole < offset + nbytes else None


def _reopened(fd: int) -> int:
    """A read-only descriptor of the memfd behind `fd` with an open file description of its own
    (so that seeking it never moves the client's file position), or -1 without /proc. A full
    descriptor table is raised: the registration is refused rather than left unchecked."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise
        return -1


def map_memfd(fd: int, name: str, owner: int) -> Region:
    """Check that `fd` is a memfd sealed against shrinking, and map it (_mapped)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("the descriptor is not a memfd (os.memfd_create with MFD_ALLOW_SEALING)")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise ValueError("the descriptor cannot be sealed: create it with "
                         "os.memfd_create(name, os.MFD_ALLOW_SEALING)") from None
    if not seals & fcntl.F_SEAL_SHRINK:
        raise ValueError("seal the memfd against shrinking first (fcntl F_ADD_SEALS, F_SEAL_SHRINK): "
                         "a region cut short under a read would crash the daemon")
    if not 0 < info.st_size <= MAX_REGION_BYTES:
        raise ValueError(f"a region holds 1 to {MAX_REGION_BYTES} bytes; this one has {info.st_size}")
    view, out = _mapped(fd, info.st_size)
    probe = _reopened(fd)
    try:
        kept = os.dup(fd)
    except OSError:
        if probe >= 0:
            os.close(probe)
        raise
    return Region(secrets.token_hex(16), name, info.st_size, kept, view, owner, out, probe)


def _mapped(fd: int, size: int) -> tuple[memoryview, memoryview | None]:
    """A read-only view for inputs and, unless the memfd is sealed against writes, a writable one."""
    try:
        out = memoryview(mmap.mmap(fd, size, prot=mmap.PROT_READ | mmap.PROT_WRITE))
    except PermissionError:  # F_SEAL_WRITE (EPERM), or a descriptor opened read-only (EACCES)
        return memoryview(mmap.mmap(fd, size, prot=mmap.PROT_READ)), None
    return out.toreadonly(), out
