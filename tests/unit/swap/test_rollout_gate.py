"""The rollout's gate (swap/gate.py): a candidate passes only if it agrees, is about as fast and fits its
memory, and is refused the moment it can no longer pass."""

from __future__ import annotations

from infermux.config import RolloutConfig
from infermux.swap.gate import GROSS, LATENCY_EARLY, LATENCY_FIRST, Measures, judge


def timed(serving_us: int, candidate_us: int, n: int) -> Measures:
    measures = Measures()
    for _ in range(n):
        measures.timed(serving_us, candidate_us)
    return measures


def test_a_candidate_is_refused_at_the_first_miss_that_leaves_min_agreement_out_of_reach() -> None:
    config = RolloutConfig(shadow_requests=200, min_agreement=0.99)
    assert judge(config, 3, 1, timed(100, 100, 3)).outcome == ""  # 198 of 200 would still make 99.00%
    refused = judge(config, 4, 1, timed(100, 100, 4))
    assert refused.outcome == "refused", refused
    assert refused.reason == ("it can no longer reach min_agreement: 1 of 4 compared agree, so at most 98.50% of "
                              "200, 99.00% needed"), refused.reason


def test_a_slow_candidate_is_refused_early_by_its_median_and_at_the_end_by_its_p99() -> None:
    config = RolloutConfig(shadow_requests=100, max_latency_ratio=1.5)
    # 5 ms against a bound of 3 ms: slow, but not grossly (under GROSS x the bound), so its median decides
    assert judge(config, LATENCY_EARLY - 1, LATENCY_EARLY - 1, timed(2000, 5000, LATENCY_EARLY - 1)).outcome == ""
    early = judge(config, LATENCY_EARLY, LATENCY_EARLY, timed(2000, 5000, LATENCY_EARLY))
    assert early.outcome == "refused" and early.reason.startswith("too slow: its median 5.00 ms"), early
    tail = timed(2000, 2000, 97)
    for _ in range(3):
        tail.timed(2000, 9000)  # its p99 only is slow
    late = judge(config, 100, 100, tail)
    assert late.outcome == "refused" and late.reason.startswith("too slow: its p99 9.00 ms"), late
    assert judge(RolloutConfig(shadow_requests=100, max_latency_ratio=0), 100, 100, tail).outcome == "passed"


def test_a_grossly_slow_candidate_is_refused_by_its_fastest_of_its_first_few_times() -> None:
    config = RolloutConfig(shadow_requests=200, max_latency_ratio=1.5)
    gross = int(GROSS * 1.5 * 2000) + 1000  # over GROSS x the bound (1.5 x the serving 2 ms)
    assert judge(config, LATENCY_FIRST - 1, LATENCY_FIRST - 1, timed(2000, gross, LATENCY_FIRST - 1)).outcome == ""
    refused = judge(config, LATENCY_FIRST, LATENCY_FIRST, timed(2000, gross, LATENCY_FIRST))
    assert refused.outcome == "refused" and refused.reason.startswith("too slow: its fastest 7.00 ms"), refused
    once_fast = timed(2000, gross, LATENCY_FIRST - 1)
    once_fast.timed(2000, 2500)  # one time within reach: the box, not the engine, may have slowed the others
    assert judge(config, LATENCY_FIRST, LATENCY_FIRST, once_fast).outcome == ""
    assert judge(RolloutConfig(shadow_requests=200, max_latency_ratio=0), LATENCY_FIRST, LATENCY_FIRST,
                 timed(2000, gross, LATENCY_FIRST)).outcome == ""
    walled = Measures()
    for _ in range(LATENCY_FIRST):
        walled.timed(2000, gross, cpu_timed=False)  # wall times (a cold worker's reply): a busy box's wait may be in them
    assert judge(config, LATENCY_FIRST, LATENCY_FIRST, walled).outcome == ""


def test_times_under_a_millisecond_count_as_one() -> None:
    config = RolloutConfig(shadow_requests=50, max_latency_ratio=1.5)
    assert judge(config, 50, 50, timed(20, 900, 50)).outcome == "passed"  # 45x of nothing is noise
    assert judge(config, 50, 50, timed(20, 1600, 50)).outcome == "refused"


def test_memory_over_the_limit_refuses_at_once_and_unknown_memory_fails_only_when_a_limit_is_set() -> None:
    config = RolloutConfig(shadow_requests=10, max_memory_mb=64)
    hungry = timed(100, 100, 1)
    hungry.held(128 << 20)
    refused = judge(config, 1, 1, hungry)
    assert refused.outcome == "refused" and "it holds 128.0 MiB, over max_memory_mb = 64" in refused.reason
    unknown = timed(100, 100, 10)
    unknown.held(None)
    assert judge(config, 10, 10, unknown).reason.startswith("its memory could not be measured")
    assert judge(RolloutConfig(shadow_requests=10), 10, 10, unknown).outcome == "passed"
    fits = timed(100, 100, 10)
    fits.held(32 << 20)
    assert judge(config, 10, 10, fits).outcome == "passed"
