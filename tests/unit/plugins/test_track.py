"""The `track` processor on its own: identities across a stream's frames, its bounds, its threads; and
the scores that judge it (IDF1, identity switches) against hand-checked cases.

The shipped sequences (tests/support/tracking.py) are given to the processor
as a detector would give boxes: full boxes with noise, scored by how much of
the object is in view, with misses and false alarms. The same sequences go
through a detector pipeline on a real daemon in tests/daemon/pipelines/test_tracking.py.
"""

from __future__ import annotations

import itertools
import threading
import time
import types

import numpy as np
import pytest

from support import tracking
from support.tracking import Box, idf1, id_switches, max_weight_matching

from infermux.plugins.processors import create
from infermux.plugins.processors.base import ProcessorConfigError, ProcessorError, Region, Sample
from infermux.plugins.processors.track import Track, Tracks


def corners(box: Box) -> np.ndarray:
    x0, y0, x1, y1 = box
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)


def bounds(region: Region) -> Box:
    return tuple(float(v) for v in (*region.box.min(axis=0), *region.box.max(axis=0)))  # type: ignore[return-value]


def frame(key: object, *boxes: tuple[Box, float], time_ns: int | None = None) -> Sample:
    return Sample(key=key, time_ns=time_ns, regions=[Region(corners(b), s) for b, s in boxes])  # type: ignore[arg-type]


def run(tracker: Track, seq: tracking.Sequence, key: object = "cam") -> list[dict[int, Box]]:
    """The sequence's detections through `tracker`, frame by frame: per frame, track id -> box."""
    out = []
    for i in range(seq.length):
        sample = frame(key, *seq.detections(i))
        tracker(sample)
        out.append({r.track_id: bounds(r) for r in sample.regions})  # type: ignore[misc]
    return out


# -- the scores, by hand ---------------------------------------------------------------------------

A, B = (0.0, 0.0, 10.0, 10.0), (50.0, 50.0, 60.0, 60.0)


def test_idf1_and_switches_of_two_objects_whose_ids_swap_halfway() -> None:
    truth = [{1: A, 2: B}] * 4
    predicted = [{7: A, 8: B}, {7: A, 8: B}, {8: A, 7: B}, {8: A, 7: B, 9: (90.0, 0.0, 99.0, 9.0)}]
    # Each true object shares 2 frames with each id: the best assignment (1-7, 2-8 or 1-8, 2-7) keeps
    # 4 of 8 true and 9 predicted detections: IDF1 = 2*4 / (8 + 9).
    scores = idf1(truth, predicted)
    assert (scores.idtp, scores.idfp, scores.idfn) == (4, 5, 4)
    assert scores.idf1 == pytest.approx(8 / 17) and scores.idp == pytest.approx(4 / 9) and scores.idr == 0.5
    assert id_switches(truth, predicted) == 2


def test_idf1_of_one_object_that_changes_id_once() -> None:
    truth = [{1: A}] * 10
    predicted = [{1: A}] * 6 + [{2: (1.0, 1.0, 11.0, 11.0)}] * 4  # IoU 0.68: still the object
    assert idf1(truth, predicted).idf1 == pytest.approx(12 / 20)
    assert id_switches(truth, predicted) == 1
    assert idf1(truth, [{5: (6.0, 6.0, 16.0, 16.0)}] * 10).idtp == 0  # IoU 16/184: not the object


def test_max_weight_matching_finds_the_best_total_of_every_assignment() -> None:
    rng = np.random.default_rng(0)
    for rows, cols in [(1, 1), (3, 3), (4, 2), (2, 5), (5, 5), (6, 4)]:
        for _ in range(20):
            w = rng.integers(0, 6, (rows, cols)).astype(float)
            pairs = max_weight_matching(w)
            assert len({r for r, _ in pairs}) == len(pairs) == len({c for _, c in pairs})
            tall = w if rows >= cols else w.T  # every way to give each column its own row
            best = max(sum(tall[r, c] for c, r in enumerate(chosen))
                       for chosen in itertools.permutations(range(tall.shape[0]), tall.shape[1]))
            assert sum(w[r, c] for r, c in pairs) == best


# -- identities on the shipped sequences -----------------------------------------------------------


@pytest.mark.parametrize("seq", tracking.sequences(), ids=lambda s: s.name)
def test_identities_hold_through_crossings_and_occlusions(seq: tracking.Sequence) -> None:
    truth = seq.ground_truth()
    predicted = run(create("track"), seq)  # type: ignore[arg-type]
    scores, switches = idf1(truth, predicted), id_switches(truth, predicted)
    print(f"{seq.name}: IDF1 {scores.idf1:.3f} (IDP {scores.idp:.3f}, IDR {scores.idr:.3f}), {switches} switches")
    assert scores.idf1 >= 0.9 and switches <= 2, (scores, switches)


