"""Contract tests: fixed-shape engines, several profiles, asynchronous completion.

They run against the stand-in in fakes_tensorrt.py, which models these the way TensorRT 10 and
CUDA describe them; they check our code's use of the APIs, not the APIs (tests/gpu/ does that).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from support.fakes.tensorrt import ACTIVATION_BYTES, PROFILE, write_plan

from infermux.plugins import backends
from infermux.plugins.backends import cuda
from infermux.plugins.base import BackendError, InputRejected
from infermux.execution import batcher

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures


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


def test_contract_each_profile_has_its_own_context_and_requests_go_where_they_fit(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the API, not the API itself: with profiles for
    1..8 and 9..32 rows, a context holds one TensorRT context per profile, each switched to its
    profile once and bound to buffers sized for that profile's max; 16 rows run on profile 1's,
    5 rows on profile 0's, and the engine admits 1..32 rows."""
    fake_trt.profiles = [PROFILE, ((9, 4), (16, 4), (32, 4))]
    engine = load(write_plan(tmp_path))
    [x] = engine.inputs
    assert (x.min_shape, x.max_shape) == ((1, 4), (32, 4))
    ctx = engine.create_context()  # the one made at load
    raws = {c().profile: c() for c in fake_trt.contexts if c() is not None}
    assert sorted(raws) == [0, 1]
    assert len(fake_gpu.device[raws[0].addresses["x"]]) == 8 * 16
    assert len(fake_gpu.device[raws[1].addresses["x"]]) == 32 * 16
    runs = {k: raw.executions for k, raw in raws.items()}
    assert list(ctx.infer({"x": np.ones((16, 4), np.float32)})["total"]) == [4.0] * 16
    assert list(ctx.infer({"x": np.ones((5, 4), np.float32)})["total"]) == [4.0] * 5
    assert {k: raw.executions - runs[k] for k, raw in raws.items()} == {0: 1, 1: 1}
    engine.close()


def test_contract_a_contexts_profiles_share_one_activation_buffer(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the allocation API, not the API itself: each TensorRT context is made
    USER_MANAGED and given the same activation buffer of device_memory_size_v2 bytes, so a context of
    an engine with two profiles costs one activation buffer, not two (the STATIC default reserves the
    largest profile's memory in each), and the memory budget is charged what the device lost."""
    fake_trt.profiles = [PROFILE, ((9, 4), (16, 4), (32, 4))]
    engine = load(write_plan(tmp_path))
    engine.create_context()  # the one made at load
    free = fake_gpu.free_bytes()
    ctx = engine.create_context()
    io = (8 + 32) * (16 + 4 + 4)
    assert free - fake_gpu.free_bytes() == ACTIVATION_BYTES + io == engine.context_bytes()
    raws = [c() for c in fake_trt.contexts if c() is not None][-2:]
    assert {raw.strategy.name for raw in raws} == {"USER_MANAGED"}
    assert raws[0].memory == raws[1].memory and raws[0].memory[1] == ACTIVATION_BYTES
    assert list(ctx.infer({"x": np.ones((20, 4), np.float32)})["total"]) == [4.0] * 20
    assert list(ctx.infer({"x": np.ones((3, 4), np.float32)})["total"]) == [4.0] * 3
    del raws  # TensorRT contexts keep their engine alive
    engine.close()
    assert fake_gpu.free_bytes() == fake_gpu.total


def test_contract_a_shape_between_profiles_is_refused_naming_them(fake_trt, tmp_path):
    """Checks our code: profiles 1..4 and 16..32 rows leave 5..15 to none; 8 rows get a 400 that
    names both profiles, not a TensorRT failure."""
    fake_trt.profiles = [((1, 4), (2, 4), (4, 4)), ((16, 4), (16, 4), (32, 4))]
    engine = load(write_plan(tmp_path))
    ctx = engine.create_context()
    with pytest.raises(InputRejected, match=r"fit none of the engine's optimization profiles "
                                            r"\(profile 0: x \[1, 4\]\.\.\[4, 4\]; profile 1: x \[16, 4\]\.\.\[32, 4\]\)"):
        ctx.infer({"x": np.ones((8, 4), np.float32)})
    assert list(ctx.infer({"x": np.ones((20, 4), np.float32)})["total"]) == [4.0] * 20
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


def test_contract_a_refused_profile_switch_fails_the_load_naming_the_profile(fake_trt, fake_gpu, tmp_path):
    """Checks our code against the binding: set_optimization_profile_async raises RuntimeError when
    TensorRT refuses (pyCore.cpp: it never returns False), and the load fails with a BackendError that
    names the profile and TensorRT's reason, leaving nothing allocated."""
    fake_trt.profiles = [PROFILE, ((9, 4), (16, 4), (32, 4))]
    fake_gpu.fail["set_optimization_profile_async"] = True
    with pytest.raises(BackendError, match=r"switch an execution context to optimization profile 1: "
                                           r"x \[9, 4\]\.\.\[32, 4\]: fake: .*cannot switch to profile 1"):
        load(write_plan(tmp_path))
    gc.collect()
    assert not fake_gpu.device and not fake_gpu.host and not fake_gpu.streams
