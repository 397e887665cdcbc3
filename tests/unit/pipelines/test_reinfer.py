"""Which regions a re-inferred step computes: by frames of the track, by growth, within a budget; what it forgets.

The clock is a test's own, so the budget's arithmetic is exact. The daemon
side (the same decisions, counted on the model) is tests/daemon/pipelines/test_tracking.py.
"""

from __future__ import annotations

import numpy as np

from infermux.pipelines.reinfer import Lifetimes, Policy, Reinfer, TokenBucket
from infermux.plugins.processors.base import Region
from support.clock import Clock


def square(track_id: int | None, side: float = 10.0) -> Region:
    box = np.array([[0, 0], [side, 0], [side, side], [0, side]], np.float32)
    return Region(box, 0.9, track_id=track_id)


def frame(reinfer: Reinfer, key: str | None, *regions: Region, label: str = "computed") -> list[Region]:
    """One frame through the step: what it computes gets `label` (as the stage would) and is remembered."""
    now = reinfer.admit(key, list(regions))
    for i in now:
        regions[i].label = label
        reinfer.remember(key, regions[i])
    return list(regions)


def test_a_track_is_computed_on_its_first_frame_and_every_nth_after() -> None:
    reinfer = Reinfer(Policy(every=3), Lifetimes())
    computed = []
    for k in range(10):
        (region,) = frame(reinfer, "cam", square(1), label=f"answer {k}")
        computed.append(region.cached is False)
        if region.cached:
            assert region.label == f"answer {3 * (k // 3)}"  # the last answer computed for the track
    assert [k for k, c in enumerate(computed) if c] == [0, 3, 6, 9]
    assert reinfer.counts()["computed"] == 4 and reinfer.counts()["reused"] == 6


def test_frames_count_per_track_so_a_newcomer_starts_its_own_count() -> None:
    reinfer = Reinfer(Policy(every=2), Lifetimes())
    frame(reinfer, "cam", square(1))
    a, b = frame(reinfer, "cam", square(1), square(2))
    assert (a.cached, b.cached) == (True, False)
    a, b = frame(reinfer, "cam", square(1), square(2))
    assert (a.cached, b.cached) == (False, True)


def test_growth_recomputes_against_the_area_when_last_computed() -> None:
    reinfer = Reinfer(Policy(growth=0.2), Lifetimes())
    sides = [10, 10.5, 11, 11.5, 9]  # areas +10 %, +21 %, then +9 % and -33 % from 12.1
    cached = [frame(reinfer, "cam", square(1, side))[0].cached for side in sides]
    assert cached == [False, True, False, True, False]


def test_streams_keep_their_own_answers_for_the_same_track_id() -> None:
    reinfer = Reinfer(Policy(every=5), Lifetimes())
    frame(reinfer, "a", square(1), label="from a")
    frame(reinfer, "b", square(1), label="from b")
    assert frame(reinfer, "a", square(1))[0].label == "from a"
    assert frame(reinfer, "b", square(1))[0].label == "from b"


def test_the_budget_goes_to_tracks_without_an_answer_then_the_stalest() -> None:
    clock = Clock(0.0)
    reinfer = Reinfer(Policy(every=1, max_calls_per_s=2), Lifetimes(), clock)
    first = frame(reinfer, "cam", square(1), square(2), square(3))
    assert [r.cached for r in first] == [False, False, False] and first[2].skipped  # 2 tokens, 3 tracks
    assert first[2].label is None and "label" not in first[2].to_json() and first[2].to_json()["skipped"]
    clock.now = 0.5  # one token back
    second = frame(reinfer, "cam", square(1), square(2), square(3))
    assert [(r.cached, r.skipped) for r in second] == [(True, False), (True, False), (False, False)]
    clock.now = 1.0
    third = frame(reinfer, "cam", square(1), square(2), square(3))
    assert [r.cached for r in third] == [False, True, True]  # 1 and 2 were equally stale: the first


