"""When the reading thread computes a request itself (inline.py)."""

from infermux.serving.inline import InlinePolicy, track_compute

POLICY = InlinePolicy(idle_max_us=500, busy_max_us=100)


def test_with_nobody_waiting_anything_under_the_idle_limit_runs_inline():
    assert POLICY.allows(400, batching=False, others_waiting=False)
    assert POLICY.allows(400, batching=True, others_waiting=False)
    assert not POLICY.allows(600, batching=False, others_waiting=False)


def test_with_others_waiting_only_computes_shorter_than_a_hand_off_run_inline():
    assert POLICY.allows(50, batching=False, others_waiting=True)
    assert not POLICY.allows(150, batching=False, others_waiting=True)


def test_with_others_waiting_a_batched_model_leaves_them_the_chance_to_join_a_batch():
    assert not POLICY.allows(10, batching=True, others_waiting=True)


def test_a_zero_idle_limit_turns_inline_off_altogether():
    off = InlinePolicy(idle_max_us=0, busy_max_us=100)
    assert not off.allows(1, batching=False, others_waiting=False)
    assert not off.allows(1, batching=False, others_waiting=True)


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


def test_a_held_batch_runs_inline_when_nothing_waits_and_it_is_under_the_idle_limit():
    assert POLICY.allows_batch(400, requests=1, others_waiting=False)
    assert not POLICY.allows_batch(600, requests=16, others_waiting=False)


def test_with_others_waiting_a_held_batch_is_judged_per_request_like_a_hand_off():
    assert POLICY.allows_batch(16 * 8, requests=16, others_waiting=True)  # 8 µs a request
    assert not POLICY.allows_batch(2 * 150, requests=2, others_waiting=True)  # 150 µs a request
