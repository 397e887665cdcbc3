"""Refusals held back: longer for a connection that keeps earning them, forgiven by a computed reply."""

from __future__ import annotations

from typing import Any

from infermux.frontend import pacing
from infermux.frontend.pacing import FIRST_HOLD_S, FORGET_S, MAX_HOLD_S, RefusalPacer
from support.clock import Clock


def refusal(peer: bytes, n: int = 0) -> list[Any]:
    return [peer, b"", b"refused %d" % n]


def held_for(pacer: RefusalPacer, clock: Clock, frames: list[Any]) -> float:
    """How long `frames` waits before `due` gives it (in steps of 10 ms of the fake clock)."""
    start = clock.now
    assert pacer.hold(frames)
    while True:
        if frames in list(pacer.due()):
            return round(clock.now - start, 2)
        clock.now += 0.01


def test_a_connection_refused_again_and_again_waits_twice_as_long_each_time_up_to_a_second() -> None:
    clock = Clock()
    pacer = RefusalPacer(clock)
    waits = [held_for(pacer, clock, refusal(b"a", n)) for n in range(6)]
    assert waits == [FIRST_HOLD_S, 0.2, 0.4, 0.8, MAX_HOLD_S, MAX_HOLD_S]


def test_other_connections_start_from_the_first_hold() -> None:
    clock = Clock()
    pacer = RefusalPacer(clock)
    for n in range(4):
        held_for(pacer, clock, refusal(b"a", n))
    assert held_for(pacer, clock, refusal(b"b")) == FIRST_HOLD_S


def test_a_computed_reply_or_a_quiet_spell_forgives_the_connection() -> None:
    clock = Clock()
    pacer = RefusalPacer(clock)
    held_for(pacer, clock, refusal(b"a"))
    assert held_for(pacer, clock, refusal(b"a")) == 0.2
    pacer.forgive(b"a")
    assert held_for(pacer, clock, refusal(b"a")) == FIRST_HOLD_S
    clock.now += FORGET_S + 1
    assert held_for(pacer, clock, refusal(b"a")) == FIRST_HOLD_S


def test_the_pacer_says_whether_it_remembers_a_refusal_for_the_lane_to_skip_forgiving() -> None:
    clock = Clock()
    pacer = RefusalPacer(clock)
    assert not pacer.remembers()
    held_for(pacer, clock, refusal(b"a"))
    assert pacer.remembers() and pacer.remembers(b"a") and not pacer.remembers(b"b")
    pacer.forgive(b"b")
    assert pacer.remembers(b"a")  # another connection's reply forgives only that one
    pacer.forgive(b"a")
    assert not pacer.remembers() and not pacer.remembers(b"a")


def test_refusals_come_due_in_order_and_all_at_a_drain() -> None:
    clock = Clock()
    pacer = RefusalPacer(clock)
    late, early = refusal(b"a", 1), refusal(b"b", 2)
    for _ in range(3):
        held_for(pacer, clock, refusal(b"a"))  # a has earned 0.8 s for its next
    pacer.hold(late)
    pacer.hold(early)
    clock.now += FIRST_HOLD_S
    assert list(pacer.due()) == [early]
    assert list(pacer.due(every=True)) == [late] and len(pacer) == 0


def test_refusals_from_other_threads_are_held_from_the_frontends_next_turn() -> None:
    clock = Clock()
    pacer = RefusalPacer(clock)
    frames = refusal(b"a")
    pacer.hold_later(frames)
    assert len(pacer) == 1 and list(pacer.due()) == []
    clock.now += FIRST_HOLD_S
    assert list(pacer.due()) == [frames]


def test_past_the_bound_a_refusal_is_sent_at_once(monkeypatch) -> None:
    monkeypatch.setattr(pacing, "MAX_HELD", 2)
    pacer = RefusalPacer(Clock())
    assert pacer.hold(refusal(b"a")) and pacer.hold(refusal(b"b"))
    assert not pacer.hold(refusal(b"c"))
    pacer.hold_later(refusal(b"d", 4))
    assert list(pacer.due()) == [refusal(b"d", 4)]  # handed in over the bound: given back at once
