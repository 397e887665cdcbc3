"""Rollout verdicts kept across restarts (docs/hot-swap.md#what-survives-a-restart).

What the shadow rollout decided about an engine (swap/rollout.py) is the
daemon's state, not a thought it has: `<state_dir>/verdicts.json`, beside
the live changes' `overrides.json` and written the same way
(models/statefile.py: whole and atomically, never through a symlink,
0600; read only as a plain file of bounded size, set aside whole when it
cannot be read). Each verdict names the model, the version and the sha256
of the engine file it was about, so a different file published under the
same version is news, and the same file is not judged twice:

- `passed` (shadowed and agreed, or promoted by an operator) and `served`
  (served without shadowing: a model's first version, a rollback): at
  start the daemon serves the newest of these, and newer versions shadow
  it again before they serve;
- `refused` (the gate's reason) and `rejected` (an operator's): never
  shadowed again, listed `failed` with the reason, until `infermux ctl
  retry MODEL VERSION`;
- `cancelled` (superseded, pinned out, its file removed before a
  decision): nothing was judged, so it shadows again when it is wanted.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infermux.events import EventLog
from infermux.models.statefile import read_json, set_aside, write_json

log = logging.getLogger("infermux.state")

FORMAT = 1
NAME = "verdicts.json"
MAX_BYTES = 4 << 20
MAX_ENTRIES = 10_000  # the oldest are dropped beyond this: a verdict on an engine long gone matters least
OUTCOMES = ("passed", "served", "refused", "rejected", "cancelled")
GOOD = ("passed", "served")
BAD = ("refused", "rejected")
MAX_REASON = 1000


@dataclass(frozen=True)
class Decision:
    """One verdict on one engine file of one version."""

    model: str
    version: str
    digest: str  # sha256 of the engine file, hex
    outcome: str
    reason: str = ""
    time: float = 0.0

    @classmethod
    def from_record(cls, record: Any) -> "Decision":
        """A verdict read back; ValueError for anything a daemon did not write."""
        if not isinstance(record, dict):
            raise ValueError("a verdict is not an object")
        fields: dict[str, str] = {}
        for key in ("model", "version", "digest", "outcome", "reason"):
            value = record.get(key)
            if not isinstance(value, str):
                raise ValueError(f"a verdict's {key} is not a string")
            fields[key] = value
        if not isinstance(record.get("time"), (int, float)):
            raise ValueError("a verdict's time is not a number")
        if fields["outcome"] not in OUTCOMES or len(fields["digest"]) != 64 or len(fields["reason"]) > MAX_REASON \
                or not (0 < len(fields["model"]) <= 255 and 0 < len(fields["version"]) <= 255):
            raise ValueError(f"a verdict out of bounds ({fields['outcome']!r} on {fields['model']!r})"[:200])
        return cls(**fields, time=float(record["time"]))


def file_digest(path: Path) -> str:
    """sha256 of the file at `path`, hex; "" when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


class Decisions:
    """The verdicts of one daemon: read once at start from `folder` (None: kept in memory only), written
    on every change."""

    def __init__(self, folder: Path | None, events: EventLog) -> None:
        self.path = folder / NAME if folder is not None else None
        self.events = events
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str, str], Decision] = {}
        for decision in self._read():
            self._by_key[(decision.model, decision.version, decision.digest)] = decision

    def get(self, model: str, version: str, digest: str) -> Decision | None:
        return self._by_key.get((model, version, digest)) if digest else None

    def refused(self, model: str, version: str, digest: str) -> str:
        """Why this engine file is not to be shadowed again ("" when it may be)."""
        found = self.get(model, version, digest)
        return found.reason if found is not None and found.outcome in BAD else ""

    def good(self, model: str, version: str, digest: str) -> bool:
        """Whether this engine file passed its rollout or served."""
        found = self.get(model, version, digest)
        return found is not None and found.outcome in GOOD

    def record(self, model: str, version: str, digest: str, outcome: str, reason: str = "") -> None:
        """Keep a verdict (replacing the one on the same file), and write the file."""
        if not digest:
            return  # the file could not be read: nothing to key it by (it is judged again)
        decision = Decision(model, version, digest, outcome, reason[:MAX_REASON], time.time())
        with self._lock:
            if self._by_key.get((model, version, digest)) == decision:
                return
            self._by_key.pop((model, version, digest), None)
            self._by_key[(model, version, digest)] = decision
            while len(self._by_key) > MAX_ENTRIES:
                del self._by_key[next(iter(self._by_key))]
            self._write()

    def take_back(self, model: str, version: str) -> int:
        """Drop the refusals of `version` of `model` (an operator's `retry`); how many there were."""
        with self._lock:
            keys = [key for key, d in self._by_key.items() if key[:2] == (model, version) and d.outcome in BAD]
            for key in keys:
                del self._by_key[key]
            if keys:
                self._write()
        return len(keys)

    def _read(self) -> list[Decision]:
        if self.path is None:
            return []
        try:
            data = read_json(self.path, MAX_BYTES, "a verdicts file")
            if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("verdicts"), list):
                raise ValueError(f"not a format {FORMAT} verdicts file")
            if len(data["verdicts"]) > MAX_ENTRIES:
                raise ValueError(f"{len(data['verdicts'])} verdicts, over the {MAX_ENTRIES} a file may have")
            found = sorted((Decision.from_record(r) for r in data["verdicts"]), key=lambda d: d.time)
        except FileNotFoundError:
            return []
        except (OSError, ValueError, RecursionError) as exc:
            self._set_aside(exc)
            return []
        if found:
            log.info("restored %d rollout verdict(s) from %s", len(found), self.path)
        return found

    def _set_aside(self, problem: Exception) -> None:
        assert self.path is not None
        set_aside(self.path, problem, self.events, "verdicts file", "verdict", "every version on disk is judged afresh")

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            write_json(self.path, {"format": FORMAT, "verdicts": [asdict(d) for d in self._by_key.values()]})
        except OSError as exc:
            self.events.emit("state_not_saved", file=str(self.path), reason=str(exc)[:200])
            log.warning("rollout verdicts not saved to %s (%s): they hold until the daemon restarts", self.path, exc)
