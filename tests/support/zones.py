"""A camera with zones and lines over tracking.py's `through_zone` walk, and the events the walk makes
(docs/events.md#zones-and-lines), for the daemon tests of zones: one sends the walk's frames itself
with the camera's name as their key, one has the camera read them from a file.

Object 1 walks down the left half: it crosses `short` (in side left: going down is `out`), then
`gate` (in side right: going down is `in`), enters `yard` and stops in it until the frames stop,
and ends there (an `exit` before its `end`). Object 2 walks up the right half: it crosses `gate`
the other way (`out`), passes beside the end of `short` (no crossing) and never nears `yard`."""

from __future__ import annotations

from typing import Any

AREAS = """
[[cameras.zones]]
name = "yard"
points = [[0.05, 0.6], [0.45, 0.6], [0.45, 0.95], [0.05, 0.95]]

[[cameras.lines]]
name = "gate"
points = [[0.02, 0.5], [0.98, 0.5]]
in_side = "right"

[[cameras.lines]]
name = "short"
points = [[0.05, 0.4], [0.45, 0.4]]
in_side = "left"
"""

# Per object, in order: (type, zone or line, direction, count) of each event.
WALKS_DOWN = [("new",), ("cross", "short", "out", 1), ("cross", "gate", "in", 1), ("enter", "yard", 1), ("update",),
              ("exit", "yard", 0), ("end",)]
WALKS_UP = [("new",), ("cross", "gate", "out", 1), ("end",)]
# The counts once both have ended: the label is "none" (the detector labels nothing).
ZONES_AFTER = {"yard": {"none": 0}}
LINES_AFTER = {"gate": {"in": {"none": 1}, "out": {"none": 1}}, "short": {"in": {}, "out": {"none": 1}}}
# The pipeline's object events: new on the 2nd frame, no update for a better score (min_score_gain 1).
EVENTS = {"min_frames": 2, "min_score": 0.5, "min_score_gain": 1.0, "end_after_s": 1.0, "update_every_s": 0.0}


def camera(name: str, url: str, pipeline: str, **settings: str) -> str:
    """A `[[cameras]]` entry with AREAS (not a str.format template)."""
    more = "".join(f"{key} = {value}\n" for key, value in settings.items())
    return f'[[cameras]]\nname = "{name}"\nurl = "{url}"\npipeline = "{pipeline}"\n{more}{AREAS}'


def moves(events: list[dict[str, Any]]) -> dict[int, list[tuple]]:
    """Track id -> its events as (type, zone or line, direction, count), in order."""
    out: dict[int, list[tuple]] = {}
    for e in events:
        where = (e["zone"],) if "zone" in e else (e["line"], e["direction"]) if "line" in e else ()
        out.setdefault(e["track_id"], []).append((e["type"], *where, *((e["count"],) if "count" in e else ())))
    return out
