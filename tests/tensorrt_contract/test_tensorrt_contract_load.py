"""Contract tests: loading, memory accounting and unloading of TensorRT engines.

Each test runs against the stand-in in fakes_tensorrt.py. They check our
code's use of the TensorRT / cuda-python APIs; they do not prove the APIs
themselves (tests/gpu/ does, on a real GPU).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from support.fakes.tensorrt import ACTIVATION_BYTES, VC_PLAN_MAGIC, write_plan

from infermux.plugins import backends
from infermux.plugins.backends import trtlib
from infermux.plugins.backends.tensorrt import TensorRTBackend
from infermux.plugins.base import BackendError, OnDevice

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures

# Device I/O bytes per context at profile max: x [8,4] f32, total [8] f32, argmax [8] i32.
IO_BYTES = 8 * 4 * 4 + 8 * 4 + 8 * 4


def load(path: Path, **options: object):
    return backends.for_path(path).load(path, options)


def test_discovery_works_without_tensorrt_and_load_says_what_to_install(tmp_path, monkeypatch):
    """Checks our code's use of the API (lazy import), not the API itself: without
    `tensorrt`, discovery still finds the backend and load raises a BackendError
    that names the package to install."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` fail
    monkeypatch.setattr(trtlib, "_shared", None)
    backend = backends.for_path(Path("model.plan"))
    assert isinstance(backend, TensorRTBackend)
    with pytest.raises(BackendError, match="TensorRT is not installed.*python3-libnvinfer"):
        backend.load(write_plan(tmp_path), {})


def test_tensorrt_without_the_v2_memory_api_is_refused(fake_trt, tmp_path):
    """Checks our code's use of the API, not the API itself: TensorRT 10.0 (no
    device_memory_size_v2) is refused at load with the version needed."""
    del fake_trt.ICudaEngine.device_memory_size_v2
    fake_trt.__version__ = "10.0.1"
    with pytest.raises(BackendError, match="TensorRT 10.0.1 is too old.*10.1 or newer"):
        load(write_plan(tmp_path))


def test_specs_report_profile_0_range(fake_trt, tmp_path):
    """Checks our code's use of the API, not the API itself: input ranges come from
    get_tensor_profile_shape(name, 0), output ranges from shape inference at min and max."""
    engine = load(write_plan(tmp_path))
    [x] = engine.inputs
    assert (x.name, x.dtype, x.shape, x.min_shape, x.max_shape) == ("x", "float32", (-1, 4), (1, 4), (8, 4))
    outputs = {s.name: s for s in engine.outputs}
    assert outputs["total"].dtype == "float32" and outputs["argmax"].dtype == "int32"
    assert (outputs["total"].min_shape, outputs["total"].max_shape) == ((1,), (8,))
    engine.close()


def test_one_runtime_and_logger_serve_every_engine(fake_trt, tmp_path):
    """Checks our code's use of the API, not the API itself: the runtime is created
    once and shared, so it outlives every engine it deserialized."""
    first, second = load(write_plan(tmp_path, "a.plan")), load(write_plan(tmp_path, "b.plan"))
    assert fake_trt.Runtime.instances == 1
    first.close(), second.close()


