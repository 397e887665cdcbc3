"""Contract tests: serving requests through a TensorRT execution context.

Each test runs against the stand-in in fakes_tensorrt.py. They check our
code's use of the TensorRT / cuda-python APIs; they do not prove the APIs
themselves (tests/gpu/ does, on a real GPU).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.fakes.tensorrt import write_plan

from infermux.plugins import backends
from infermux.plugins.base import BackendError, InputRejected, OutputsMismatch, WritesOutputs

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures


@pytest.fixture
def engine(fake_trt, tmp_path):
    path = write_plan(tmp_path)
    engine = backends.for_path(path).load(path, {})
    yield engine
    engine.close()


def batch(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)


def expected(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"total": x.sum(axis=1, dtype=np.float32), "argmax": x.argmax(axis=1).astype(np.int32)}


def test_buffers_sized_at_profile_max_and_bound_once(engine, fake_trt, fake_gpu):
    """Checks our code's use of the API, not the API itself: a context allocates one
    pinned and one device buffer per tensor at profile 0's max shape, binds the device
    ones with set_tensor_address once, and allocates nothing per request."""
    ctx = engine.create_context()
    raw = fake_trt.contexts[-1]()
    device_sizes = sorted(len(fake_gpu.device[ptr]) for ptr in raw.addresses.values())
    assert device_sizes == [8 * 4, 8 * 4, 8 * 4 * 4]   # argmax/total [8], x [8,4], 4-byte items
    assert sorted(len(b) for b in fake_gpu.host.values()) == device_sizes
    allocations, bound = (len(fake_gpu.device), len(fake_gpu.host)), raw.address_calls
    for n in (1, 8, 3):
        ctx.infer({"x": batch(n)})
    assert (len(fake_gpu.device), len(fake_gpu.host)) == allocations
    assert raw.address_calls == bound == 3


def test_shape_changes_between_requests(engine, fake_trt, fake_gpu):
    """Checks our code's use of the API, not the API itself: set_input_shape is called
    with each request's shape, only the actual bytes are copied each way, and outputs
    come back at the actual output shape."""
    ctx = engine.create_context()
    raw = fake_trt.contexts[-1]()
    for n in (3, 1, 8, 2):
        fake_gpu.copies.clear()
        x = batch(n, seed=n)
        out = ctx.infer({"x": x})
        assert raw.shape_calls[-1] == (n, 4)
        assert sorted(fake_gpu.copies) == sorted([("H2D", n * 16), ("D2H", n * 4), ("D2H", n * 4)])
        for name, want in expected(x).items():
            assert out[name].shape == (n,) and out[name].dtype == want.dtype
            np.testing.assert_array_equal(out[name], want)


def test_outputs_are_new_arrays(engine):
    """Checks our code's use of the API, not the API itself: results are copied out of
    the pinned buffers, so a later request does not change an earlier result."""
    ctx = engine.create_context()
    first_x, second_x = batch(4, seed=1), batch(4, seed=2)
    first = ctx.infer({"x": first_x})
    ctx.infer({"x": second_x})
    np.testing.assert_array_equal(first["total"], expected(first_x)["total"])
    assert first["total"].flags.owndata and first["argmax"].flags.owndata


def test_input_outside_profile_is_rejected_with_range(engine):
    """Checks our code's use of the API, not the API itself: a batch beyond profile 0
    is an InputRejected (status 400) naming the range, before TensorRT is asked, and
    the context keeps serving."""
    ctx = engine.create_context()
    with pytest.raises(InputRejected, match=r"\[9, 4\] is outside the engine's range \[1, 4\]\.\.\[8, 4\]"):
        ctx.infer({"x": batch(9)})
    with pytest.raises(InputRejected, match="must be float32"):
        ctx.infer({"x": batch(2).astype(np.float64)})
    with pytest.raises(InputRejected, match=r"missing \['x'\], unknown \['y'\]"):
        ctx.infer({"y": batch(2)})
    x = batch(2)
    np.testing.assert_array_equal(ctx.infer({"x": x})["total"], expected(x)["total"])


def test_non_contiguous_and_big_endian_inputs_are_staged_correctly(engine):
    """Checks our code, not the API: inputs are copied into the pinned buffer in C order
    and little-endian whatever their layout."""
    ctx = engine.create_context()
    x = batch(8)
    strided = np.asfortranarray(x)
    swapped = x.astype(">f4")
    for variant in (strided, swapped):
        np.testing.assert_array_equal(ctx.infer({"x": variant})["total"], expected(x)["total"])


def test_cuda_error_during_request_is_a_backend_error(engine, fake_gpu):
    """Checks our code's use of the API, not the API itself: a failing cudaMemcpyAsync
    is a BackendError (status 500) that names the CUDA error, not a crash and not a 400."""
    ctx = engine.create_context()
    fake_gpu.fail["cudaMemcpyAsync"] = fake_gpu.cudaError_t.cudaErrorLaunchFailure
    with pytest.raises(BackendError, match="cudaMemcpyAsync failed: cudaErrorLaunchFailure") as err:
        ctx.infer({"x": batch(2)})
    assert not isinstance(err.value, InputRejected)
    x = batch(2)
    np.testing.assert_array_equal(ctx.infer({"x": x})["total"], expected(x)["total"])


def test_execution_failure_carries_tensorrt_reason(engine, fake_gpu):
    """Checks our code's use of the API, not the API itself: execute_async_v3 returning
    False becomes a BackendError with the error TensorRT logged."""
    ctx = engine.create_context()
    fake_gpu.fail["execute_async_v3"] = True
    with pytest.raises(BackendError, match="TensorRT execution failed: fake kernel launch failure"):
        ctx.infer({"x": batch(2)})


def test_context_refuses_a_second_thread(engine, fake_trt):
    """Checks our code, not the API: while one thread runs a request on a context,
    another thread's call is refused instead of sharing the buffers."""
    ctx = engine.create_context()
    inside, release = threading.Event(), threading.Event()
    fake_trt.contexts[-1]().gate = lambda: (inside.set(), release.wait(5))
    worker = threading.Thread(target=ctx.infer, args=({"x": batch(2)},))
    worker.start()
    try:
        assert inside.wait(5)
        with pytest.raises(BackendError, match="two threads"):
            ctx.infer({"x": batch(2)})
    finally:
        release.set()
        worker.join(5)


