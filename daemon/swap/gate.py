"""The rollout's gate (docs/hot-swap.md#shadow-rollout): whether a candidate passes, is refused, or goes on.

A candidate must agree (`min_agreement` of `shadow_requests` comparisons),
be about as fast as what serves (`max_latency_ratio`: its p99 over the
serving version's p99, both the engines' compute times on the same mirrored
requests) and hold no more than `max_memory_mb` (the most it was measured
to hold: what its worker process held beyond a fresh worker's, at its
peak). It is refused the moment it can no longer pass:
when even agreeing on every comparison left would not reach
`min_agreement`, when it was measured over `max_memory_mb`, once even its
fastest of LATENCY_FIRST comparisons took over GROSS times
`max_latency_ratio` times the serving version's p99 (grossly slow: every
computation it is given costs the clients a core; only where each of its
times is the CPU it took: a wall time may be a busy box's), or once its median over
LATENCY_EARLY comparisons is already over `max_latency_ratio` times the
serving version's p99. Pure: swap/rollout.py measures and acts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from infermux.config import RolloutConfig

LATENCY_FLOOR_US = 1000  # a time under a millisecond counts as one: below it a shared CPU's jitter, not the engine
LATENCY_EARLY = 20       # comparisons before the latency alone may refuse a candidate early
LATENCY_FIRST = 3        # comparisons before a grossly slow candidate is refused (its fastest: noise only adds)
GROSS = 2.0              # grossly slow: its fastest over this many times the bound (the serving p99 is young)
KEPT = 10_000            # the latest times kept per side for the percentiles


def percentile(values: "deque[int] | list[int]", q: float) -> float:
    """The `q` quantile (0..1) of `values` by rank (the smallest value with at least q of them at or below)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


@dataclass
class Measures:
    """What a candidate was measured to cost, beside the serving version, over its mirrored requests."""

    serving_us: deque[int] = field(default_factory=lambda: deque(maxlen=KEPT))
    candidate_us: deque[int] = field(default_factory=lambda: deque(maxlen=KEPT))
    memory_bytes: int = 0
    memory_known: bool = False
    cpu_timed: bool = True  # every candidate time is at most the CPU its compute took (no wait for a busy box)

    def timed(self, serving_us: int, candidate_us: int, cpu_timed: bool = True) -> None:
        self.serving_us.append(max(0, serving_us))
        self.candidate_us.append(max(0, candidate_us))
        self.cpu_timed = self.cpu_timed and cpu_timed

    def held(self, memory_bytes: int | None) -> None:
        if memory_bytes is not None:
            self.memory_known = True
            self.memory_bytes = max(self.memory_bytes, memory_bytes)

    def p99_ratio(self) -> float:
        """Candidate p99 / serving p99, each at least LATENCY_FLOOR_US; 1.0 before any comparison."""
        if not self.candidate_us:
            return 1.0
        return max(percentile(self.candidate_us, 0.99), LATENCY_FLOOR_US) / \
            max(percentile(self.serving_us, 0.99), LATENCY_FLOOR_US)

    def view(self) -> dict[str, Any]:
        return {"serving_p99_us": percentile(self.serving_us, 0.99),
                "candidate_p99_us": percentile(self.candidate_us, 0.99),
                "latency_ratio": round(self.p99_ratio(), 3),
                "memory_bytes": self.memory_bytes if self.memory_known else None}


@dataclass(frozen=True)
class Judgement:
    """"" while the candidate may still pass and has not finished; else "passed" or "refused" with why."""

    outcome: str = ""
    reason: str = ""


def judge(config: RolloutConfig, compared: int, agreed: int, measures: Measures) -> Judgement:
    """The gate, after each comparison (and once before any, for what its load measured)."""
    why = _cannot_pass(config, compared, agreed, measures)
    if why:
        return Judgement("refused", why)
    if compared < config.shadow_requests:
        return Judgement()
    if agreed < config.min_agreement * compared:
        return Judgement("refused", "")  # the agreement's own reason (rollout.py: the worst disagreement)
    ratio = measures.p99_ratio()
    if config.max_latency_ratio and ratio > config.max_latency_ratio:
        return Judgement("refused", _slow(config, measures, "p99"))
    if config.max_memory_mb and not measures.memory_known:
        return Judgement("refused", f"its memory could not be measured, and max_memory_mb = {config.max_memory_mb:g} "
                                    "is set")
    return Judgement("passed")


def _cannot_pass(config: RolloutConfig, compared: int, agreed: int, measures: Measures) -> str:
    """Why the candidate can no longer pass, whatever comes ("" while it can)."""
    limit = config.max_memory_mb * 2**20
    if limit and measures.memory_known and measures.memory_bytes > limit:
        return (f"it holds {measures.memory_bytes / 2**20:.1f} MiB, over max_memory_mb = {config.max_memory_mb:g} "
                "(measured while it computed)")
    n = config.shadow_requests
    best = (agreed + max(0, n - compared)) / n
    if compared < n and best < config.min_agreement:
        return (f"it can no longer reach min_agreement: {agreed} of {compared} compared agree, so at most "
                f"{best:.2%} of {n}, {config.min_agreement:.2%} needed")
    if config.max_latency_ratio and measures.cpu_timed and LATENCY_FIRST <= compared < n:
        bound = config.max_latency_ratio * max(percentile(measures.serving_us, 0.99), LATENCY_FLOOR_US)
        if max(min(measures.candidate_us, default=0), LATENCY_FLOOR_US) > GROSS * bound:
            return _slow(config, measures, "fastest")
    if config.max_latency_ratio and compared >= LATENCY_EARLY and compared < n:
        median = max(percentile(measures.candidate_us, 0.5), LATENCY_FLOOR_US)
        if median > config.max_latency_ratio * max(percentile(measures.serving_us, 0.99), LATENCY_FLOOR_US):
            return _slow(config, measures, "median")
    return ""


def _slow(config: RolloutConfig, measures: Measures, which: str) -> str:
    mine = percentile(measures.candidate_us, {"fastest": 0.0, "median": 0.5}.get(which, 0.99))
    return (f"too slow: its {which} {mine / 1000:.2f} ms against the serving version's p99 "
            f"{percentile(measures.serving_us, 0.99) / 1000:.2f} ms on the same {len(measures.candidate_us)} "
            f"requests (max_latency_ratio = {config.max_latency_ratio:g}; times under "
            f"{LATENCY_FLOOR_US / 1000:g} ms count as {LATENCY_FLOOR_US / 1000:g} ms)")