def test_without_velocity_or_lost_frames_an_object_behind_a_pillar_comes_back_as_another() -> None:
    """What the filter and the lost frames are for: the pillar sequence fails without either."""
    seq, truth = tracking.pillar(), tracking.pillar().ground_truth()
    assert idf1(truth, run(create("track", {"max_lost": 0}), seq)).idf1 < 0.7  # type: ignore[arg-type]
    still = Track({})

    def no_velocity(self: Track, tracks: Tracks, regions: list[Region], advance: bool) -> list[int | None]:
        tracks.velocity[:] = 0
        return Track._associate(self, tracks, regions, advance)
    still._associate = types.MethodType(no_velocity, still)  # type: ignore[method-assign]
    assert idf1(truth, run(still, seq)).idf1 < 0.7


# -- behaviours ------------------------------------------------------------------------------------


def moving(x: float, score: float = 0.9, y: float = 20.0) -> tuple[Box, float]:
    return (x, y, x + 20.0, y + 20.0), score


def test_a_low_score_detection_keeps_a_track_alive_but_starts_none() -> None:
    tracker = create("track")
    first = frame("k", moving(0), moving(100, 0.3))
    tracker(first)
    assert [r.track_id for r in first.regions] == [1]  # the low one matched nothing: dropped
    half_hidden = frame("k", moving(2, 0.3))
    tracker(half_hidden)
    assert [r.track_id for r in half_hidden.regions] == [1]
    noise = frame("k", moving(200, 0.05))  # under low_score: ignored altogether
    tracker(noise)
    assert noise.regions == []


def test_a_track_survives_max_lost_missed_frames_and_then_ends() -> None:
    tracker = create("track", {"max_lost": 3})
    for x in (0, 4, 8):
        tracker(frame("k", moving(x)))
    for _ in range(3):
        tracker(frame("k"))
    back = frame("k", moving(24))  # it moved on at 4 px a frame while unseen
    tracker(back)
    assert back.regions[0].track_id == 1
    for _ in range(4):
        tracker(frame("k"))
    gone = frame("k", moving(44))
    tracker(gone)
    assert gone.regions[0].track_id == 2


def test_streams_are_tracked_apart_and_ids_are_never_reused() -> None:
    tracker = create("track")
    a, b = frame("cam-a", moving(0)), frame(7, moving(0))
    tracker(a)
    tracker(b)
    assert (a.regions[0].track_id, b.regions[0].track_id) == (1, 2)
    assert tracker.streams() == {"streams": 2, "tracks": 2}  # type: ignore[attr-defined]


def test_a_frame_without_a_key_is_refused_naming_the_key() -> None:
    with pytest.raises(ProcessorError, match="step 'track': needs the request's \"key\""):
        create("track")(Sample(regions=[Region(corners(A), 0.9)]))


def test_a_silent_stream_is_forgotten_after_track_ttl_s() -> None:
    tracker = create("track", {"track_ttl_s": 0.05})
    tracker(frame("k", moving(0)))
    time.sleep(0.1)
    again = frame("other", moving(0))
    tracker(again)  # any frame sweeps the silent streams out
    assert tracker.streams() == {"streams": 1, "tracks": 1}  # type: ignore[attr-defined]
    back = frame("k", moving(0))
    tracker(back)
    assert back.regions[0].track_id == 3


def test_beyond_max_keys_the_least_recently_seen_stream_is_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    tracker = create("track", {"max_keys": 2})
    for key in ("a", "b", "a", "c"):
        tracker(frame(key, moving(0)))
    assert tracker.streams()["streams"] == 2  # type: ignore[attr-defined]
    assert "forgot stream 'b'" in caplog.text and "max_keys" in caplog.text
    again = frame("a", moving(1))
    tracker(again)
    assert again.regions[0].track_id == 1  # "a" was kept


def test_beyond_max_tracks_lost_tracks_give_way_and_seen_ones_never() -> None:
    tracker = create("track", {"max_tracks": 2})
    tracker(frame("k", moving(0), moving(100)))
    crowded = frame("k", moving(0), moving(100), moving(200))
    tracker(crowded)
    assert [r.track_id for r in crowded.regions] == [1, 2]  # no room: the third is dropped
    tracker(frame("k", moving(0), moving(200)))  # track 2 is lost now; the newcomer takes its place
    later = frame("k", moving(0), moving(200), moving(100))
    tracker(later)
    assert [r.track_id for r in later.regions] == [1, 3]


def test_a_frame_older_than_its_streams_newest_gets_ids_but_moves_nothing() -> None:
    tracker = create("track")
    tracker(frame("k", moving(0), time_ns=100))
    tracker(frame("k", moving(4), time_ns=300))
    late = frame("k", moving(2), moving(150), time_ns=200)  # overtaken by the frame of 300
    tracker(late)
    assert [r.track_id for r in late.regions] == [1]  # matched; the newcomer starts no track
    assert tracker.streams()["tracks"] == 1  # type: ignore[attr-defined]
    tracks = tracker._streams["k"].tracks  # type: ignore[attr-defined]
    assert tracks.center[0, 0] == pytest.approx(14.0, abs=0.5)  # where the frame of 300 put it


