"""Per-stream accounting (execution/streams.py) and the series Prometheus sees (admin/streamseries.py),
on a clock the test moves."""

from __future__ import annotations

from infermux.admin.streamseries import StreamSeries
from infermux.events import EventLog
from infermux.execution.streams import AGES, KEY_CHARS, StreamTable
from support.clock import Clock


def table(**kw: object) -> tuple[StreamTable, Clock, EventLog]:
    clock, events = Clock(1000.0), EventLog()
    return StreamTable(events, clock=clock, **kw), clock, events  # type: ignore[arg-type]


def test_every_answer_counts_once_under_its_status_and_the_counts_add_up() -> None:
    streams, clock, _ = table()
    for status in (200, 200, 409, 429, 503, 504, 400, 500):
        stream = streams.receive("det", "cam1")
        stream.answer(status, age_ns=5_000_000)
    (view,) = streams.view()
    assert {k: view[k] for k in ("received", "served", "superseded", "refused", "failed")} == \
        {"received": 8, "served": 2, "superseded": 1, "refused": 3, "failed": 2}
    assert view["age_ms"] == {"p50": 5.0, "p99": 5.0} and view["last_seen_s"] == 0.0


def test_keys_are_counted_by_their_text_per_model_and_cut_short() -> None:
    streams, _, _ = table()
    streams.receive("det", 5)
    streams.receive("det", "5")
    streams.receive("ocr", "5")
    streams.receive("det", "x" * 1000)
    views = streams.view()
    assert [(v["model"], v["key"], v["received"]) for v in views] == [
        ("det", "5", 2), ("det", "x" * KEY_CHARS, 1), ("ocr", "5", 1)]
    assert streams.view("ocr")[0]["model"] == "ocr" and len(streams.view("det")) == 2


def test_rates_cover_the_last_seconds() -> None:
    streams, clock, _ = table()
    for _ in range(50):  # 10 per second for 5 s, every other one served
        stream = streams.receive("det", "cam")
        stream.answer(200 if clock.now * 10 % 2 < 1 else 409, 1_000_000)
        clock.now += 0.1
    view = streams.view()[0]
    assert 9 <= view["fps_in"] <= 11 and 4 <= view["fps_served"] <= 6 and 4 <= view["fps_dropped"] <= 6
    clock.now += 10
    assert streams.view()[0]["fps_in"] == 0


def test_the_ages_are_of_the_last_served_requests() -> None:
    streams, _, _ = table()
    stream = streams.receive("det", "cam")
    for ms in range(1, 2 * AGES + 1):  # the first AGES are gone from the ring
        stream.answer(200, ms * 1_000_000)
    ages = sorted(stream.ages_ms())
    assert len(ages) == AGES and ages[0] > AGES - 2
    assert abs(stream.totals.age_s - sum(range(1, 2 * AGES + 1)) / 1000) < 1e-6


def test_a_stream_that_stops_sending_is_silent_once_and_resumes() -> None:
    streams, clock, events = table(silent_s=5.0)
    streams.receive("det", "once")  # one request is not a stream that was active
    for _ in range(3):
        streams.receive("det", "cam")
        clock.now += 1
    clock.now += 3.9  # 4.9 s since its last request
    streams.check()
    assert not [e for e in events.recent() if e.kind == "stream_silent"]
    clock.now += 0.3
    streams.check()
    clock.now += 5
    streams.check()
    silent = [e for e in events.recent() if e.kind == "stream_silent"]
    assert [(e.model, e.detail["key"]) for e in silent] == [("det", "cam")]
    assert {v["key"]: v["silent"] for v in streams.view()} == {"cam": True, "once": False}
    streams.receive("det", "cam")
    assert [e.detail["key"] for e in events.recent() if e.kind == "stream_resumed"] == ["cam"]
    assert not streams.view()[0]["silent"]