def test_foreign_engine_is_rejected_with_rebuild_advice(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the API, not the API itself: deserialize_cuda_engine
    returning None becomes a BackendError carrying TensorRT's logged reason and the
    `infermux build` command, and nothing stays allocated."""
    path = tmp_path / "model.plan"
    path.write_bytes(b"built by another TensorRT")
    with pytest.raises(BackendError) as err:
        load(path)
    assert "not compatible with this version of TensorRT" in str(err.value)
    assert f"infermux build MODEL.onnx -o {path}" in str(err.value)
    assert not fake_gpu.device and not fake_gpu.host and not fake_gpu.streams


def test_empty_engine_file_is_rejected(fake_trt, tmp_path):
    """Checks our code, not the API: an empty file (still being written) is a BackendError."""
    path = tmp_path / "model.plan"
    path.touch()
    with pytest.raises(BackendError, match="empty"):
        load(path)


def test_out_of_memory_at_load_is_contained(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the API, not the API itself: a cudaMalloc failure while
    the first context's buffers are allocated becomes a BackendError naming the CUDA
    error and what to do, and the buffers already allocated are freed."""
    fake_gpu.fail["cudaMalloc"] = fake_gpu.cudaError_t.cudaErrorMemoryAllocation
    with pytest.raises(BackendError, match="cudaErrorMemoryAllocation.*lower `contexts`"):
        load(write_plan(tmp_path))
    gc.collect()
    assert not fake_gpu.device and not fake_gpu.host and not fake_gpu.streams
    assert fake_gpu.free_bytes() == fake_gpu.total


def test_context_creation_failure_at_load_is_contained(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the API, not the API itself: create_execution_context
    returning None becomes a BackendError with TensorRT's reason and what to do."""
    fake_gpu.fail["create_execution_context"] = True
    with pytest.raises(BackendError, match=r"execution context.*out of memory.*unload other models"):
        load(write_plan(tmp_path))


def test_memory_accounting(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the API, not the API itself: memory_bytes() is the plan
    size plus (device_memory_size_v2 + I/O buffers) per open context, and
    measured_load_bytes is the cudaMemGetInfo drop across the load."""
    engine = load(write_plan(tmp_path, size=1000))
    per_context = ACTIVATION_BYTES + IO_BYTES
    assert engine.context_bytes() == per_context
    assert engine.measured_load_bytes == 1000 + per_context  # plan + the context made at load
    assert engine.memory_bytes() == 1000 + per_context
    first, second = engine.create_context(), engine.create_context()
    assert engine.memory_bytes() == 1000 + 2 * per_context
    second.close()
    assert engine.memory_bytes() == 1000 + per_context
    first.close(), engine.close()


def test_jetson_counts_pinned_buffers_as_gpu_memory(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the API, not the API itself: on an integrated GPU
    (cudaDevAttrIntegrated) pinned host buffers come from the same DRAM and count."""
    fake_gpu.integrated = True
    path = write_plan(tmp_path)
    engine = backends.for_path(path).load(path, {"zero_copy": False})
    assert engine.context_bytes() == ACTIVATION_BYTES + 2 * IO_BYTES
    engine.close()


def test_unload_releases_everything(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the API, not the API itself: after contexts and engine
    are closed, no CUDA buffer or stream is left and no reference keeps the TensorRT
    engine or its contexts alive."""
    engine = load(write_plan(tmp_path))
    contexts = [engine.create_context(), engine.create_context()]
    for ctx in contexts:
        ctx.infer({"x": np.ones((2, 4), np.float32)})
    contexts[0].close()
    engine.close()  # closes the context still open, as unload after a failure would
    gc.collect()
    assert not fake_gpu.device and not fake_gpu.host and not fake_gpu.streams
    assert all(ref() is None for ref in fake_trt.engines + fake_trt.contexts)
    assert fake_gpu.free_bytes() == fake_gpu.total
    with pytest.raises(BackendError, match="closed"):
        engine.create_context()
    with pytest.raises(BackendError, match="after close"):
        contexts[1].infer({"x": np.ones((1, 4), np.float32)})


@pytest.mark.parametrize("tensor, fmt", [("x", "CHW32"), ("x", "HWC8"), ("total", "CHW4"), ("x", "HWC")])
def test_contract_vectorized_or_channel_last_tensors_are_refused(fake_trt, fake_gpu, tmp_path, tensor, fmt):
    """Checks our code's use of get_tensor_format, not the API itself: an engine whose I/O is bound in a
    non-LINEAR format (--inputIOFormats, DLA) would get buffers sized for a dense layout and wrong bytes,
    so it is refused at load, naming the tensor and format, with nothing left allocated."""
    fake_trt.formats[tensor] = fake_trt.TensorFormat[fmt]
    with pytest.raises(BackendError, match=rf"tensor '{tensor}' is bound in TensorRT format {fmt}.*only LINEAR"):
        load(write_plan(tmp_path))
    gc.collect()
    assert not fake_gpu.device and not fake_gpu.host and not fake_gpu.streams


def test_contract_memory_counts_the_measured_load_where_it_is_larger(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of cudaMemGetInfo, not the API itself: when deserializing took more
    device memory than the plan's size (kernels, libraries), memory_bytes() reports the measured
    drop plus the later contexts; the engine names its device (base.OnDevice) so the registry
    charges that figure, not the host RSS the load added."""
    fake_trt.load_overhead = 1 << 20
    engine = load(write_plan(tmp_path, size=1000), device=0)
    per_context = ACTIVATION_BYTES + IO_BYTES
    assert isinstance(engine, OnDevice) and engine.device == 0
    assert engine.measured_load_bytes == (1 << 20) + 1000 + per_context
    assert engine.memory_bytes() == engine.measured_load_bytes
    extra = engine.create_context(), engine.create_context()  # the first reuses the load's context
    assert engine.memory_bytes() == engine.measured_load_bytes + per_context
    for ctx in extra:
        ctx.close()
    engine.close()


def test_contract_jetson_keeps_the_estimate_since_its_measure_moves_with_every_process(fake_trt, fake_gpu,
                                                                                         tmp_path):
    """Checks our code, not the API: on an integrated GPU the free figure is system RAM, so the
    measured drop is not charged."""
    fake_gpu.integrated = True
    fake_trt.load_overhead = 1 << 20
    engine = load(write_plan(tmp_path, size=1000))
    assert engine.memory_bytes() == 1000 + engine.context_bytes()
    engine.close()


def test_contract_version_compatible_plans_load(fake_trt, tmp_path):
    """Checks our code's use of the runtime API, not the API itself: a plan built VERSION_COMPATIBLE
    embeds host code, which deserializes only with runtime.engine_host_code_allowed set."""
    engine = load(write_plan(tmp_path, magic=VC_PLAN_MAGIC))
    ctx = engine.create_context()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(ctx.infer({"x": x})["total"], x.sum(axis=1))
    engine.close()


def test_contract_a_hot_tensorrt_model_is_charged_its_device_memory_not_the_host_rss_its_load_added(
        fake_trt, tmp_path):
    """Checks our code, not the API: loading a TensorRT engine grows the daemon's RSS (TensorRT's
    libraries, the plan read), which is host memory; the registry charges the model the engine's
    own device figure (base.OnDevice), which is what a GPU budget measures."""
    from infermux import config as cfg
    from infermux.events import EventLog
    from infermux.execution.hooks import FrontendHooks
    from infermux.models.registry import Registry

    fake_trt.host_load_bytes = 64 << 20
    (tmp_path / "m" / "1").mkdir(parents=True)
    write_plan(tmp_path / "m" / "1", size=1000)
    (tmp_path / "infermux.toml").write_text(f'[daemon]\nengine_dir = "{tmp_path}"\nwatch = false\n'
                                            '[[models]]\nname = "m"\nengine = "m/1/model.plan"\n')
    registry = Registry(cfg.load(tmp_path / "infermux.toml"), EventLog(), FrontendHooks(lambda *a: None, lambda job: None))
    mv = registry.model("m").versions["1"]
    assert registry.load(mv), mv.reason
    try:
        assert mv.memory_bytes == mv.engine.memory_bytes() < 1 << 20
    finally:
        registry.unload(mv, timeout=5)


def test_contract_shapes_tensorrt_gives_as_dims_come_out_as_plain_tuples(fake_trt, tmp_path):
    """Checks our code against the binding's Dims (pyFoundationalTypes.cpp), which the stand-in returns
    from get_tensor_shape and get_tensor_profile_shape: a sequence that equals a tuple but is not one
    (no hash, no `==` with another Dims). The engine's specs, which reach the wire header, the batcher
    and dict keys, are plain tuples of ints all the same."""
    engine = load(write_plan(tmp_path))
    dims = engine._engine.get_tensor_shape("x")
    assert not isinstance(dims, tuple) and dims == (-1, 4) and list(dims) == [-1, 4]
    with pytest.raises(TypeError):
        hash(dims)
    with pytest.raises(TypeError):
        assert dims == engine._engine.get_tensor_shape("x")
    for spec in [*engine.inputs, *engine.outputs]:
        for shape in (spec.shape, spec.min_shape, spec.max_shape):
            assert type(shape) is tuple and all(type(d) is int for d in shape), (spec.name, shape)
    assert {engine.inputs[0].max_shape: "hashable"} and json.dumps([list(s.max_shape) for s in engine.outputs])
    engine.close()
