"""Short, fixed-width renderings of the daemon's numbers: durations, rates, counts, sizes.

Plain functions, no Rich and no Textual: `infermux status`, the pipelines'
stats table and the console (tui/, whose colours and markup are
tui/markup.py) all write numbers the same way; and `infermux ctl` and the
console's editor read a setting's value as an operator types it the same way
(`parse_value`).
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any, Sequence


def printable(value: Any, limit: int = 64) -> str:
    """Text a client sent (a stream key), fit to show on a terminal: what is not printable (a control
    character, a lone surrogate that UTF-8 cannot carry) written as its escape (`\\x1b`, `\\ud800`),
    cut to `limit` characters ending in "…"."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:max(0, limit - 1)] + "…"


def exit_reason(returncode: int | None) -> str:
    """How a process ended, from its return code: 'exit code 3', 'killed by SIGKILL', or 'running'."""
    if returncode is None:
        return "running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def us(value: float | None) -> str:
    """Microseconds as 85µs / 1.2ms / 12ms / 1.5s; "-" when there are no samples."""
    if value is None:
        return "-"
    if value < 1000:
        return f"{value:.0f}µs"
    if value < 10_000:
        return f"{value / 1000:.1f}ms"
    if value < 1_000_000:
        return f"{value / 1000:.0f}ms"
    return f"{value / 1e6:.1f}s"


def rate(value: float | None) -> str:
    """Requests per second: 0 / 3.2 / 38 / 1234 / 12.3k."""
    if not value:
        return "0"
    if value < 10:
        return f"{value:.1f}"
    if value < 10_000:
        return f"{value:.0f}"
    return f"{value / 1000:.1f}k"


def count(n: int) -> str:
    """A cumulative count in at most 4 characters: 7 / 1234 / 12k / 3.4M."""
    if n < 10_000:
        return str(n)
    if n < 1_000_000:
        return f"{n // 1000}k"
    return f"{n / 1e6:.1f}M"


def size(n: float | None) -> str:
    """Bytes in binary units, at most 5 characters: 512B / 31M / 1.2G."""
    if not n:
        return "0"
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.1f}{unit}" if (unit != "B" and n < 10) else f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.0f}T"


def percent(part: float, whole: float) -> str:
    """A share as 0% / 2.5% / 12% / 100%; "-" when there is no whole."""
    if not whole:
        return "-"
    share = 100 * part / whole
    if not share:
        return "0%"
    return f"{share:.1f}%" if share < 10 else f"{share:.0f}%"


SPARK = "▁▂▃▄▅▆▇█"


def spark(points: Sequence[float], cells: int) -> str:
    """`points` in `cells` bars, each the peak of its stretch, scaled to the largest: "▁▃▇█▅▂".

    Blank where nothing happened, so an idle row stays quiet; fewer points than cells fill from the right."""
    if not points:
        return " " * cells
    per = max(1, -(-len(points) // cells))  # points per bar, rounded up
    peaks = [max(points[i:i + per]) for i in range(max(0, len(points) - per * cells), len(points), per)]
    top = max(peaks) or 1.0
    bars = "".join(SPARK[min(7, int(7 * p / top + 0.5))] if p > 0 else " " for p in peaks)
    return bars.rjust(cells)


def duration(seconds: float) -> str:
    """Uptime as 42s / 12m05s / 3h02m / 4d03h."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(timestamp: float) -> str:
    """Local wall time of an event, HH:MM:SS."""
    return time.strftime("%H:%M:%S", time.localtime(timestamp))


# Not errors: served, and superseded (409: a newer frame of the same stream replaced it under
# queue_policy newest_per_key, which is the policy working).
NOT_FAILURES = ("200", "409")


def failures(stats: dict[str, Any]) -> int:
    """Error replies in a statistics view: all but 200 and 409 (the snapshot counts them per status in
    `by_status`); a 409 is counted by `superseded`."""
    return sum(n for status, n in (stats.get("by_status") or {}).items() if status not in NOT_FAILURES)


def superseded(stats: dict[str, Any]) -> int:
    """Replies of 409 in a statistics view: requests a newer one of their stream replaced (newest_per_key)."""
    return int((stats.get("by_status") or {}).get("409", 0))


def area_counts(camera: dict[str, Any]) -> list[str]:
    """A camera's zones (objects in each now) and lines (crossings so far) per label, one text each:
    `zone door: person 2` and `line gate: in car 3 / out 0`, as `ctl cameras` and the console show them."""
    out = [f"zone {printable(name)}: {_per_label(labels)}" for name, labels in (camera.get("zones") or {}).items()]
    out += [f"line {printable(name)}: in {_per_label(ways.get('in', {}))} / out {_per_label(ways.get('out', {}))}"
            for name, ways in (camera.get("lines") or {}).items()]
    return out


def _per_label(counts: dict[str, int]) -> str:
    shown = [f"{printable(label)} {n}" for label, n in counts.items() if n]
    return ", ".join(shown) if shown else "0"


def version_key(model: dict[str, Any]) -> str:
    """The row key of a model version everywhere in the console: name:version."""
    return f"{model['name']}:{model['version']}"


def parse_value(key: str, text: str) -> Any:
    """`3` -> 3, `2.1:90,2.2:10` -> {"2.1": 90, "2.2": 10} for weights, JSON where it parses, else text."""
    if key == "weights" and not text.startswith("{"):
        try:
            pairs = (item.rsplit(":", 1) for item in text.split(",") if item)
            return {version: int(weight) for version, weight in pairs}
        except ValueError:
            raise ValueError(f"weights={text!r}: write VERSION:WEIGHT,... (e.g. 2.1:90,2.2:10)") from None
    try:
        return json.loads(text)
    except ValueError:
        return text