def test_two_contexts_serve_two_threads(engine):
    """Checks our code's use of the API, not the API itself: contexts share nothing,
    so one per thread gives correct results under concurrency."""
    contexts = [engine.create_context(), engine.create_context()]
    errors: list[str] = []

    def serve(ctx, seed: int) -> None:
        for i in range(200):
            x = batch(1 + i % 8, seed=seed * 1000 + i)
            if not np.array_equal(ctx.infer({"x": x})["total"], expected(x)["total"]):
                errors.append(f"context {seed} request {i}")

    threads = [threading.Thread(target=serve, args=(ctx, i)) for i, ctx in enumerate(contexts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []


def test_contract_infer_into_copies_outputs_from_the_device_straight_into_given_arrays(engine, fake_gpu):
    """Checks our code's use of the API, not the API itself: with arrays to write into (a cold
    worker's slot), each output is copied from the device into them once, not through the
    pinned buffers and a host copy; outputs not given come back as new arrays."""
    ctx = engine.create_context()
    assert isinstance(ctx, WritesOutputs)
    x = batch(3, seed=4)
    into = {"total": np.zeros(3, np.float32), "argmax": np.zeros(3, np.int32)}
    for array in into.values():
        fake_gpu.allow_pageable(array)
    fake_gpu.copies.clear()
    out = ctx.infer_into({"x": x}, into)
    assert out["total"] is into["total"] and out["argmax"] is into["argmax"]
    for name, want in expected(x).items():
        np.testing.assert_array_equal(into[name], want)
    assert sorted(fake_gpu.copies) == sorted([("H2D", 3 * 16), ("D2H", 3 * 4), ("D2H", 3 * 4)])
    only_total = {"total": np.zeros(3, np.float32)}
    fake_gpu.allow_pageable(only_total["total"])
    out = ctx.infer_into({"x": x}, only_total)
    assert out["total"] is only_total["total"] and out["argmax"].flags.owndata
    np.testing.assert_array_equal(out["argmax"], expected(x)["argmax"])


def test_contract_infer_into_refuses_arrays_of_another_shape_before_running(engine, fake_trt, fake_gpu):
    """Checks our code's use of the API, not the API itself: arrays that are not this run's
    output shapes are refused before TensorRT runs, and the context serves on."""
    ctx = engine.create_context()
    raw = fake_trt.contexts[-1]()
    x = batch(3)
    for wrong in ({"total": np.zeros(4, np.float32)}, {"total": np.zeros(3, np.float64)},
                  {"total": np.zeros(6, np.float32)[::2]}):
        fake_gpu.copies.clear()
        runs = raw.executions
        with pytest.raises(OutputsMismatch):
            ctx.infer_into({"x": x}, wrong)
        assert raw.executions == runs and not any(kind == "D2H" for kind, _ in fake_gpu.copies)
    np.testing.assert_array_equal(ctx.infer({"x": x})["total"], expected(x)["total"])


def test_contract_a_fixed_shape_context_replays_a_cuda_graph(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the CUDA graph API, not the API itself: with
    cuda_graph = true on a fixed-shape engine, the warm-up runs outside any capture, the next
    request captures execute_async_v3 once (thread-local mode), every later one replays it with
    its own inputs (copies stay outside the graph), and unloading destroys the graph."""
    fake_trt.fixed_batch = 2
    path = write_plan(tmp_path)
    engine = backends.for_path(path).load(path, {"cuda_graph": True})
    ctx = engine.create_context()
    raw = next(c() for c in fake_trt.contexts if c() is not None)
    rng = np.random.default_rng(3)
    for k in range(4):
        x = rng.normal(size=(2, 4)).astype(np.float32)
        out = ctx.infer({"x": x})
        np.testing.assert_array_equal(out["total"], x.sum(axis=1, dtype=np.float32))
    assert len(fake_gpu.graph_execs) == 1
    executions = raw.executions
    for k in range(3):
        x = rng.normal(size=(2, 4)).astype(np.float32)
        np.testing.assert_array_equal(ctx.infer({"x": x})["argmax"], x.argmax(axis=1).astype(np.int32))
    assert raw.executions == executions and fake_gpu.launches >= 3  # replays, no new enqueue
    engine.close()
    assert not fake_gpu.graphs and not fake_gpu.graph_execs


def test_contract_cuda_graph_needs_a_fixed_shape_and_a_bool(fake_trt, tmp_path):
    """Checks our code: cuda_graph on an engine whose profiles all span several shapes, or a
    non-bool value, is refused at load with what to do; without the option nothing is captured."""
    path = write_plan(tmp_path)
    with pytest.raises(BackendError, match=r"cuda_graph = true needs a fixed-shape engine.*--profile N:N:N"):
        backends.for_path(path).load(path, {"cuda_graph": True})
    with pytest.raises(BackendError, match="cuda_graph .* must be true or false"):
        backends.for_path(path).load(path, {"cuda_graph": "yes"})


@pytest.mark.parametrize("failure", ["refused", "invalidated", "begin"])
def test_contract_a_failed_capture_falls_back_to_plain_execution(fake_trt, fake_gpu, tmp_path, caplog, failure):
    """Checks our code against the capture failures trtexec handles (sampleDevice.h endCaptureOnError,
    sampleInference.cpp): TensorRT refusing the enqueue under capture (the capture then ends with a
    graph that must be destroyed unused), a capture invalidated (enqueue succeeds, cudaStreamEndCapture
    gives cudaErrorStreamCaptureInvalidated and no graph, the error left pending), and a capture CUDA
    will not begin. Each is logged once, the request and the next ones succeed without a graph, no
    graph leaks and no CUDA error stays pending for TensorRT's next launch."""
    fake_trt.fixed_batch = 2
    path = write_plan(tmp_path)
    engine = backends.for_path(path).load(path, {"cuda_graph": True})
    ctx = engine.create_context()
    if failure == "refused":
        fake_trt.refuse_capture = True
    elif failure == "invalidated":
        fake_gpu.invalidate_next_capture = True
    else:
        fake_gpu.fail["cudaStreamBeginCapture"] = fake_gpu.cudaError_t.cudaErrorStreamCaptureUnsupported
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for _ in range(3):
        assert ctx.infer({"x": x})["total"].tolist() == [6.0, 22.0]
    assert len([r for r in caplog.records if "CUDA graph capture failed" in r.getMessage()]) == 1
    assert not fake_gpu.graph_execs and not fake_gpu.graphs and not fake_gpu.capturing
    assert fake_gpu.last_error == fake_gpu.cudaError_t.cudaSuccess and fake_gpu.launches == 0
    engine.close()
