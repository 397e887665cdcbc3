"""Whether two engines answered one request alike: the comparisons `replay` and shadowing share.

- `allclose`: every output of the reference is there, of the same shape,
  and |candidate - reference| <= atol + rtol * |reference| everywhere (numpy's
  rule). The error is the largest |Δ| over what is allowed (≤ 1 agrees).
- `argmax`: the top-1 class along the last axis of the first output agrees on
  every row (a classifier whose scores may move but whose answer may not).
  The error is the share of rows whose class changed.
- `iou`: a pipeline's regions (docs/pipelines.md): every region of the
  reference has one in the candidate's answer overlapping it by at least
  `iou` (intersection over union) and vice versa. The error is 1 - the worst
  best-overlap.

docs/hot-swap.md#shadow-rollout says which to choose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class Rule:
    """How two answers are compared."""

    compare: str = "allclose"
    rtol: float = 1e-3
    atol: float = 1e-4
    iou: float = 0.5

    def describe(self) -> str:
        if self.compare == "allclose":
            return f"allclose, rtol {self.rtol:g}, atol {self.atol:g}"
        if self.compare == "iou":
            return f"iou >= {self.iou:g}"
        return "argmax"


@dataclass(frozen=True)
class Verdict:
    """One comparison: whether the answers agree, how far apart they are (the rule's measure), and where."""

    agree: bool
    error: float
    detail: str = ""


def compare(rule: Rule, reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> Verdict:
    """Compare output tensors (allclose or argmax)."""
    if rule.compare == "argmax":
        return _argmax(reference, candidate)
    return _allclose(rule, reference, candidate)


def _missing(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> Verdict | None:
    for name, ref in reference.items():
        got = candidate.get(name)
        if got is None:
            return Verdict(False, math.inf, f"output {name!r} is missing (the candidate gives "
                                            f"{', '.join(candidate) or 'nothing'})")
        if got.shape != ref.shape:
            return Verdict(False, math.inf, f"output {name!r} has shape {list(got.shape)}, not {list(ref.shape)}")
    return None


def _allclose(rule: Rule, reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> Verdict:
    missing = _missing(reference, candidate)
    if missing is not None:
        return missing
    worst, where = 0.0, ""
    for name, ref in reference.items():
        if ref.size == 0:
            continue
        a, b = np.asarray(candidate[name], dtype=np.float64), np.asarray(ref, dtype=np.float64)
        diff = np.abs(a - b)
        ratio = diff / (rule.atol + rule.rtol * np.abs(b))
        ratio = np.where(np.isnan(ratio), np.where(np.isnan(a) & np.isnan(b), 0.0, math.inf), ratio)
        index = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        if ratio[index] > worst or not where:
            worst = float(ratio[index])
            where = (f"output {name!r}: |Δ| {diff[index]:.3g} at {list(map(int, index))} "
                     f"({a[index]:.6g} vs {b[index]:.6g})")
    return Verdict(worst <= 1.0, worst, where)


def _argmax(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> Verdict:
    if not reference:
        return Verdict(True, 0.0)
    name = next(iter(reference))
    missing = _missing({name: reference[name]}, candidate)
    if missing is not None:
        return missing
    ref, got = reference[name], candidate[name]
    if ref.ndim == 0 or ref.size == 0:
        return Verdict(bool(np.array_equal(ref, got)), 0.0 if np.array_equal(ref, got) else 1.0)
    want, have = np.argmax(ref, axis=-1).reshape(-1), np.argmax(got, axis=-1).reshape(-1)
    changed = np.flatnonzero(want != have)
    if not changed.size:
        return Verdict(True, 0.0)
    row = int(changed[0])
    return Verdict(False, changed.size / want.size, f"output {name!r}: top-1 class {int(have[row])} instead of "
                                                    f"{int(want[row])} in row {row} ({changed.size} of {want.size} rows)")


def compare_regions(rule: Rule, reference: Sequence[Mapping[str, Any]],
                    candidate: Sequence[Mapping[str, Any]]) -> Verdict:
    """Compare a pipeline's regions (each with a `box` [x0, y0, x1, y1]) by overlap."""
    if len(reference) != len(candidate):
        return Verdict(False, 1.0, f"{len(candidate)} regions instead of {len(reference)}")
    worst, where = 1.0, ""
    for mine, theirs, side in ((reference, candidate, "reference"), (candidate, reference, "candidate")):
        for i, region in enumerate(mine):
            best = max((_iou(region["box"], other["box"]) for other in theirs), default=0.0)
            if best < worst:
                worst, where = best, f"{side} region {i} {list(region['box'])}: best overlap {best:.2f}"
    return Verdict(worst >= rule.iou, 1.0 - worst, where)


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    x0, y0, x1, y1 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else float(a == b)
