"""Which streams Prometheus sees by name: a bounded number per model, the rest summed as key="other".

Cameras come and go and a key can be anything a client sends, so a series
per key would grow without bound. Per model, the `stream_metrics_keys`
streams that sent the most have series of their own; everything else of
that model (its other tracked streams and those the table forgot) is one
series with `key="other"`.

Counters must never go back: a key that enters the top after some of its
requests were counted in "other" starts its own series at 0 from then on
(what it sent before stays in "other"), and a key that leaves the top
takes what its series counted back into "other". So the series of a model
always add up to everything it received, and each only ever grows. A key
that was never summed into "other" (the usual case: fewer streams than
the limit) counts from its first request, as admin `streams` does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

from infermux.execution.streams import COUNTERS, Stream, StreamTable, Totals

OTHER = "other"


@dataclass
class Series:
    """One stream series of a scrape: its labels, its counters and the ages its quantiles come from."""

    model: str
    key: str
    totals: Totals
    ages_ms: list[float]
    last_seen_s: float | None = None  # None for "other"
    silent: bool | None = None


@dataclass
class ModelStreams:
    """How many streams a model has now, and how many of them are silent."""

    tracked: int = 0
    silent: int = 0


class StreamSeries:
    """The series a scrape shows; remembers which keys had series and from what counts (one per exporter)."""

    def __init__(self) -> None:
        self._base: dict[str, dict[str, Totals]] = {}  # per model: shown key -> its counts when its series began
        self._summed: dict[str, set[str]] = {}  # per model: keys counted in "other" at some scrape
        self._other: set[str] = set()  # models that have shown an "other" series: it stays

    def select(self, table: StreamTable, top: int) -> tuple[list[Series], dict[str, ModelStreams]]:
        """The series of this scrape (the top `top` keys of each model by requests, then "other"),
        and each model's stream counts."""
        now = table.clock()
        by_model: dict[str, list[Stream]] = {}
        for stream in table.streams():
            by_model.setdefault(stream.model, []).append(stream)
        series: list[Series] = []
        counts: dict[str, ModelStreams] = {}
        for model in sorted(set(by_model) | set(table.forgotten)):
            streams = by_model.get(model, [])
            counts[model] = ModelStreams(len(streams), sum(1 for s in streams if s.silent))
            series += self._model(model, streams, table.forgotten.get(model), top, now)
        for model in set(self._base) - set(by_model):
            del self._base[model]
            self._summed.pop(model, None)
        return series, counts

    def _model(self, model: str, streams: list[Stream], forgotten: Totals | None, top: int,
               now: float) -> Iterator[Series]:
        ranked = sorted(streams, key=lambda s: (-s.totals.received, s.key))
        shown, rest = ranked[:top], ranked[top:]
        base = self._base.setdefault(model, {})
        summed = self._summed.setdefault(model, set())
        tracked = {s.key for s in streams}
        summed &= tracked  # a forgotten key that comes back is a new stream
        kept = {s.key for s in shown}
        for key in set(base) - kept:
            del base[key]  # back into "other", with all it counted
        everything = Totals()
        if forgotten is not None:
            everything.add(forgotten)
        named = Totals()
        for stream in shown:
            totals = replace(stream.totals)
            everything.add(totals)
            start = base.setdefault(stream.key, replace(totals) if stream.key in summed else Totals())
            if any(getattr(totals, name) < getattr(start, name) for name in COUNTERS):
                start = base[stream.key] = Totals()  # not the stream it was (forgotten and back)
            own = _minus(totals, start)
            named.add(own)
            yield Series(model, stream.key, own, stream.ages_ms(), round(now - stream.last_seen, 3), stream.silent)
        ages: list[float] = []
        for stream in rest:
            everything.add(replace(stream.totals))
            ages += stream.ages_ms()
            summed.add(stream.key)
        other = _minus(everything, named)
        if other.received or model in self._other:  # once shown, always: a series must not vanish and return
            self._other.add(model)
            yield Series(model, OTHER, other, ages)


def _minus(a: Totals, b: Totals) -> Totals:
    return Totals(**{name: getattr(a, name) - getattr(b, name) for name in COUNTERS}, age_s=a.age_s - b.age_s)
