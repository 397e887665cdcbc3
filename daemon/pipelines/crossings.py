"""Lines' crossings kept across restarts (docs/events.md#the-counts).

A line's crossings are a tally an operator reads over days (`ctl cameras`, the retained MQTT topics,
`infermux_line_crossings_total`), so they are the daemon's state: `<state_dir>/crossings.json`, beside
the live changes' `overrides.json` and written the same way (models/statefile.py: whole and atomically,
never through a symlink, 0600; read only as a plain file of bounded size, set aside whole when it cannot
be read). It is written at most once every SAVE_EVERY_S while crossings are counted, and when the daemon
stops: a crash or a power cut loses at most the crossings of that last interval. A zone's objects are not
kept: the tracks they belong to end with the daemon, and an object still there after a restart enters
again as a new one.

What is restored follows the configuration the daemon starts with, as a reload does: the crossings of a
camera or line no longer configured are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from infermux.events import EventLog
from infermux.models.statefile import read_json, set_aside, write_json
from infermux.pipelines.zones import MAX_LABEL_CHARS, MAX_LABELS, Crossed, ZoneBook

log = logging.getLogger("infermux.state")

FORMAT = 1
NAME = "crossings.json"
MAX_BYTES = 4 << 20  # a daemon writes far less: cameras x lines x 2 directions x at most MAX_LABELS labels
MAX_NAME_CHARS = 256  # a camera's or a line's name (the configuration bounds them tighter)
SAVE_EVERY_S = 2.0
DIRECTIONS = ("in", "out")


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 53:
        raise ValueError("a crossing count is not a whole number from 0")
    return value


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise ValueError(f"a {what}'s name is not text of 1 to {MAX_NAME_CHARS} characters")
    return value


def _camera(lines: Any) -> dict[str, dict[str, dict[str, int]]]:
    """One camera's lines read back: line -> direction -> label -> crossings; ValueError otherwise."""
    if not isinstance(lines, dict):
        raise ValueError("a camera's lines are not an object")
    out: dict[str, dict[str, dict[str, int]]] = {}
    labels: set[str] = set()
    for line, directions in lines.items():
        if not isinstance(directions, dict) or not set(directions) <= set(DIRECTIONS):
            raise ValueError(f"line {_name(line, 'line')[:60]!r}'s directions are not 'in' and 'out'")
        out[_name(line, "line")] = per = {}
        for direction, counts in directions.items():
            if not isinstance(counts, dict):
                raise ValueError("a direction's counts are not an object")
            per[direction] = {_name(label, "label")[:MAX_LABEL_CHARS]: _count(n) for label, n in counts.items()}
            labels.update(per[direction])
    if len(labels) > MAX_LABELS + 1:  # + the `other` they overflow into
        raise ValueError(f"{len(labels)} labels on a camera, over the {MAX_LABELS} counted")
    return out


def parse(data: Any) -> Crossed:
    """A crossings file's payload: camera -> line -> direction -> label -> crossings; ValueError for
    anything a daemon did not write."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("cameras"), dict):
        raise ValueError(f"not a format {FORMAT} crossings file")
    return {_name(camera, "camera"): _camera(lines) for camera, lines in data["cameras"].items()}


class CrossingsFile:
    """The crossings file of one daemon in `folder` (None: nothing kept, they count from the start)."""

    def __init__(self, folder: Path | None, events: EventLog) -> None:
        self.path = folder / NAME if folder is not None else None
        self.events = events
        self._saved_at = 0.0
        self._failing = False  # said once when saving starts failing, and once when it works again
        self._lock = threading.Lock()  # the pipelines' sweeper saves, and their stop: one writer at a time

    def read(self) -> Crossed:
        """The crossings last saved; none where there is no file, or one that cannot be read (set aside)."""
        if self.path is None:
            return {}
        try:
            found = parse(read_json(self.path, MAX_BYTES, "a crossings file"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            set_aside(self.path, exc, self.events, "crossings file", "save of the counts",
                      "the lines count from 0")
            return {}
        if found:
            log.info("restored the crossings of %d camera(s) from %s", len(found), self.path)
        return found

    def keep(self, book: ZoneBook, now: bool = False) -> None:
        """`book`'s crossings to the file where they changed since the last save: at most every SAVE_EVERY_S
        unless `now` (the last followed object ended, the daemon stops)."""
        if not now and time.monotonic() - self._saved_at < SAVE_EVERY_S:
            return
        with self._lock:
            changed = book.changes()
            if changed is not None:
                self.save(changed)

    def save(self, crossed: Crossed) -> None:
        """Write `crossed` (every camera's) in place of what the file held; a failure is said, not raised."""
        self._saved_at = time.monotonic()
        if self.path is None:
            return
        try:
            write_json(self.path, {"format": FORMAT, "cameras": crossed})
        except OSError as exc:
            if not self._failing:
                self._failing = True
                self.events.emit("state_not_saved", file=str(self.path), reason=str(exc)[:200])
                log.warning("line crossings not saved to %s (%s): they count on, and are saved once it can be "
                            "written; a restart meanwhile starts from the last saved", self.path, exc)
            return
        if self._failing:
            self._failing = False
            log.info("line crossings saved to %s again", self.path)
