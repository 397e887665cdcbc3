"""A sink's durable spool: append-only segment files, an event leaving only once acknowledged.

Records are appended to `<folder>/<n>.seg` (length, CRC-32 and time before
each event's bytes) with plain writes, which survive the daemon's own end
(a crash, a restart); `sync` fsyncs them and the cursor at most every few
tens of milliseconds, from the hub's syncer thread, so the pipelines'
threads only append and the sink's thread only delivers. The cursor file holds where the first event not acknowledged
starts; a segment wholly behind it is deleted. On start the segments are
read from the cursor on: a record cut short or corrupt (the daemon died
writing it) ends what is read there, and the file is cut back to it.
Past `max_events` or `max_bytes` the oldest events are dropped, counted.
Files are made with O_NOFOLLOW and mode 0600 in a 0700 folder, as the
daemon's other state files are.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

RECORD = struct.Struct("<IId")  # length, crc32 of the bytes, the time it was appended (Unix seconds)
CURSOR = struct.Struct("<QQ")  # segment number, offset of the first event not acknowledged
OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
MAX_RECORD = 16 << 20  # one event at most: a length past it is a corrupt record


@dataclass(frozen=True)
class Entry:
    """Where one waiting event is: its number in this run, segment, offset (of its record) and size."""

    seq: int
    segment: int
    offset: int
    size: int
    time: float


class Spool:
    """One sink's waiting events, in order; thread-safe (appends from any thread, the rest from the sink's)."""

    def __init__(self, folder: Path, max_events: int, max_bytes: int) -> None:
        self.folder, self.max_events, self.max_bytes = folder, max_events, max_bytes
        self.segment_bytes = min(max(max_bytes // 8, 64 << 10), 16 << 20)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.ready = threading.Condition(self._lock)  # notified on append: the sink's thread waits on it
        self._entries: deque[Entry] = deque()
        self._bytes = 0
        self._seq = 0
        self.dropped = 0  # dropped past the bounds, since the daemon started
        self._readers: dict[int, int] = {}  # segment -> fd
        self._dirty = False
        self.dirtied: threading.Event | None = None  # set with _dirty: the hub's syncer sleeps until then
        self._closed = False  # a removed sink's spool: appends that come late are dropped, not written
        self._syncing = threading.Lock()  # one sync at a time, and none while the files close
        self._rolled: list[int] = []  # writers of finished segments, to fsync and close
        self.write_error = ""  # the last append that could not be written (a full disk), for the views
        self._cursor_fd = os.open(folder / "cursor", os.O_RDWR | os.O_CREAT | OPEN_FLAGS, 0o600)
        self._segment, self._size = self._recover()
        self._writer = self._open_segment(self._segment)

    # -- start -----------------------------------------------------------------------

    def _segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.folder.glob("*.seg") if p.stem.isdigit())

    def _recover(self) -> tuple[int, int]:
        """Read the waiting events back; returns the segment to append to and its size."""
        raw = os.pread(self._cursor_fd, CURSOR.size, 0)
        start_seg, start_off = CURSOR.unpack(raw) if len(raw) == CURSOR.size else (0, 0)
        segments = self._segments()
        for number in segments:
            if number < start_seg:
                os.unlink(self.folder / f"{number}.seg")
                continue
            self._scan(number, start_off if number == start_seg else 0)
        last = segments[-1] if segments and segments[-1] >= start_seg else max(start_seg, 1)
        path = self.folder / f"{last}.seg"
        return last, path.stat().st_size if path.exists() else 0

    def _scan(self, number: int, offset: int) -> None:
        path = self.folder / f"{number}.seg"
        fd = os.open(path, os.O_RDWR | OPEN_FLAGS)
        try:
            size = os.fstat(fd).st_size
            while offset + RECORD.size <= size:
                length, crc, stamp = RECORD.unpack(os.pread(fd, RECORD.size, offset))
                data = os.pread(fd, length, offset + RECORD.size) if length <= MAX_RECORD else b""
                if length > MAX_RECORD or len(data) != length or zlib.crc32(data) != crc:
                    break
                self._remember(number, offset, length, stamp)
                offset += RECORD.size + length
            if offset < size:  # a record cut short or corrupt: what follows it cannot be trusted
                os.ftruncate(fd, offset)
        finally:
            os.close(fd)

    def _open_segment(self, number: int) -> int:
        return os.open(self.folder / f"{number}.seg", os.O_WRONLY | os.O_CREAT | os.O_APPEND | OPEN_FLAGS, 0o600)

    def _remember(self, segment: int, offset: int, size: int, stamp: float) -> None:
        self._seq += 1
        self._entries.append(Entry(self._seq, segment, offset, size, stamp))
        self._bytes += size
        self._bound(0)

    def _mark(self) -> None:
        """Something the next sync must make durable (under the lock)."""
        self._dirty = True
        if self.dirtied is not None:
            self.dirtied.set()

    def _bound(self, more: int) -> None:
        """Drop the oldest until one more event of `more` bytes fits."""
        while self._entries and (len(self._entries) + (1 if more else 0) > self.max_events
                                 or self._bytes + more > self.max_bytes):
            self._bytes -= self._entries.popleft().size
            self.dropped += 1
            self._mark()

    # -- the pipelines' threads ----------------------------------------------------------

    def append(self, data: bytes, wake: bool = True) -> bool:
        """Add one event at the end (False, counted as dropped, when it alone is over the bounds);
        `wake` false leaves the sink's thread asleep (the caller delivers it, or calls `wake`)."""
        if len(data) > min(self.max_bytes, MAX_RECORD):
            with self._lock:
                self.dropped += 1
            return False
        stamp = time.time()
        record = RECORD.pack(len(data), zlib.crc32(data), stamp) + data
        with self._lock:
            if self._closed:
                return False
            self._bound(len(data))
            if self._size >= self.segment_bytes:
                self._rolled.append(self._writer)  # fsynced and closed by the next sync, off this thread
                self._segment, self._size = self._segment + 1, 0
                self._writer = self._open_segment(self._segment)
            try:
                written = os.write(self._writer, record)
                if written != len(record):
                    raise OSError(f"wrote {written} of {len(record)} bytes")
            except OSError as exc:  # a full disk: this event is lost, counted; the file stays whole
                self._cut_back()
                self.dropped += 1
                self.write_error = str(exc)
                return False
            self._seq += 1
            self._entries.append(Entry(self._seq, self._segment, self._size, len(data), stamp))
            self._size += len(record)
            self._bytes += len(data)
            self._mark()
            if wake:
                self.ready.notify()
        return True

    def _cut_back(self) -> None:
        """Remove what a failed write left of its record, so that the records after it can be read."""
        try:
            os.ftruncate(self._writer, self._size)
        except OSError:
            pass

    # -- the sink's and the syncer's threads ---------------------------------------------

    def wait(self, timeout_s: float) -> None:
        """Until an event waits (or `wake`), at most `timeout_s`."""
        with self._lock:
            if not self._entries:
                self.ready.wait(timeout_s)

    def wake(self) -> None:
        """End a `wait` now (the sink stops)."""
        with self._lock:
            self.ready.notify_all()

    def peek(self, n: int) -> list[tuple[int, bytes]]:
        """The first `n` waiting events: (number, bytes), oldest first."""
        with self._lock:
            out: list[tuple[int, bytes]] = []
            if self._closed:
                return out
            for entry in list(self._entries)[:n]:
                fd = self._reader(entry.segment)
                out.append((entry.seq, os.pread(fd, entry.size, entry.offset + RECORD.size)))
            return out

    def _reader(self, segment: int) -> int:
        if segment not in self._readers:
            self._readers[segment] = os.open(self.folder / f"{segment}.seg", os.O_RDONLY | OPEN_FLAGS)
        return self._readers[segment]

    def ack(self, seq: int) -> None:
        """Every event up to number `seq` was acknowledged: they leave the spool."""
        with self._lock:
            while self._entries and self._entries[0].seq <= seq:
                self._bytes -= self._entries.popleft().size
            self._mark()

    def sync(self) -> None:
        """Make the appended events and the cursor durable; delete the segments wholly acknowledged."""
        with self._syncing:
            self._sync()

    def _sync(self) -> None:
        with self._lock:
            if not self._dirty or self._closed:
                return
            self._dirty = False
            head = (self._entries[0].segment, self._entries[0].offset) if self._entries else (self._segment, self._size)
            # fsync waits for the disk: done on copies of the descriptors, outside the lock appends take
            written, self._rolled = [os.dup(self._writer), *self._rolled], []
            done = [n for n in self._readers if n < head[0]]
            for number in done:
                os.close(self._readers.pop(number))
        for fd in written:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.pwrite(self._cursor_fd, CURSOR.pack(*head), 0)
        os.fsync(self._cursor_fd)
        for number in self._segments():
            if number < head[0]:
                try:
                    os.unlink(self.folder / f"{number}.seg")
                except FileNotFoundError:
                    pass

    def backlog(self) -> tuple[int, int, float | None]:
        """Events waiting, their bytes, and when the oldest was appended (Unix seconds; None: none waits)."""
        with self._lock:
            return len(self._entries), self._bytes, self._entries[0].time if self._entries else None

    def close(self) -> None:
        """Sync, and close every file (a later append is dropped; a sync in another thread is waited for)."""
        with self._syncing:
            self._sync()
            self._close()

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            for fd in (self._writer, self._cursor_fd, *self._readers.values(), *self._rolled):
                os.close(fd)
            self._readers.clear()
            self._rolled.clear()
