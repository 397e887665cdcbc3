"""The `jsonl` sink: one JSON line per event, in files rotated by size; acknowledged once fsynced."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from infermux.plugins.sinks.base import OutEvent, SinkConfigError, SinkDown, bounded, known, option

KIND = "jsonl"
OPTIONS = {"path", "max_mb", "keep"}


class JsonlSink:
    """Appends events to `path` (`path.1` ... `path.<keep>` the older files, rotated past `max_mb`)."""

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        known(KIND, options, OPTIONS)
        path = option(KIND, options, "path", str, "")
        if not path or not os.path.isabs(path):
            raise SinkConfigError(KIND, f"option 'path' must be an absolute file path, got {path!r}", "path")
        bounded(KIND, "max_mb", option(KIND, options, "max_mb", (int, float), 16), 0.001, 1 << 20)
        bounded(KIND, "keep", option(KIND, options, "keep", int, 5), 0, 1000)

    @staticmethod
    def probe(options: Mapping[str, Any], timeout_s: float) -> str:
        """Whether this user may write the file, or make it in its folder (nothing is written)."""
        JsonlSink.check(options)
        path = Path(options["path"])
        if path.exists():
            if not path.is_file() or not os.access(path, os.W_OK):
                raise SinkDown(f"{path} is not a file this user may write")
            return f"{path} is writable"
        folder = path.parent
        while not folder.exists():  # the sink makes the missing folders: the nearest one there must take them
            folder = folder.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise SinkDown(f"cannot make {path}: {folder} is not a folder this user may write")
        return f"{path} can be made in {folder}"

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        self.check(options)
        self.path = Path(options["path"])
        self.max_bytes = int(float(options.get("max_mb", 16)) * (1 << 20))
        self.keep = int(options.get("keep", 5))

    def deliver(self, events: list[OutEvent]) -> int:
        """Write the events as lines, fsync, and rotate when the file is past its size."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"".join(e.data + b"\n" for e in events))
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size >= self.max_bytes:
                self._rotate()
        except OSError as exc:
            raise SinkDown(f"cannot write {self.path}: {exc.strerror or exc}") from None
        return len(events)

    def _rotate(self) -> None:
        if self.keep == 0:
            os.unlink(self.path)
            return
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    def result(self, key: str, payload: bytes) -> None:
        """Files take events only."""

    def close(self) -> None:
        """Nothing stays open between deliveries."""
