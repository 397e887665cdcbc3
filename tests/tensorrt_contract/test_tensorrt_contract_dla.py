"""Contract tests: DLA on Jetson and zero-copy I/O on integrated GPUs.

They run against the stand-in in fakes_tensorrt.py (a device with `trt.dla_cores` DLA cores;
`gpu.integrated` for a Jetson-style GPU). They check our code's use of the builder, runtime and
CUDA APIs, not the APIs themselves (tests/gpu/ stages dla and zerocopy do that on a Jetson).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.fakes.tensorrt import ACTIVATION_BYTES, PLAN_MAGIC, write_plan

from infermux.cli import build
from infermux.plugins import backends
from infermux.plugins.backends import tensorrt_build, trtlib
from infermux.plugins.base import BackendError

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures

DLA_PLAN = PLAN_MAGIC + b"DLA"


@pytest.fixture
def onnx(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"an ONNX model, as far as the fake parser cares")
    return path


def test_contract_dla_build_sets_the_default_device_core_and_fallback(fake_trt, onnx: Path, tmp_path: Path):
    """Checks our code's use of the builder API: --dla-core 1 --gpu-fallback makes DLA the default
    device on core 1 with GPU_FALLBACK, and stores the core for loading; a core the device lacks,
    or DLA without FP16/INT8, is refused (exit 1 and 2)."""
    fake_trt.dla_cores = 2
    out = tmp_path / "dla.plan"
    assert build.main([str(onnx), "-o", str(out), "--fp16", "--dla-core", "1", "--gpu-fallback"]) == 0
    config = fake_trt.configs[-1]
    assert (config.default_device_type, config.DLA_core) == (fake_trt.DeviceType.DLA, 1)
    assert fake_trt.BuilderFlag.GPU_FALLBACK in config.flags
    assert tensorrt_build.stored_settings(out)["dla_core"] == 1
    assert build.main([str(onnx), "-o", str(out), "--fp16", "--dla-core", "2"]) == 1
    assert build.main([str(onnx), "-o", str(out), "--dla-core", "0"]) == 2
    assert build.main([str(onnx), "-o", str(out), "--fp16", "--gpu-fallback"]) == 2


def test_contract_each_engine_gets_its_dla_core_under_the_runtime_lock(fake_trt, tmp_path: Path):
    """Checks our code: the shared runtime's DLA_core is set to each model's core (its option, else
    the stored build setting) and the plan deserialized while the runtime lock is held, so a load
    onto another core cannot change the core in between."""
    fake_trt.dla_cores = 2
    held: list[bool] = []
    fake_trt.on_deserialize = lambda: held.append(trtlib.shared().runtime_lock.locked())
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    one, two = write_plan(tmp_path / "a", magic=DLA_PLAN), write_plan(tmp_path / "b", magic=DLA_PLAN)
    tensorrt_build.settings_path(two).write_text('{"dla_core": 1}')
    engines = [backends.for_path(one).load(one, {"dla_core": 0}), backends.for_path(two).load(two, {})]
    assert [e._engine.dla_core for e in engines] == [0, 1] and held == [True, True]
    for engine in engines:
        engine.close()
    with pytest.raises(BackendError, match="DLA core 5, but this device has 2"):
        backends.for_path(one).load(one, {"dla_core": 5})
    with pytest.raises(BackendError, match="dla_core .* must be a DLA core number"):
        backends.for_path(one).load(one, {"dla_core": "first"})


def test_contract_zero_copy_on_an_integrated_gpu_binds_mapped_pinned_memory(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the CUDA API (item 13): on an integrated GPU every tensor is bound
    to mapped pinned memory (cudaHostAlloc mapped, its cudaHostGetDevicePointer address), no
    cudaMalloc and no copy between host and device runs, results (and a worker's slot through
    infer_into) are right, and the budget is charged one buffer per tensor, not two."""
    fake_gpu.integrated = True
    engine = backends.for_path(write_plan(tmp_path)).load(tmp_path / "model.plan", {})
    ctx = engine.create_context()
    assert not fake_gpu.device and fake_gpu.mapped
    raw = next(c() for c in fake_trt.contexts if c() is not None)
    assert set(raw.addresses.values()) <= set(fake_gpu.mapped)
    fake_gpu.copies.clear()
    rng = np.random.default_rng(5)
    for n in (3, 8, 1):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        np.testing.assert_array_equal(ctx.infer({"x": x})["total"], x.sum(axis=1, dtype=np.float32))
    slot = np.zeros(2, np.int32)
    x = np.array([[0, 9, 1, 2], [7, 1, 1, 1]], np.float32)
    assert ctx.infer_into({"x": x}, {"argmax": slot})["argmax"] is slot and slot.tolist() == [1, 0]
    assert fake_gpu.copies == []
    io = 8 * 16 + 8 * 4 + 8 * 4
    assert engine.context_bytes() == ACTIVATION_BYTES + io
    engine.close()
    assert not fake_gpu.mapped and not fake_gpu.host


def test_contract_zero_copy_is_only_for_integrated_gpus_and_can_be_turned_off(fake_trt, fake_gpu, tmp_path):
    """Checks our code: a discrete GPU keeps pinned + device buffers and copies; zero_copy = false
    does the same on an integrated one; a non-bool zero_copy is refused at load."""
    path = write_plan(tmp_path)
    for integrated, options in ((False, {}), (True, {"zero_copy": False})):
        fake_gpu.integrated = integrated
        engine = backends.for_path(path).load(path, options)
        assert engine.zero_copy is False and fake_gpu.device and not fake_gpu.mapped
        engine.close()
    fake_gpu.integrated = True
    with pytest.raises(BackendError, match="zero_copy .* must be true or false"):
        backends.for_path(path).load(path, {"zero_copy": 1})
