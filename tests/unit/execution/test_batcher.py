"""batcher: which requests merge, and outputs split back per request."""

from __future__ import annotations

import numpy as np

from infermux.execution import batcher
from infermux.plugins.base import TensorSpec


def test_merge_then_split_gives_each_request_its_own_rows():
    requests = [{"x": np.full((n, 3), n, np.float32)} for n in (1, 3, 2)]
    merged = batcher.merge(requests)
    assert merged["x"].shape == (6, 3)
    parts = batcher.split({"y": merged["x"] * 2}, [batcher.rows(r) for r in requests])
    for request, part in zip(requests, parts):
        np.testing.assert_array_equal(part["y"], request["x"] * 2)


def test_signature_separates_dtypes_and_non_batch_dims_but_not_rows():
    a = batcher.signature({"x": np.zeros((1, 4), np.float32)})
    assert a == batcher.signature({"x": np.zeros((7, 4), np.float32)})
    assert a != batcher.signature({"x": np.zeros((1, 5), np.float32)})
    assert a != batcher.signature({"x": np.zeros((1, 4), np.float16)})
    assert a != batcher.signature({"z": np.zeros((1, 4), np.float32)})


def test_only_engines_with_a_dynamic_batch_dimension_batch():
    dynamic = [TensorSpec("x", "float32", (-1, 4))]
    fixed = [TensorSpec("x", "float32", (1, 4))]
    assert batcher.batchable(dynamic, dynamic)
    assert not batcher.batchable(fixed, dynamic)
    assert not batcher.batchable(dynamic, [TensorSpec("shape", "int64", (2,))])
