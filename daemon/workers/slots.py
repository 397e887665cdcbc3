"""Shared-memory slots: how tensors cross between the daemon and its workers.

A slot is one file in /dev/shm that both processes map. The daemon writes a
request's input frames into a free slot and sends only the slot's name and
offsets over ZeroMQ; the worker computes on numpy views of the mapping and
writes the outputs back into the same slot (the inputs are dead by then).
A 4.9 MB tensor then costs one memcpy each way instead of two socket copies
(docs/architecture.md#measured-facts).

Slots are reused (their pages stay faulted in), bounded by the number of
requests a worker may have in flight, trimmed when idle, and unlinked on
every exit path: by the daemon when a worker stops or crashes, by the worker
when its daemon vanishes, and by the next daemon's `sweep_stale()` for
whatever a SIGKILL left. Names carry the daemon's pid for that sweep:
`infermux-<daemon pid>-<worker id>-<n>`.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from infermux.events import Throttle

log = logging.getLogger("infermux.shm")
_NO_ROOM = Throttle(first=1, interval_s=60.0)  # one line a minute while /dev/shm stays full

# INFERMUX_SHM_DIR: a test gives its daemon a directory of its own, out of reach of the
# sweep of every other daemon starting on the box (sweep_stale).
SHM_DIR = Path(os.environ.get("INFERMUX_SHM_DIR") or "/dev/shm")
PREFIX = "infermux-"
ALIGN = 64  # offsets of tensors inside a slot: cache-line and SIMD friendly
GRAIN = 64 * 1024  # slot sizes are rounded up to this, so near sizes share slots


def aligned(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of consecutive, aligned tensors of `sizes` bytes, and the bytes they span."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end = aligned(end + size)
    return offsets, end


@dataclass(eq=False)
class Slot:
    """One mapped /dev/shm file."""

    name: str
    size: int
    mm: mmap.mmap
    view: memoryview
    idle_since: float = field(default_factory=time.monotonic)

    @classmethod
    def create(cls, name: str, size: int) -> "Slot":
        fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            # Reserve the pages now: writing into a mapping of a full tmpfs (Docker's 64 MB
            # /dev/shm) raises SIGBUS, which would kill the daemon; this raises ENOSPC instead.
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(SHM_DIR / name)
            raise
        finally:
            os.close(fd)
        return cls(name, size, mm, memoryview(mm))

    @classmethod
    def attach(cls, name: str) -> "Slot":
        """Map a slot another process created (the worker's side)."""
        fd = os.open(SHM_DIR / name, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            # MAP_POPULATE: fault every page in now, not on each request's first touch.
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
        return cls(name, size, mm, memoryview(mm))

    def close(self) -> None:
        """Unmap, unless a zero-copy send still reads it (then the last reference unmaps)."""
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            pass

    def unlink(self) -> None:
        try:
            os.unlink(SHM_DIR / self.name)
        except FileNotFoundError:
            pass


class SlotPool:
    """The daemon's slots for one worker: reused, bounded, all unlinked by `close`.

    `acquire` runs on the frontend thread, `release` on the worker's reader
    thread; one lock covers both. `on_drop(name)` tells the worker to unmap a
    slot the pool unlinked.
    """

    def __init__(self, tag: str, max_slots: int, on_drop: Callable[[str], None] | None = None) -> None:
        self.tag = tag
        self.max_slots = max_slots
        self._on_drop = on_drop
        self._free: list[Slot] = []
        self._busy: set[Slot] = set()
        self._deferred: list[tuple[Slot, Any]] = []  # (slot, zmq tracker) until zmq is done reading
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._closed = False

    def __len__(self) -> int:
        return len(self._free) + len(self._busy) + len(self._deferred)

    def names(self) -> list[str]:
        with self._lock:
            return [s.name for s in (*self._free, *self._busy, *(s for s, _ in self._deferred))]

    def acquire(self, nbytes: int) -> Slot | None:
        """A slot of at least `nbytes`, or None when every slot is busy or /dev/shm has no room."""
        with self._lock:
            if self._closed:
                return None
            self._collect()
            fitting = [s for s in self._free if s.size >= nbytes]
            if fitting:
                slot = min(fitting, key=lambda s: s.size)
                self._free.remove(slot)
            else:
                if len(self._free) + len(self._busy) + len(self._deferred) >= self.max_slots:
                    if not self._free:
                        return None
                    self._drop(self._free.pop(0))  # too small: replace it by a bigger one
                try:
                    slot = Slot.create(f"{self.tag}-{next(self._numbers)}", aligned(max(nbytes, 1), GRAIN))
                except OSError as exc:  # /dev/shm full or missing: the caller sends inline
                    held = _NO_ROOM.admit(exc.strerror or "error")  # a full /dev/shm meets every request
                    if held is not None:
                        log.warning("no shared-memory slot of %d bytes: %s; requests go inline meanwhile%s",
                                    nbytes, exc, f" ({held} more like this not logged)" if held else "")
                    return None
            self._busy.add(slot)
            return slot

    def release(self, slot: Slot, tracker: Any = None) -> None:
        """Give `slot` back; with a zmq `tracker`, only once zmq has sent what it points at."""
        with self._lock:
            self._busy.discard(slot)
            if self._closed:
                self._retire(slot, tracker)
            elif tracker is not None and not tracker.done:
                self._deferred.append((slot, tracker))
            else:
                slot.idle_since = time.monotonic()
                self._free.append(slot)

    def trim(self, idle_s: float, keep: int) -> int:
        """Unlink slots idle for `idle_s` beyond the `keep` most recently used; returns how many."""
        now = time.monotonic()
        with self._lock:
            self._collect()
            self._free.sort(key=lambda s: s.idle_since, reverse=True)
            stale = [s for s in self._free[keep:] if now - s.idle_since > idle_s]
            for slot in stale:
                self._free.remove(slot)
                self._drop(slot)
        return len(stale)

    def close(self) -> None:
        """Unlink every slot; mappings a zero-copy send still reads go when it is done."""
        with self._lock:
            self._closed = True
            slots = [*self._free, *self._busy]
            deferred, self._free, self._busy, self._deferred = self._deferred, [], set(), []
        for slot in slots:
            self._retire(slot, None)
        for slot, tracker in deferred:
            self._retire(slot, tracker)

    def _collect(self) -> None:
        if self._deferred:
            done = [(s, t) for s, t in self._deferred if t.done]
            for slot, tracker in done:
                self._deferred.remove((slot, tracker))
                slot.idle_since = time.monotonic()
                self._free.append(slot)

    def _drop(self, slot: Slot) -> None:
        slot.unlink()
        slot.close()
        if self._on_drop is not None:
            self._on_drop(slot.name)

    @staticmethod
    def _retire(slot: Slot, tracker: Any) -> None:
        slot.unlink()  # the name goes now; the pages go with the last mapping
        if tracker is None or tracker.done:
            slot.close()


class SlotCache:
    """The worker's mappings of its daemon's slots, by name (mapped once, reused)."""

    def __init__(self) -> None:
        self._slots: dict[str, Slot] = {}

    def get(self, name: str) -> Slot:
        slot = self._slots.get(name)
        if slot is None:
            slot = self._slots[name] = Slot.attach(name)
        return slot

    def forget(self, name: str) -> None:
        slot = self._slots.pop(name, None)
        if slot is not None:
            slot.close()

    def unlink_all(self) -> None:
        """The daemon is gone: remove the slots it can no longer remove itself."""
        for slot in self._slots.values():
            slot.unlink()
        self._slots.clear()


def segment_name(daemon_pid: int, worker_id: int) -> str:
    """The name prefix of one worker's slots."""
    return f"{PREFIX}{daemon_pid}-{worker_id}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(directory: Path = SHM_DIR) -> list[str]:
    """Unlink slots left by daemons that no longer run (a SIGKILL gives no chance to clean)."""
    removed: list[str] = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for path in entries:
        if not path.name.startswith(PREFIX):
            continue
        pid_text = path.name[len(PREFIX):].split("-", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            try:
                path.unlink()
                removed.append(path.name)
            except OSError:
                pass
    return removed


def leftovers(daemon_pid: int) -> list[str]:
    """Slot names a daemon still has in /dev/shm (tests and diagnostics)."""
    try:
        return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(f"{PREFIX}{daemon_pid}-"))
    except OSError:
        return []
