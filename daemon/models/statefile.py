"""The state file: operators' live changes (models/overrides.py) kept across restarts.

`<state_dir>/overrides.json`, rewritten whole and atomically on every change
(a temporary file beside it, fsync, rename, fsync of the folder), so a crash
or a power cut leaves the old file or the new one, never half of one. A file
that cannot be read back is set aside (renamed `overrides.json.unreadable-<time>`,
with an event and a log line) and the daemon starts with the file's settings:
a bad state file never stops the service.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from infermux.config import DaemonConfig
from infermux.events import EventLog
from infermux.models.overrides import Override

log = logging.getLogger("infermux.state")

FORMAT = 1
NAME = "overrides.json"
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


class StateFile:
    """One daemon's state file; `read` once at start, `write` on every change."""

    def __init__(self, folder: Path, events: EventLog) -> None:
        self.path = folder / NAME
        self.events = events

    def read(self) -> list[Override]:
        """The overrides saved last; [] when there is no file, or it was set aside."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"not a format {FORMAT} state file")
            entries = data.get("overrides")
            if not isinstance(entries, list):
                raise ValueError("'overrides' is not a list")
            return [Override.from_record(entry) for entry in entries]
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:  # json's errors are ValueErrors, undecodable bytes too
            self._set_aside(exc)
            return []

    def _set_aside(self, problem: Exception) -> None:
        aside = self.path.with_name(f"{NAME}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(self.path, aside)
            where = f"set aside as {aside}"
        except OSError as exc:
            where = f"could not be set aside ({exc.strerror}); it is overwritten at the next live change"
        self.events.emit("state_set_aside", file=str(self.path), reason=str(problem)[:200], moved_to=where)
        log.warning("state file %s cannot be read (%s): %s; starting with the configuration's settings",
                    self.path, problem, where)

    def write(self, records: list[dict[str, Any]]) -> None:
        """Replace the file with `records`, atomically; a failure is logged, never raised (the change
        holds until a restart)."""
        tmp = self.path.with_name(f".{NAME}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as out:
                json.dump({"format": FORMAT, "overrides": records}, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            folder = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except OSError as exc:
            self.events.emit("state_not_saved", file=str(self.path), reason=str(exc)[:200])
            log.warning("live changes not saved to %s (%s): they hold until the daemon restarts; "
                        "set [daemon] state_dir to a folder the daemon may write", self.path, exc)
            try:
                tmp.unlink()
            except OSError:
                pass
