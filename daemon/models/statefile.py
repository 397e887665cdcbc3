"""The state file: operators' live changes (models/overrides.py) kept across restarts.

`<state_dir>/overrides.json`, rewritten whole and atomically on every change
(a temporary file beside it, fsync, rename, fsync of the folder), so a crash
or a power cut leaves the old file or the new one, never half of one. A file
that cannot be read back is set aside (renamed `overrides.json.unreadable-<time>`,
with an event and a log line) and the daemon starts with the file's settings:
a bad state file never stops the service.

The file is input like any other: it is read only when it is a plain file of
at most MAX_BYTES (not through a symlink), and every value is checked against
the bounds a live `ctl set` has (those the settings declare, config/settings.py, read by
models/overrides.py BOUNDS; `[daemon]
max_contexts`); a file that fails any check is set aside whole. It is written
without following symlinks (a new temporary file created exclusively, mode
0600), in a folder no other user may write, and one daemon at a time holds
the folder (`daemon.lock`, as the runtime directory's).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from infermux.config import DaemonConfig, contexts_problem
from infermux.events import EventLog
from infermux.models.overrides import Override
from infermux.transport import ipc
from infermux.transport.ownership import Ownership

log = logging.getLogger("infermux.state")

FORMAT = 1
NAME = "overrides.json"
MAX_BYTES = 1 << 20  # thousands of live changes; a larger file was not written by a daemon
MAX_ENTRIES = 10_000
SYSTEM_DIR = Path("/var/lib/infermux")


def state_dir(daemon: DaemonConfig, override: str | None = None) -> Path:
    """Where live changes are kept: `serve --state-dir`, then `[daemon] state_dir`, then systemd's $STATE_DIRECTORY
    (`StateDirectory=infermux`), then /var/lib/infermux when writable, then
    $XDG_STATE_HOME/infermux (~/.local/state/infermux)."""
    for candidate in (override, daemon.state_dir, os.environ.get("STATE_DIRECTORY", "").split(":")[0]):
        if candidate:
            return Path(candidate)
    if os.access(SYSTEM_DIR if SYSTEM_DIR.exists() else SYSTEM_DIR.parent, os.W_OK):
        return SYSTEM_DIR
    home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(home) / "infermux"


LOCK = "daemon.lock"


def claim(folder: Path, owned: Ownership) -> str | None:
    """Hold `folder` for this daemon (SocketsTaken when another holds it); why it may not be used,
    or None. A folder that cannot be made yet is left to `write`, which says so at the first change."""
    why = ipc.unsafe_directory(folder, "another user could plant live changes or links there")
    if why:
        return why
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o750)
    except OSError:
        return None
    try:
        owned.take(folder / LOCK, f"the state directory {folder}", "give this one another --state-dir")
    except OSError as exc:  # a read-only folder: its live changes are not saved, as `write` will say
        log.warning("cannot lock the state directory %s (%s)", folder, exc.strerror)
    return None


class StateFile:
    """One daemon's state file; `read` once at start, `write` on every change."""

    def __init__(self, folder: Path, events: EventLog, daemon: DaemonConfig | None = None) -> None:
        self.path = folder / NAME
        self.events = events
        self.daemon = daemon

    def read(self) -> list[Override]:
        """The overrides saved last; [] when there is no file, or it was set aside. Logs (and emits
        `state_restored`) what it restores."""
        try:
            restored = self._parse(self._load())
        except FileNotFoundError:
            return []
        except (OSError, ValueError, RecursionError) as exc:  # json's errors are ValueErrors, undecodable bytes too
            self._set_aside(exc)
            return []
        if restored:
            labels = [f"{o.label()}={o.as_json()['live']}" for o in restored]
            self.events.emit("state_restored", file=str(self.path), count=len(restored), changes=labels[:50])
            log.info("restored %d live change(s) from %s: %s%s", len(restored), self.path, ", ".join(labels[:20]),
                     f" and {len(labels) - 20} more" if len(labels) > 20 else "")
        return restored

    def _load(self) -> Any:
        """The file's JSON: a plain file (not a symlink) of at most MAX_BYTES, read with one size check."""
        return read_json(self.path, MAX_BYTES, "a state file")

    def _parse(self, data: Any) -> list[Override]:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a format {FORMAT} state file")
        entries = data.get("overrides")
        if not isinstance(entries, list):
            raise ValueError("'overrides' is not a list")
        if len(entries) > MAX_ENTRIES:
            raise ValueError(f"{len(entries)} entries, over the {MAX_ENTRIES} a state file may have")
        restored = [Override.from_record(entry) for entry in entries]
        for o in restored:
            why = contexts_problem(o.live, self.daemon) if o.field == "contexts" and self.daemon else None
            if why:
                raise ValueError(f"{o.label()}: {why}")
        return restored

    def _set_aside(self, problem: Exception) -> None:
        set_aside(self.path, problem, self.events, "state file", "live change",
                  "starting with the configuration's settings")

    def write(self, records: list[dict[str, Any]]) -> None:
        """Replace the file with `records`, atomically; a failure is logged, never raised (the change
        holds until a restart)."""
        try:
            write_json(self.path, {"format": FORMAT, "overrides": records})
        except OSError as exc:
            self.events.emit("state_not_saved", file=str(self.path), reason=str(exc)[:200])
            log.warning("live changes not saved to %s (%s): they hold until the daemon restarts; "
                        "set [daemon] state_dir to a folder the daemon may write", self.path, exc)


def set_aside(path: Path, problem: Exception, events: EventLog, what: str, next_write: str, meanwhile: str) -> None:
    """Rename a `what` that cannot be read to `<name>.unreadable-<time>`, with a `state_set_aside` event
    and a warning saying what the daemon does `meanwhile`: a bad file never stops the service."""
    aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
    try:
        os.replace(path, aside)
        where = f"set aside as {aside}"
    except OSError as exc:
        where = f"could not be set aside ({exc.strerror}); it is overwritten at the next {next_write}"
    events.emit("state_set_aside", file=str(path), reason=str(problem)[:200], moved_to=where)
    log.warning("%s %s cannot be read (%s): %s; %s", what, path, problem, where, meanwhile)


def read_json(path: Path, max_bytes: int = MAX_BYTES, what: str = "a state file") -> Any:
    """The JSON of `path`: a plain file (not a symlink) of at most `max_bytes`, read with one size check.
    FileNotFoundError when there is none; OSError, ValueError or RecursionError when it cannot be read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a plain file")
        if info.st_size > max_bytes:
            raise ValueError(f"{info.st_size} bytes, over the {max_bytes} {what} may have")
        return json.loads(src.read(max_bytes + 1).decode("utf-8"))


def write_json(path: Path, payload: Any) -> None:
    """Replace `path` with `payload` as JSON, atomically (a temporary file beside it, fsync, rename, fsync of
    the folder), never through a symlink (the temporary file is created exclusively, 0600); OSError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)  # a stale one, or a link planted in its place: never written through
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(payload, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)  # replaces a link at the path itself, never its target
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