def test_silence_detection_can_be_turned_off() -> None:
    streams, clock, events = table(silent_s=0.0)
    streams.receive("det", "cam")
    streams.receive("det", "cam")
    clock.now += 3600
    streams.check()
    assert not events.recent()


def test_past_max_keys_the_least_recently_seen_is_forgotten_and_its_counts_kept() -> None:
    streams, clock, _ = table(max_keys=3)
    for key in ("a", "b", "c"):
        streams.receive("det", key).answer(200, 1000)
        clock.now += 1
    busy = streams.receive("det", "a")  # seen again: "b" is now the least recently seen...
    streams.receive("det", "b").answer(200, 1000)
    streams.receive("det", "c").answer(200, 1000)
    streams.receive("det", "d").answer(200, 1000)  # ... but "a" holds a request in flight: "b" is forgotten
    assert [v["key"] for v in streams.view()] == ["a", "c", "d"]
    assert streams.forgotten["det"].received == 2 and streams.forgotten["det"].served == 2
    busy.answer(200, 1000)
    assert len(streams.streams()) == 3


def test_prometheus_names_the_busiest_keys_and_sums_the_rest_without_going_back() -> None:
    streams, clock, _ = table()
    series = StreamSeries()
    for key, n in (("a", 5), ("b", 3), ("c", 1)):
        for _ in range(n):
            streams.receive("det", key).answer(200, 1_000_000)

    def scrape() -> dict[str, int]:
        shown, counts = series.select(streams, top=2)
        assert counts["det"].tracked == len(streams.view("det"))
        return {s.key: s.totals.received for s in shown}

    first = scrape()
    assert first == {"a": 5, "b": 3, "other": 1}
    for _ in range(4):  # c passes b: its series starts at 0, and what it sent before stays in "other"
        streams.receive("det", "c").answer(200, 1_000_000)
    second = scrape()
    assert second == {"a": 5, "c": 0, "other": 8}  # c's five, and b's three
    streams.receive("det", "c").answer(200, 1_000_000)
    third = scrape()
    assert third == {"a": 5, "c": 1, "other": 8}
    assert sum(third.values()) == 14 and all(third[k] >= first.get(k, 0) for k in third)


def test_keys_going_silent_by_the_thousand_make_a_few_events_and_one_that_counts_the_rest() -> None:
    streams, clock, events = table(silent_s=1.0, max_keys=5000)
    for n in range(3000):
        streams.receive("det", f"made-up-{n}")
        streams.receive("det", f"made-up-{n}")
    clock.now += 2
    streams.check()
    named = [e for e in events.recent(5000) if e.kind == "stream_silent"]
    assert len(named) == 5 and all("key" in e.detail for e in named)
    assert sum(v["silent"] for v in streams.view()) == 3000  # each is still marked silent
    clock.now += 10  # the interval is over: one event counts the streams not named
    streams.check()
    summed = [e for e in events.recent(5000) if e.kind == "stream_silent"][5:]
    assert [(e.detail["streams"], "key" in e.detail) for e in summed] == [(2995, False)]


def test_frames_replaced_on_the_client_add_up_outside_what_was_received() -> None:
    streams, _, _ = table()
    for replaced in (0, 4, 3):
        streams.receive("det", "cam1", replaced=replaced).answer(200, age_ns=1_000_000)
    (view,) = streams.view()
    assert (view["received"], view["served"], view["replaced_by_client"]) == (3, 3, 7)
    assert streams.streams()[0].in_flight() == 0


def test_frames_replaced_on_the_client_have_their_rate_over_the_last_seconds() -> None:
    streams, clock, _ = table()
    for _ in range(10):  # one request a second for 10 s, each after 14 frames replaced
        streams.receive("det", "cam", replaced=14)
        clock.now += 1
    view = streams.view()[0]
    assert 13 <= view["fps_replaced_by_client"] <= 15 and 0.9 <= view["fps_in"] <= 1.1
