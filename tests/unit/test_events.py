"""The event log: what it keeps, and what traffic cannot push out of it."""

from __future__ import annotations

from infermux.events import Event, EventLog


def test_audit_events_are_never_evicted_by_other_events() -> None:
    events = EventLog(keep=100)
    events.emit("admin", "m", "1", cmd="drain", outcome="accepted")
    for i in range(5000):
        events.record(Event("region_registered", detail={"i": i}))
    assert [e.detail["cmd"] for e in events.recent(10, frozenset({"admin"}))] == ["drain"]
    assert len(events.recent(1000)) == 101  # the other ring's 100 and the audit one's
