"""Contract tests: fixed-shape engines, several profiles, asynchronous completion (issue 18, item 8).

They run against the stand-in in fakes_tensorrt.py, which models these the way TensorRT 10 and
CUDA describe them; they check our code's use of the APIs, not the APIs (tests/gpu/ does that).
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes_tensorrt import PROFILE, write_plan

from infermux.plugins import backends
from infermux.plugins.backends import cuda
from infermux.plugins.base import InputRejected
from infermux.serving import batcher

pytest_plugins = ["fakes_tensorrt"]  # fake_gpu, fake_trt fixtures


def load(path, **options):
    return backends.for_path(path).load(path, options)


def test_contract_the_stand_in_completes_copies_only_at_synchronize(fake_gpu):
    """Checks the stand-in itself: a copy queued on a stream has not happened until the stream is
    synchronised, so code that reads a result before synchronising fails here as on a GPU."""
    stream = cuda.Stream()
    src, dev, dst = cuda.HostBuffer(16), cuda.DeviceBuffer(16), cuda.HostBuffer(16)
    src.view(np.float32, (4,))[:] = [1, 2, 3, 4]
    cuda.copy_to_device(dev, src, 16, stream)
    cuda.copy_to_host(dst, dev, 16, stream)
    assert not dst.view(np.float32, (4,)).any()  # queued, not done
    stream.synchronize()
    assert list(dst.view(np.float32, (4,))) == [1, 2, 3, 4]


def test_contract_fixed_shape_engine_serves_its_one_shape(fake_trt, tmp_path):
    """Checks our code's use of the API, not the API itself: a fixed-shape engine (x [1, 4], the usual
    batch-1 camera detector) has no profile range to ask for; its specs are its shapes, it is not
    batchable, it serves [1, 4] and refuses [2, 4] with a 400."""
    fake_trt.fixed_batch = 1
    engine = load(write_plan(tmp_path))
    [x] = engine.inputs
    assert (x.shape, x.min_shape, x.max_shape) == ((1, 4), (1, 4), (1, 4))
    assert not batcher.batchable(engine.inputs, engine.outputs)
    ctx = engine.create_context()
    out = ctx.infer({"x": np.array([[1, 5, 2, 0]], np.float32)})
    assert list(out["total"]) == [8.0] and list(out["argmax"]) == [1]
    with pytest.raises(InputRejected, match="dimension 0 must be 1"):
        ctx.infer({"x": np.ones((2, 4), np.float32)})
    engine.close()


def test_contract_an_engine_with_several_profiles_is_served_within_profile_0(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the API, not the API itself: with a second profile for large batches,
    specs, buffers and admission follow profile 0 (the one a new context starts on); a batch only
    profile 1 admits is refused with profile 0's range, not run against buffers sized for 8 rows."""
    fake_trt.profiles = [PROFILE, ((9, 4), (16, 4), (32, 4))]
    engine = load(write_plan(tmp_path))
    [x] = engine.inputs
    assert (x.min_shape, x.max_shape) == ((1, 4), (8, 4))
    ctx = engine.create_context()
    raw = fake_trt.contexts[-1]()
    assert raw.profile == 0 and len(fake_gpu.device[raw.addresses["x"]]) == 8 * 16
    with pytest.raises(InputRejected, match=r"\[16, 4\] is outside the engine's range \[1, 4\]\.\.\[8, 4\]"):
        ctx.infer({"x": np.ones((16, 4), np.float32)})
    assert list(ctx.infer({"x": np.ones((8, 4), np.float32)})["total"]) == [4.0] * 8
    engine.close()


def test_contract_results_are_read_only_after_the_stream_completes(fake_trt, tmp_path):
    """Checks our code's ordering against the asynchronous stand-in: the outputs of back-to-back
    requests of different sizes are each request's own, so nothing is read before synchronize
    and no pinned buffer is rewritten while a queued copy still reads it."""
    engine = load(write_plan(tmp_path))
    ctx = engine.create_context()
    rng = np.random.default_rng(7)
    for n in (8, 1, 5, 8, 2):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        out = ctx.infer({"x": x})
        np.testing.assert_array_equal(out["total"], x.sum(axis=1, dtype=np.float32))
        np.testing.assert_array_equal(out["argmax"], x.argmax(axis=1).astype(np.int32))
    engine.close()
