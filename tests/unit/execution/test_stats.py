"""Behaviour of the live statistics (infermux.execution.stats)."""

from __future__ import annotations

import json
import threading

import pytest

from infermux.execution.stats import ModelStats, Stats, percentiles


class FakeClock:
    """A clock the test moves by hand, so window expiry needs no sleeping."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_percentiles_are_nearest_rank_values_a_request_actually_saw():
    assert percentiles(range(1, 101)) == (50.0, 90.0, 99.0)
    assert percentiles([7]) == (7.0, 7.0, 7.0)
    assert percentiles([3, 1, 2], qs=(0, 100)) == (1.0, 3.0)
    assert percentiles([]) == (None, None, None)


def test_snapshot_reports_percentiles_of_known_latencies(clock):
    stats = Stats(clock=clock)
    for total in range(1000, 0, -1):  # order must not matter
        stats.record(200, total)
    snap = stats.snapshot()
    assert (snap.p50_us, snap.p90_us, snap.p99_us, snap.max_us) == (500, 900, 990, 1000)
    assert snap.samples == 1000


def test_qps_counts_the_sliding_window_only(clock):
    stats = Stats(clock=clock, window_s=10, bucket_s=1)
    for _ in range(30):  # 30 s at 5 requests per second
        for _ in range(5):
            stats.record(200, 100)
        clock.advance(1)
    assert stats.snapshot().qps == pytest.approx(5, rel=0.1)


def test_qps_is_not_diluted_before_the_window_has_filled(clock):
    stats = Stats(clock=clock, window_s=10)
    clock.advance(2)
    for _ in range(100):
        stats.record(200, 100)
    assert stats.snapshot().qps == pytest.approx(50)


def test_old_samples_expire_but_counters_stay(clock):
    stats = Stats(clock=clock, window_s=10)
    for _ in range(10):
        stats.record(200, 5000)
    clock.advance(11)
    stats.record(200, 100)
    snap = stats.snapshot()
    assert snap.samples == 1 and snap.p99_us == 100
    # One request in the window: 9 whole buckets plus the one just begun.
    assert snap.qps == pytest.approx(1 / 9)
    assert snap.served == 11


def test_an_idle_unit_reports_no_latency(clock):
    snap = Stats(clock=clock).snapshot()
    assert snap.samples == 0 and snap.p50_us is None and snap.qps == 0
    assert snap.service_time_us is None and snap.by_status == {}


def test_replies_are_counted_by_status_and_only_served_ones_shape_latency(clock):
    stats = Stats(clock=clock)
    clock.advance(1)
    for status, total in ((200, 900), (200, 1100), (429, 3), (503, 2), (429, 4)):
        stats.record(status, total)
    snap = stats.snapshot()
    assert snap.by_status == {200: 2, 429: 2, 503: 1}
    assert snap.served == 2
    assert (snap.samples, snap.p50_us, snap.max_us) == (2, 900, 1100)
    assert snap.qps == pytest.approx(2) and snap.error_qps == pytest.approx(3)


def test_a_superseded_reply_is_counted_by_status_but_not_as_an_error(clock):
    stats = Stats(clock=clock)
    clock.advance(1)
    for status in (200, 409, 409, 409, 500):
        stats.record(status, 10)
    snap = stats.snapshot()
    assert snap.by_status == {200: 1, 409: 3, 500: 1}
    assert snap.qps == pytest.approx(1) and snap.error_qps == pytest.approx(1)  # the 500 only


def test_queue_and_compute_time_are_split(clock):
    stats = Stats(clock=clock)
    stats.record(200, 1000, queue_us=300, compute_us=700)
    stats.record(200, 2000, queue_us=500, compute_us=1500)
    snap = stats.snapshot()
    assert (snap.queue_us, snap.compute_us) == (400, 1100)


def test_batch_histogram_counts_backend_calls_not_requests(clock):
    stats = Stats(clock=clock)
    for size in (4, 4, 1):  # as an executor does: one record_batch per call...
        stats.record_batch(size, 100 * size)
        for _ in range(size):  # ...and one record per request in it
            stats.record(200, 150, compute_us=100 * size, batch=size)
    snap = stats.snapshot()
    assert snap.batches == {1: 1, 4: 2}
    assert snap.served == 9


def test_service_time_is_an_ewma_per_request(clock):
    stats = Stats(clock=clock, alpha=0.5)
    assert stats.service_time_us() == 0.0  # unknown: Retry-After arithmetic still works
    assert stats.snapshot().service_time_us is None
    stats.record_batch(4, 800)             # 200 µs per request: the first sample sets it
    assert stats.service_time_us() == 200
    stats.record_batch(1, 400)
    assert stats.service_time_us() == 300  # 200 + 0.5 × (400 − 200)
    assert stats.snapshot().service_time_us == 300


def test_gauges_are_read_at_snapshot_time(clock):
    depth = [3]
    stats = Stats(clock=clock, queue_depth=lambda: depth[0], in_flight=lambda: 2)
    depth[0] = 7
    snap = stats.snapshot()
    assert (snap.queue_depth, snap.in_flight) == (7, 2)


def test_two_threads_lose_no_record():
    stats = Stats()
    per_thread = 50_000
    start = threading.Barrier(2)
    seen_alive = []

    def work(status: int) -> None:
        start.wait()
        for i in range(per_thread):
            stats.record_batch(1, 100)
            stats.record(status, i % 1000, batch=1)
        seen_alive.append(stats.snapshot())  # pooled while both shards may be live

    threads = [threading.Thread(target=work, args=(s,)) for s in (200, 500)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = stats.snapshot()  # both threads ended: their counters must survive
    assert snap.by_status == {200: per_thread, 500: per_thread}
    assert snap.batches == {1: 2 * per_thread}
    assert max(s.served for s in seen_alive) == per_thread


def test_a_record_kept_for_later_is_in_the_next_reading_unsettled(clock):
    """The express lane keeps its records (record_soon) and settles them once a burst: a reading
    taken between a reply and that settle must count the reply already."""
    stats = Stats(clock=clock)
    stats.record_soon(150, 30, 120, 1)
    stats.record_soon(250, 50, 200, 2)
    assert stats.service_time_us() == pytest.approx(120 + 0.1 * (100 - 120))  # the EWMA a row, both calls in
    snap = stats.snapshot()
    assert snap.by_status == {200: 2} and snap.batches == {1: 1, 2: 1}
    assert (snap.p50_us, snap.max_us, snap.compute_us) == (150, 250, 160)
    stats.settle()  # the lane's settle after the reading finds nothing left to count twice
    assert stats.snapshot().by_status == {200: 2}


def test_records_kept_for_later_are_each_counted_once_however_many_threads_settle():
    stats = Stats()
    kept = 40_000
    for i in range(kept):
        stats.record_soon(i % 1000, 0, 100, 1)
    start = threading.Barrier(4)

    def settle() -> None:
        start.wait()
        stats.settle()

    threads = [threading.Thread(target=settle) for _ in range(3)]
    for t in threads:
        t.start()
    start.wait()
    snap = stats.snapshot()  # settles beside the three threads
    for t in threads:
        t.join()
    assert snap.by_status[200] <= kept
    assert stats.snapshot().by_status == {200: kept} and stats.snapshot().batches == {1: kept}


def test_memory_stays_bounded_under_many_records_and_threads(clock):
    stats = Stats(clock=clock, capacity=64)
    for i in range(10_000):
        stats.record(200, i)
    assert stats.snapshot().samples == 64  # the ring keeps only the newest
    for _ in range(50):  # short-lived threads, each with its own shard
        t = threading.Thread(target=stats.record, args=(429, 1))
        t.start()
        t.join()
    snap = stats.snapshot()
    assert len(stats._shards) == 1  # dead threads' shards were folded away...
    assert snap.by_status == {200: 10_000, 429: 50}  # ...without losing their counts


def test_capacity_must_be_a_power_of_two():
    with pytest.raises(ValueError):
        Stats(capacity=1000)


def test_model_stats_pools_router_and_contexts(clock):
    model = ModelStats("classifier", "1", clock=clock, queue_depth=lambda: 5)
    a = model.add_context(in_flight=lambda: 1)
    b = model.add_context(in_flight=lambda: 0)
    clock.advance(1)
    model.router.record(429, 5)
    for i in range(1, 101):
        for ctx, total in ((a, i), (b, 100 + i)):
            ctx.record_batch(1, 100)
            ctx.record(200, total, compute_us=100, batch=1)
    snap = model.snapshot()
    assert snap.total.by_status == {200: 200, 429: 1}
    assert (snap.total.p50_us, snap.total.max_us) == (100, 200)
    assert [c.p50_us for c in snap.contexts] == [50, 150]
    assert (snap.total.queue_depth, snap.total.in_flight) == (5, 1)
    # Two contexts of 100 µs each serve the queue at 50 µs per request.
    assert model.service_time_us() == pytest.approx(50)
    assert snap.total.service_time_us == pytest.approx(50)


def test_removing_a_context_keeps_its_counts(clock):
    model = ModelStats("mlp", "1", clock=clock)
    ctx = model.add_context()
    ctx.record_batch(1, 10)
    ctx.record(200, 10, batch=1)
    model.remove_context(ctx)
    snap = model.snapshot()
    assert snap.contexts == ()
    assert snap.total.by_status == {200: 1} and snap.total.batches == {1: 1}


def test_snapshot_serialises_to_json(clock):
    model = ModelStats("classifier", "1", clock=clock)
    ctx = model.add_context()
    ctx.record_batch(1, 10)
    ctx.record(200, 10, batch=1)
    doc = json.loads(json.dumps(model.snapshot().as_json()))
    assert doc["model"] == "classifier" and doc["by_status"] == {"200": 1}
    assert doc["contexts"][0]["batches"] == {"1": 1}
