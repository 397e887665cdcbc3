"""FairQueue: round-robin across keys, and how `take` forms one batch."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from infermux.execution.fairqueue import Closed, FairQueue, Lane, longest_lane
from support.polling import eventually


@dataclass
class Item:
    key: str | None
    name: str
    rows: int = 1
    shape: str = "a"
    patience: float = 60.0


def queue() -> FairQueue[Item]:
    return FairQueue(key=lambda i: i.key, size=lambda i: i.rows, patience=lambda i: i.patience)


def put_later(q: FairQueue[Item], delay_s: float, *items: Item) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        for item in items:
            q.put(item)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def names(items: list[Item]) -> list[str]:
    return [i.name for i in items]


# A batch delay no test waits out: a take that returns within half of it did not wait for it,
# however late a busy box wakes the threads involved.
LONG_S = 30.0


def test_keys_take_turns_so_a_flood_does_not_starve_the_others():
    q = queue()
    for i in range(5):
        q.put(Item("flood", f"f{i}"))
    q.put(Item("cam1", "a"))
    q.put(Item(None, "n"))  # no key: the shared lane
    q.put(Item("cam1", "b"))
    # New lanes in arrival order, then the backlogged ones in turn, one item each.
    assert [q.get().name for _ in range(8)] == ["f0", "a", "n", "f1", "b", "f2", "f3", "f4"]
    assert len(q) == 0 and q.rows == 0


def test_a_key_that_was_idle_goes_before_the_backlogged_ones():
    q = queue()
    for i in range(5):
        q.put(Item("flood", f"f{i}"))
    assert q.get().name == "f0"  # the flood is backlogged from here on
    q.put(Item("cam", "c0"))
    assert q.get().name == "c0"  # not behind f1: an idle key is served first, once
    q.put(Item("cam", "c1"))
    q.put(Item("cam", "c2"))
    assert [q.get().name for _ in range(4)] == ["f1", "c1", "f2", "c2"]  # then both backlogs in turn


def test_backlogged_keys_take_strict_turns_whatever_their_lengths():
    q = queue()
    for i in range(3):
        q.put(Item("a", f"a{i}"))
        q.put(Item("b", f"b{i}"))
    for i in range(6):
        q.put(Item("flood", f"f{i}"))
    # a, b, flood enter as new lanes, once each; then one each in turn, however long each backlog.
    assert [q.get().name for _ in range(12)] == ["a0", "b0", "f0", "a1", "b1", "f1", "a2", "b2",
                                                   "f2", "f3", "f4", "f5"]


def test_keys_sending_at_equal_rates_are_served_equally_at_a_full_queue():
    # Six keys send one item each per round, in a rotating order; the consumer takes three per round
    # (half of what arrives) and arrivals past 24 queued are refused. Each key must get its share: when
    # the shortest backlog was served first, the keys that happened to be short kept getting served
    # and the rest starved.
    q = queue()
    keys = [f"cam{i}" for i in range(6)]
    served = dict.fromkeys(keys, 0)
    for round_ in range(400):
        for i in range(6):
            key = keys[(round_ + i) % 6]
            if len(q) < 24:
                q.put(Item(key, f"{key}-{round_}"))
        for _ in range(3):
            served[q.get().key] += 1
    mean = sum(served.values()) / len(served)
    assert all(abs(n - mean) <= 0.05 * mean for n in served.values()), served


def test_a_lane_that_just_emptied_does_not_come_back_as_new():
    q = queue()
    q.put(Item("flood", "f0"))
    assert q.get().name == "f0"  # the flood's lane is empty, but still old until the next dequeue
    q.put(Item("flood", "f1"))
    q.put(Item("cam", "c0"))
    assert [q.get().name for _ in range(2)] == ["c0", "f1"]
    q.put(Item("cam", "c1"))  # the camera's lane stayed empty over a dequeue: forgotten, new again
    q.put(Item("flood", "f2"))  # the flood's emptied at the last one: still old
    assert [q.get().name for _ in range(2)] == ["c1", "f2"]


def test_pushing_out_takes_the_newest_or_the_oldest_of_a_key():
    q = queue()
    for name in ("f0", "f1", "f2", "f3"):
        q.put(Item("flood", name))
    q.put(Item("cam", "c0"))
    lanes = q.lanes()
    assert {k: lane.count for k, lane in lanes.items()} == {"flood": 4, "cam": 1}
    assert (lanes["flood"].oldest.name, lanes["flood"].newest.name) == ("f0", "f3")
    assert q.pop_newest("flood").name == "f3"
    assert q.pop_oldest("flood").name == "f0"
    assert q.pop_newest("cam").name == "c0" and q.pop_newest("cam") is None and q.pop_oldest("cam") is None
    assert [q.get().name for _ in range(2)] == ["f1", "f2"] and len(q) == 0 and q.rows == 0


def test_a_stream_keeps_its_newest_items_and_hands_back_the_ones_they_replace():
    q = queue()
    assert q.put(Item("cam", "c0", rows=2), keep=1) == []
    q.put(Item("other", "o0"), keep=1)
    replaced = q.put(Item("cam", "c1"), keep=1)
    assert [i.name for i in replaced] == ["c0"] and q.count("cam") == 1 and len(q) == 2 and q.rows == 2
    assert [i.name for i in q.put(Item("cam", "c2"), keep=2)] == []  # room for two
    assert [i.name for i in q.put(Item("cam", "c3"), keep=2)] == ["c1"]
    # The stream's lane kept its place in the round: it came first, and goes first.
    assert [q.get().name for _ in range(3)] == ["c2", "o0", "c3"] and len(q) == 0 and q.rows == 0


def test_a_stream_s_lane_keeps_its_turn_when_its_item_is_replaced():
    q = queue()
    q.put(Item("a", "a0"), keep=1)
    q.put(Item("b", "b0"), keep=1)
    q.put(Item("a", "a1"), keep=1)  # replaces a0 where a0 stood: a is still served first
    assert [q.get().name for _ in range(2)] == ["a1", "b0"]
    assert q.put(Item(None, "n0"), keep=0) == [] and q.put(Item(None, "n1")) == []  # no keep: all stay
    assert len(q) == 2


def test_streams_take_turns_by_how_long_they_waited_not_by_coming_back_as_new():
    # A stream's lane empties each time it is served. Were its next frame "new" when it came after a
    # dequeue, it would go ahead of a camera whose frame came just before one: that camera, its
    # frame replaced but never emptied, waits behind the others' every frame (six equal cameras on
    # a pipeline were served 59 to 101 frames each).
    q = queue()
    q.put(Item("c", "c0"), keep=1)
    assert q.get().name == "c0"
    q.put(Item("c", "c1"), keep=1)  # c waits from here on
    served = []
    for n in range(4):  # a and b come and go; c's frame is replaced as it waits, keeping its turn
        q.put(Item("ab"[n % 2], f"{'ab'[n % 2]}{n}"), keep=1)
        q.put(Item("c", f"c{n + 2}"), keep=1)
        served.append(q.get().name)
    assert served == ["c2", "a0", "c4", "b3"]  # in turns: c, then a, b as they joined, c replaced as it waits
    assert q.put(Item(None, "n0")) == [] and q.get().name == "n0"  # a request of no stream is still new


def test_take_counts_rows_and_leaves_what_would_pass_the_limit():
    q = queue()
    for item in (Item("a", "3rows", 3), Item("b", "2rows", 2), Item("c", "4rows", 4)):
        q.put(item)
    assert names(q.take(6, 0.0)) == ["3rows", "2rows"]  # 3 + 2 + 4 > 6
    assert names(q.take(6, 0.0)) == ["4rows"] and q.rows == 0


def test_a_request_larger_than_the_limit_runs_alone():
    q = queue()
    q.put(Item("a", "big", 40))
    q.put(Item("a", "small", 1))
    assert names(q.take(16, 0.0)) == ["big"]


def test_take_merges_only_requests_that_fit_the_first_and_skips_lanes_that_do_not():
    q = queue()
    for item in (Item("a", "a1"), Item("b", "b1"), Item("c", "other", shape="b"), Item("d", "d1"),
                 Item("c", "other2", shape="b"), Item("a", "a2")):
        q.put(item)
    batch = q.take(8, 0.0, fits=lambda first, i: i.shape == first.shape)
    assert names(batch) == ["a1", "b1", "d1", "a2"]
    assert q.get().name == "other"  # the skipped lane kept its turn and its order
    assert q.get().name == "other2"


@pytest.mark.timing
def test_a_batch_with_nothing_fitting_goes_without_waiting():
    q = queue()
    q.put(Item("a", "a1"))
    q.put(Item("b", "b1", shape="b"))
    start = time.monotonic()
    assert names(q.take(8, LONG_S, fits=lambda first, i: i.shape == first.shape)) == ["a1"]
    assert time.monotonic() - start < LONG_S / 2


def test_a_smaller_request_from_another_lane_fills_the_room_left():
    q = queue()
    for item in (Item("a", "five", 5), Item("b", "four", 4), Item("c", "three", 3)):
        q.put(item)
    assert names(q.take(8, 0.0)) == ["five", "three"]
    assert q.get().name == "four"


@pytest.mark.timing
def test_take_waits_for_company_up_to_the_delay():
    q = queue()
    q.put(Item("a", "first"))
    feeder = put_later(q, 0.02, Item("b", "late"))
    start = time.monotonic()
    batch = q.take(2, LONG_S)
    feeder.join()
    assert names(batch) == ["first", "late"]
    assert time.monotonic() - start < LONG_S / 2  # the limit was reached: no waiting out the delay


@pytest.mark.timing
def test_take_goes_with_what_it_has_when_the_delay_is_over():
    q = queue()
    q.put(Item("a", "alone"))
    start = time.monotonic()
    assert names(q.take(8, 0.05)) == ["alone"]
    assert 0.05 <= time.monotonic() - start < LONG_S / 2


@pytest.mark.timing
def test_the_wait_never_passes_a_taken_request_s_patience():
    q = queue()
    q.put(Item("a", "urgent", patience=0.03))
    start = time.monotonic()
    assert names(q.take(8, LONG_S)) == ["urgent"]
    assert time.monotonic() - start < LONG_S / 2


@pytest.mark.timing
def test_a_request_joining_later_shortens_the_wait_too():
    q = queue()
    q.put(Item("a", "patient"))
    feeder = put_later(q, 0.01, Item("b", "urgent", patience=0.03))
    start = time.monotonic()
    batch = q.take(8, LONG_S)
    feeder.join()
    assert names(batch) == ["patient", "urgent"] and time.monotonic() - start < LONG_S / 2


@pytest.mark.timing
def test_a_preferred_size_goes_at_once_when_nothing_else_waits():
    q = queue()
    q.put(Item("a", "a1"))
    feeder = put_later(q, 0.01, Item("b", "b1"))
    start = time.monotonic()
    batch = q.take(8, LONG_S, preferred=(2, 4))
    feeder.join()
    assert names(batch) == ["a1", "b1"] and time.monotonic() - start < LONG_S / 2


def test_the_largest_preferred_size_goes_even_with_more_queued():
    q = queue()
    for i in range(6):
        q.put(Item(str(i), f"i{i}"))
    assert len(q.take(8, 5.0, preferred=(4,))) == 4
    assert len(q) == 2


@pytest.mark.timing
def test_without_a_preferred_size_in_reach_the_batch_waits_out_the_delay():
    q = queue()
    for i in range(3):
        q.put(Item(str(i), f"i{i}"))
    start = time.monotonic()
    assert len(q.take(8, 0.05, preferred=(2, 4))) == 3  # 3 is not preferred: wait for 4
    assert time.monotonic() - start >= 0.04


@pytest.mark.timing
def test_preferred_sizes_above_the_limit_are_ignored():
    q = queue()
    q.put(Item("a", "a1"))
    start = time.monotonic()
    assert len(q.take(1, LONG_S, preferred=(4,))) == 1
    assert time.monotonic() - start < LONG_S / 2


@pytest.mark.timing
def test_close_wakes_a_waiting_taker_and_then_refuses():
    q = queue()
    taker_result: list[object] = []

    def take() -> None:
        try:
            taker_result.append(q.take(4, 5.0))
        except Closed:
            taker_result.append("closed")

    thread = threading.Thread(target=take)
    thread.start()
    eventually(lambda: q._waiting, "the consumer to wait", LONG_S, interval_s=0.005)
    q.close()
    thread.join(LONG_S)
    assert taker_result == ["closed"]
    with pytest.raises(Closed):
        q.put(Item("a", "after"))


@pytest.mark.timing
def test_a_waiting_consumer_wakes_for_an_item_of_zero_rows() -> None:
    """Found by the fuzzer: a [0, ...] request sat unseen while its executor slept."""
    import threading

    q: FairQueue[tuple[str, int]] = FairQueue(key=lambda item: item[0], size=lambda item: item[1])
    got: list = []
    consumer = threading.Thread(target=lambda: got.append(q.get()))
    consumer.start()
    eventually(lambda: q._waiting, "the consumer to wait", LONG_S, interval_s=0.005)
    q.put(("cam", 0))
    consumer.join(LONG_S)
    assert got == [("cam", 0)]


@pytest.mark.timing
def test_an_item_put_without_waking_stays_unseen_until_wake() -> None:
    """The frontend holds a burst for itself (inline.py); `wake` hands the rest to the executor."""
    q = queue()
    got: list[Item] = []
    consumer = threading.Thread(target=lambda: got.append(q.get()))
    consumer.start()
    # Put before the consumer waits, the item would be seen at once.
    eventually(lambda: q._waiting, "the consumer to wait", LONG_S, interval_s=0.005)
    q.put(Item("a", "held"), wake=False)
    consumer.join(0.2)
    assert consumer.is_alive() and not got
    q.wake()
    consumer.join(LONG_S)
    assert names(got) == ["held"]


@pytest.mark.timing
def test_a_non_blocking_take_of_an_empty_queue_is_an_empty_batch() -> None:
    q = queue()
    start = time.monotonic()
    assert q.take(4, LONG_S, block=False) == []
    assert time.monotonic() - start < LONG_S / 2


@pytest.mark.timing
def test_a_non_blocking_take_takes_what_is_queued_without_waiting_for_company() -> None:
    q = queue()
    for i in range(3):
        q.put(Item(None, f"r{i}"), wake=False)
    start = time.monotonic()
    assert names(q.take(8, 0.0, block=False)) == ["r0", "r1", "r2"]
    assert time.monotonic() - start < LONG_S / 2


def test_wait_returns_once_an_item_is_queued_and_raises_once_closed_and_empty() -> None:
    q: FairQueue[int] = FairQueue(key=lambda item: None)
    q.put(1)
    q.wait()  # an item is there: at once, and it stays queued
    assert len(q) == 1 and q.get() == 1
    q.close()
    with pytest.raises(Closed):
        q.wait()


# -- longest-queue drop at a full queue -------------------------------------------------------------


def lanes(**held: list[tuple[int, int, int, str]]) -> dict[str, list[tuple[Lane[int], str]]]:
    """Per key, (count, oldest arrival, newest arrival) in each named queue."""
    return {key: [(Lane(n, old, new), where) for n, old, new, where in spots] for key, spots in held.items()}


def test_the_key_holding_most_gives_up_one_for_a_key_holding_less() -> None:
    held = lanes(flood=[(3, 1, 9, "ctx0"), (2, 4, 8, "ctx1")], cam=[(1, 5, 5, "ctx0")])
    assert longest_lane(held, "cam", True, int) == ("flood", "ctx0")  # its newest, 9, is in ctx0
    assert longest_lane(held, "other", True, int) == ("flood", "ctx0")
    assert longest_lane(held, "cam", False, int) == ("flood", "ctx0")  # its oldest, 1, is in ctx0 too
    assert longest_lane(held, "flood", True, int) is None  # it would hold no less than the most


def test_a_key_one_short_of_the_most_is_refused_not_swapped() -> None:
    held = lanes(a=[(2, 1, 2, "q")], b=[(1, 3, 3, "q")])
    assert longest_lane(held, "b", True, int) is None  # b would hold 2, as much as a: nothing gained
    assert longest_lane(held, "c", True, int) == ("a", "q")
    assert longest_lane({}, "c", True, int) is None


def test_among_keys_holding_as_much_the_newest_or_oldest_end_loses() -> None:
    held = lanes(a=[(2, 1, 7, "q")], b=[(2, 3, 6, "q")])
    assert longest_lane(held, "c", True, int) == ("a", "q")  # fifo: whose newest came last
    assert longest_lane(held, "c", False, int) == ("a", "q")  # streams: whose oldest came first
    held = lanes(a=[(2, 4, 5, "q")], b=[(2, 3, 6, "q")])
    assert longest_lane(held, "c", True, int) == ("b", "q")
    assert longest_lane(held, "c", False, int) == ("b", "q")