def test_the_budget_is_shared_by_every_stream() -> None:
    clock = Clock(0.0)
    reinfer = Reinfer(Policy(max_calls_per_s=10), Lifetimes(), clock)
    computed = 0
    for step in range(100):  # 10 streams sending 10 frames a second, for 10 s
        clock.now = step / 10
        for key in range(10):
            computed += sum(r.cached is False and not r.skipped for r in frame(reinfer, str(key), square(1)))
    # The first second's burst, then 10 a second at most; each stream's own share of them now decides
    # which stream has a call at each tick, so a tick where none has one leaves a token for later.
    assert 10 + 97 <= computed <= 10 + 99


def test_a_flooding_stream_spends_its_own_share_and_leaves_the_others_theirs() -> None:
    clock = Clock(0.0)
    reinfer = Reinfer(Policy(every=1, max_calls_per_s=20), Lifetimes(), clock)
    flood = victim = 0
    for step in range(200):  # 10 s: the flood sends 20 frames of 10 regions a second, the victim 5 of 4
        clock.now = step / 20
        flood += len(reinfer.admit("flood", [square(t) for t in range(10)]))
        if step % 4 == 0:
            victim += len(reinfer.admit("victim", [square(t) for t in range(4)]))
    assert 80 <= victim <= 110, (flood, victim)  # its half of 20 a second, 10 s long
    assert flood + victim <= 20 * 10 + 20  # and all of them within the step's own rate


def test_keys_made_up_by_the_thousand_do_not_add_to_the_budget() -> None:
    clock = Clock(0.0)
    reinfer = Reinfer(Policy(every=1, max_calls_per_s=10), Lifetimes(max_keys=4096), clock)
    computed = 0
    for step in range(100):  # 10 s, 100 new keys a second with one region each
        clock.now = step / 10
        for k in range(10):
            computed += len(reinfer.admit(f"made-up-{step}-{k}", [square(1)]))
    assert computed <= 10 + 10 * 10


def test_regions_without_a_track_are_computed_while_the_budget_lasts_and_skipped_after() -> None:
    reinfer = Reinfer(Policy(max_calls_per_s=1), Lifetimes(), Clock(0.0))
    first = frame(reinfer, None, square(None), square(None))
    assert [(r.cached, r.skipped) for r in first] == [(False, False), (False, True)]


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    clock = Clock(0.0)
    bucket = TokenBucket(rate=4, burst=2, clock=clock)
    assert bucket.take(5) == 2 and bucket.take(1) == 0
    clock.now = 0.25
    assert bucket.take(3) == 1
    clock.now = 100.0
    assert bucket.take(10) == 2


def test_a_track_unseen_longer_than_a_track_lives_is_forgotten() -> None:
    reinfer = Reinfer(Policy(every=10), Lifetimes(forget_after=2))
    frame(reinfer, "cam", square(1), square(2))
    for _ in range(3):
        frame(reinfer, "cam", square(2))
    assert reinfer.counts()["tracks"] == 1
    assert frame(reinfer, "cam", square(1))[0].cached is False  # its answer went with it


def test_a_silent_stream_is_forgotten_and_at_most_max_keys_are_kept() -> None:
    clock = Clock(0.0)
    reinfer = Reinfer(Policy(every=10), Lifetimes(ttl_s=5, max_keys=2), clock)
    for key in ("a", "b", "c"):
        frame(reinfer, key, square(1))
    assert reinfer.counts()["streams"] == 2
    assert frame(reinfer, "a", square(1))[0].cached is False  # "a" was the least recent: forgotten
    clock.now = 6.0
    frame(reinfer, "d", square(1))
    assert reinfer.counts()["streams"] == 1


def test_at_most_max_tracks_answers_per_stream_the_least_recently_seen_go() -> None:
    reinfer = Reinfer(Policy(every=10), Lifetimes(max_tracks=2, forget_after=100))
    frame(reinfer, "cam", square(1))
    frame(reinfer, "cam", square(2), square(3))
    assert reinfer.counts()["tracks"] == 2
    assert frame(reinfer, "cam", square(1))[0].cached is False
