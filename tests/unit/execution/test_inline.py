"""When the reading thread computes a request itself (inline.py)."""

import queue
import time

import numpy as np

from infermux.protocol import Request
from infermux.execution.executor import BatchPolicy, Executor
from infermux.execution.inline import InlinePolicy, track_compute
from infermux.execution.job import Job, Outcome

POLICY = InlinePolicy(idle_max_us=500, busy_max_us=100)  # the limits given, not the defaults


def test_with_nobody_waiting_anything_under_the_idle_limit_runs_inline():
    assert POLICY.allows(400, batching=False, others_waiting=lambda: False)
    assert POLICY.allows(400, batching=True, others_waiting=lambda: False)
    assert not POLICY.allows(600, batching=False, others_waiting=lambda: False)


def test_with_others_waiting_only_computes_shorter_than_a_hand_off_run_inline():
    assert POLICY.allows(50, batching=False, others_waiting=lambda: True)
    assert not POLICY.allows(150, batching=False, others_waiting=lambda: True)


def test_the_socket_is_not_asked_about_a_request_short_enough_for_either_limit():
    def not_to_be_asked() -> bool:
        raise AssertionError("others_waiting was asked")

    assert POLICY.allows(50, batching=False, others_waiting=not_to_be_asked)


def test_with_others_waiting_a_batched_model_leaves_them_the_chance_to_join_a_batch():
    assert not POLICY.allows(10, batching=True, others_waiting=lambda: True)


def test_a_zero_idle_limit_turns_inline_off_altogether():
    off = InlinePolicy(idle_max_us=0, busy_max_us=100)
    assert not off.allows(1, batching=False, others_waiting=lambda: False)
    assert not off.allows(1, batching=False, others_waiting=lambda: True)


def test_the_first_sample_is_the_estimate():
    assert track_compute(0.0, 42.0) == 42.0


def test_a_gil_stall_barely_moves_the_estimate():
    estimate = 40.0
    estimate = track_compute(estimate, 5000.0)  # off the CPU for 5 ms on a loaded box
    estimate = track_compute(estimate, 40.0)
    assert estimate < 100  # still inline-worthy


def test_a_lasting_slowdown_shows_within_fifty_calls():
    estimate = 40.0
    for _ in range(50):
        estimate = track_compute(estimate, 400.0)
    assert estimate > 300


def test_a_speedup_shows_at_once():
    assert track_compute(400.0, 40.0) == 220.0


def test_a_sample_that_may_not_raise_the_estimate_can_still_lower_it():
    assert track_compute(40.0, 5000.0, may_rise=False) == 40.0
    assert track_compute(400.0, 40.0, may_rise=False) == 220.0


class _Timed:
    """A context whose calls take `seconds` (time.sleep lets go of the GIL, as a backend's call does)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def infer(self, inputs):
        time.sleep(self.seconds)
        return {"y": np.zeros((1, 1), np.float32)}

    def close(self) -> None:
        pass


def _job(tag: bytes) -> Job:
    now = time.perf_counter_ns()
    return Job([tag], Request("m", {"x": np.zeros((1, 1), np.float32)}), [], now, now + 10**10)


def test_a_slow_call_on_the_executor_thread_raises_the_deadline_estimate_not_the_inline_one():
    context, outcomes = _Timed(), queue.Queue()
    executor = Executor("m", "1", 0, context, lambda envelope, frames, outcome=None: outcomes.put(outcome),
                        lambda job: None, BatchPolicy(1, 0, (), False))
    executor.row_us = executor.row_wall_us = 100.0
    executor.start()
    try:
        context.seconds = 0.02  # 200 times the estimate, as a wait for the GIL can make it
        executor.queue.put(_job(b"handed-off"))
        assert isinstance(outcomes.get(timeout=10), Outcome)
        assert executor.row_us == 100.0  # the inline gate is not closed by the executor's own waits
        assert executor.row_wall_us > 100.0  # but a deadline allows for them
        assert executor.compute(_job(b"inline"))  # on this thread: what inlining really costs
        assert executor.row_us > 100.0
    finally:
        executor.stop(10)


def test_a_held_batch_runs_inline_when_nothing_waits_and_it_is_under_the_idle_limit():
    assert POLICY.allows_batch(400, requests=1, others_waiting=False)
    assert not POLICY.allows_batch(600, requests=16, others_waiting=False)


def test_with_others_waiting_a_held_batch_is_judged_per_request_like_a_hand_off():
    assert POLICY.allows_batch(16 * 8, requests=16, others_waiting=True)  # 8 µs a request
    assert not POLICY.allows_batch(2 * 150, requests=2, others_waiting=True)  # 150 µs a request
