"""Whether two answers agree: allclose, argmax and the overlap of regions (models/agreement.py)."""

from __future__ import annotations

import math

import numpy as np

from infermux.models.agreement import Rule, compare, compare_regions

REF = {"y": np.array([[0.1, 0.9, 0.0], [0.7, 0.2, 0.1]], dtype=np.float32)}


def test_allclose_agrees_within_the_tolerances_and_says_where_it_does_not() -> None:
    assert compare(Rule(), REF, {"y": REF["y"] + 1e-5}).agree
    far = compare(Rule(), REF, {"y": REF["y"] + np.float32([[0, 0, 0], [0, 0.5, 0]])})
    assert not far.agree and far.error > 1 and "at [1, 1]" in far.detail


def test_a_missing_output_or_another_shape_never_agrees() -> None:
    assert compare(Rule(), REF, {"z": REF["y"]}).error == math.inf
    assert not compare(Rule(), REF, {"y": REF["y"][:1]}).agree
    assert compare(Rule(), REF, {"y": REF["y"], "extra": np.zeros(1)}).agree  # outputs not recorded are not judged


def test_argmax_looks_at_the_top_class_of_each_row_only() -> None:
    rule = Rule("argmax")
    assert compare(rule, REF, {"y": REF["y"] * 3 + 1}).agree
    flipped = compare(rule, REF, {"y": REF["y"][:, ::-1].copy()})
    assert not flipped.agree and flipped.error == 0.5 and "row 1" in flipped.detail


def test_nan_agrees_only_with_nan() -> None:
    nan = {"y": np.array([np.nan, 1.0])}
    assert compare(Rule(), nan, {"y": np.array([np.nan, 1.0])}).agree
    assert not compare(Rule(), nan, {"y": np.array([0.0, 1.0])}).agree


def test_regions_agree_when_each_has_a_partner_overlapping_enough() -> None:
    ref = [{"box": [0, 0, 10, 10]}, {"box": [20, 20, 30, 30]}]
    moved = [{"box": [21, 20, 31, 30]}, {"box": [1, 0, 11, 10]}]
    assert compare_regions(Rule("iou", iou=0.5), ref, moved).agree
    assert not compare_regions(Rule("iou", iou=0.5), ref, [{"box": [0, 0, 10, 10]}, {"box": [25, 25, 35, 35]}]).agree
    assert not compare_regions(Rule("iou"), ref, ref[:1]).agree