def test_keep_untracked_keeps_regions_without_an_id_and_crops_stay_in_step() -> None:
    sample = frame("k", moving(0), moving(100, 0.3))
    sample.crops = [np.zeros((2, 2, 3), np.uint8), np.ones((2, 2, 3), np.uint8)]
    create("track", {"keep_untracked": True})(sample)
    assert [r.track_id for r in sample.regions] == [1, None] and len(sample.crops) == 2
    assert "track_id" not in sample.regions[1].to_json() and sample.regions[0].to_json()["track_id"] == 1
    dropped = frame("k", moving(0), moving(100, 0.3))
    dropped.crops = [np.zeros((2, 2, 3), np.uint8), np.ones((2, 2, 3), np.uint8)]
    create("track")(dropped)
    assert len(dropped.regions) == 1 and len(dropped.crops) == 1 and dropped.crops[0].max() == 0


def test_streams_on_four_threads_get_the_identities_of_a_serial_run() -> None:
    """Many streams at once, one lock each: each stream's ids are the serial run's, renamed."""
    seqs = tracking.sequences()
    serial = {seq.name: run(create("track"), seq, key=seq.name) for seq in seqs}  # type: ignore[arg-type]
    shared = create("track")
    results: dict[str, list[dict[int, Box]]] = {}

    def one(seq: tracking.Sequence) -> None:
        results[seq.name] = run(shared, seq, key=seq.name)  # type: ignore[arg-type]
    threads = [threading.Thread(target=one, args=(seq,)) for seq in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for seq in seqs:
        rename: dict[int, int] = {}
        for mine, theirs in zip(results[seq.name], serial[seq.name]):
            assert sorted(mine.values()) == sorted(theirs.values())
            for (id_a, box_a), (id_b, box_b) in zip(sorted(mine.items(), key=lambda kv: kv[1]),
                                                    sorted(theirs.items(), key=lambda kv: kv[1])):
                assert rename.setdefault(id_a, id_b) == id_b
    ids = [{i for f in frames for i in f} for frames in results.values()]
    assert sum(map(len, ids)) == len(set().union(*ids))  # no id is shared between streams


def test_one_streams_frames_from_two_threads_each_get_ids_and_the_state_stays_whole() -> None:
    tracker = create("track")
    seq = tracking.crowd()
    clock = itertools.count(1)
    samples = [frame("k", *seq.detections(i), time_ns=next(clock)) for i in range(seq.length)]
    errors: list[BaseException] = []

    def lane(part: list[Sample]) -> None:
        try:
            for sample in part:
                tracker(sample)
        except BaseException as exc:  # a thread's exception would otherwise only be a warning
            errors.append(exc)
    threads = [threading.Thread(target=lane, args=(samples[k::2],)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # However the threads interleaved (a frame overtaken by a newer one is matched, not followed),
    # the tracks are whole: each id once, the arrays in step, within bounds.
    tracks = tracker._streams["k"].tracks  # type: ignore[attr-defined]
    assert len(tracks.ids) == len(set(tracks.ids.tolist())) == len(tracks.center) == len(tracks.lost) <= 64
    assert all(r.track_id is not None for s in samples for r in s.regions)


@pytest.mark.parametrize("options, words", [
    ({"low_score": 0.8, "high_score": 0.5}, ["'low_score'", "high_score"]),
    ({"match_iou": 1.5}, ["'match_iou'", "between 0 and 1"]),
    ({"track_ttl_s": 0}, ["'track_ttl_s'", "positive"]),
    ({"max_keys": 0}, ["'max_keys'"]),
    ({"ttl": 5}, ["unknown option 'ttl'"]),
])
def test_bad_options_are_refused_naming_the_option(options: dict, words: list[str]) -> None:
    with pytest.raises(ProcessorConfigError) as error:
        create("track", options)
    assert all(w in str(error.value) for w in words), str(error.value)


def test_keys_cycling_past_max_keys_log_one_line_an_interval_with_the_key_cut_short(
        caplog: pytest.LogCaptureFixture) -> None:
    tracker = create("track", {"max_keys": 2})
    with caplog.at_level("WARNING", logger="infermux.processors.track"):
        for n in range(500):  # each a new stream past max_keys: 498 forgotten
            tracker(frame(f"{n:05d}" + "k" * 60_000, moving(0)))
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "forgot stream '00000kkk" in lines[0], lines[:3]
        assert len(lines[0]) < 400 and "(60005 characters)" in lines[0]
        tracker._said_at -= 10  # type: ignore[attr-defined]  # the interval is over: the next line sums up
        tracker.streams()  # type: ignore[attr-defined]
        summed = [r.getMessage() for r in caplog.records][1:]
    assert len(summed) == 1 and "forgot 497 streams in the last 10 s" in summed[0], summed
    assert "'00497kkk" in summed[0] and len(summed[0]) < 400  # the latest forgotten (498, 499 are kept)
