"""What the console reads from the daemon besides the statistics: logged warnings as events, GPU readings.

Pure units on the daemon's own objects (no daemon process): test_tui.py sees both through a real daemon.
The GPU source here is a stand-in (no GPU on the test box); hardware.py's sources have their own tests.
"""

from __future__ import annotations

import logging

from infermux.admin.hardware import GpuSample
from infermux.admin.snapshot import GpuReadings
from infermux.events import EventLog, TracebackLimiter


def limiter() -> tuple[TracebackLimiter, EventLog, logging.Logger]:
    events = EventLog()
    filter_ = TracebackLimiter(interval_s=3600.0)  # no interval ends during a test
    filter_.events = events
    logger = logging.getLogger("infermux.test-console-log")
    return filter_, events, logger


def record(logger: logging.Logger, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logger.makeRecord(logger.name, level, __file__, 1, msg, args, None)


def test_a_warning_becomes_one_log_event_and_its_repeats_are_counted_into_the_next() -> None:
    filter_, events, logger = limiter()
    for client in ("a", "b", "c"):  # one message, three clients: one event now
        assert filter_.filter(record(logger, logging.WARNING, "client %s is not reading its replies", client))
    assert filter_.filter(record(logger, logging.ERROR, "cannot map region %s: gone model=m version=2", "x"))
    assert filter_.filter(record(logger, logging.INFO, "loaded"))  # below WARNING: no event
    got = [e.as_json() for e in events.recent()]
    assert [(e["kind"], e["level"], e["message"]) for e in got] == [
        ("log", "warning", "client a is not reading its replies"),
        ("log", "error", "cannot map region x: gone model=m version=2")]
    assert got[1]["model"] == "m" and got[1]["version"] == "2" and got[0]["logger"] == logger.name
    filter_._messages[(logger.name, "client %s is not reading its replies")] = (float("-inf"), 2)  # interval over
    filter_.filter(record(logger, logging.WARNING, "client %s is not reading its replies", "d"))
    assert events.recent()[-1].detail["repeated"] == 2


def test_lines_that_are_events_already_make_no_log_event() -> None:
    filter_, events, _ = limiter()
    filter_.filter(record(logging.getLogger("infermux.events"), logging.WARNING, "evicted model=a"))
    counted = record(logging.getLogger("infermux.x"), logging.ERROR, "boom: 5 more like this")
    counted.infermux_event = True  # TracebackLimiter's own count line: its `error` event is recorded
    filter_.filter(counted)
    assert events.recent() == []


def test_gpu_readings_choose_the_source_once_and_read_it_at_most_every_interval() -> None:
    class StandIn:  # a GPU source, as NVML's would answer
        kind = "nvml"
        reads = 0

        def samples(self) -> list[GpuSample]:
            self.reads += 1
            return [GpuSample("0", "stand-in", utilization_ratio=0.5, temperature_celsius=61.0)]

    source, chosen = StandIn(), []
    readings = GpuReadings(lambda: chosen.append(1) or source, every_s=3600.0)
    view = readings.view()
    assert view["source"] == "nvml" and view["devices"][0]["utilization_ratio"] == 0.5
    assert view["devices"][0]["memory_used_bytes"] is None  # what the device cannot say stays None
    assert readings.view() == view and source.reads == 1 and chosen == [1]
    assert GpuReadings(lambda: None).view() == {"source": "", "devices": []}  # no GPU
