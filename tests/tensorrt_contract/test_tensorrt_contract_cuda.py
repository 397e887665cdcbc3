"""Contract tests: the CUDA layer (plugins/backends/cuda.py) on its own.

Each test runs against the stand-in in fakes_tensorrt.py. They check our
code's use of the cuda-python API; they do not prove the API itself
(tests/gpu/test_gpu_cuda.py does, on a real GPU).
"""

from __future__ import annotations

import sys
from types import ModuleType

import numpy as np
import pytest
from support.fakes.tensorrt import FakeCudart

from infermux.plugins.backends import cuda
from infermux.plugins.base import BackendError

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures


def test_round_trip_through_device(fake_gpu):
    """Checks our code's use of the API, not the API itself: pinned -> device ->
    pinned copies on a stream move the bytes unchanged."""
    stream = cuda.Stream()
    src, dst, dev = cuda.HostBuffer(64), cuda.HostBuffer(64), cuda.DeviceBuffer(64)
    data = np.arange(16, dtype=np.float32)
    src.view(np.float32, (16,))[:] = data
    cuda.copy_to_device(dev, src, 64, stream)
    cuda.copy_to_host(dst, dev, 64, stream)
    stream.synchronize()
    np.testing.assert_array_equal(dst.view(np.float32, (16,)), data)
    for resource in (src, dst, dev, stream):
        resource.close()
        resource.close()  # idempotent
    assert not fake_gpu.device and not fake_gpu.host and not fake_gpu.streams


def test_errors_carry_the_cuda_error_name(fake_gpu):
    """Checks our code's use of the API, not the API itself: a non-success
    cudaError_t becomes a CudaError (a BackendError) with the error's name."""
    fake_gpu.fail["cudaMalloc"] = FakeCudart.cudaError_t.cudaErrorMemoryAllocation
    with pytest.raises(cuda.CudaError, match="cudaMalloc failed: cudaErrorMemoryAllocation") as err:
        cuda.DeviceBuffer(1024)
    assert isinstance(err.value, BackendError) and err.value.out_of_memory


def test_mem_info_follows_allocations(fake_gpu):
    """Checks our code's use of the API, not the API itself: mem_info() reports
    cudaMemGetInfo's free and total."""
    before = cuda.mem_info()
    buf = cuda.DeviceBuffer(1 << 20)
    assert before.free - cuda.mem_info().free == 1 << 20 and before.total == fake_gpu.total
    buf.close()
    assert cuda.mem_info() == before


def test_copies_never_overrun_a_buffer(fake_gpu):
    """Checks our code, not the API: a copy larger than either buffer is refused before
    CUDA sees it."""
    stream = cuda.Stream()
    with pytest.raises(BackendError, match="overruns"):
        cuda.copy_to_device(cuda.DeviceBuffer(16), cuda.HostBuffer(32), 32, stream)
    with pytest.raises(BackendError, match="needs 64 bytes"):
        cuda.HostBuffer(32).view(np.float32, (16,))


def test_no_gpu_counts_as_zero_devices(fake_gpu):
    """Checks our code's use of the API, not the API itself: cudaErrorNoDevice from
    cudaGetDeviceCount means 0 devices (tests skip), other errors are raised as CudaError; on an
    error cuda-bindings 12.9+ gives `(err, None)`, no count, which is never read as a number."""
    fake_gpu.fail["cudaGetDeviceCount"] = FakeCudart.cudaError_t.cudaErrorNoDevice
    assert cuda.device_count() == 0
    assert cuda.device_count() == 1
    fake_gpu.fail["cudaGetDeviceCount"] = FakeCudart.cudaError_t.cudaErrorLaunchFailure
    with pytest.raises(cuda.CudaError):
        cuda.device_count()


@pytest.mark.parametrize("version", ["12.6.2", "12.8.0", "12.9.0", "11.8.7"])
def test_contract_cuda_bindings_that_hold_the_gil_are_refused(fake_gpu, monkeypatch, version):
    """Checks our code's version check, not the API: cuda-bindings older than 12.9.1 hold the GIL
    through every cudaStreamSynchronize, so the first CUDA call refuses them, saying what to install."""
    monkeypatch.setattr(sys.modules["cuda.bindings"], "__version__", version)
    with pytest.raises(BackendError, match=rf"cuda-bindings\) {version} holds the Python GIL.*cuda-python>=12.9.1"):
        cuda.mem_info()


@pytest.mark.parametrize("version", ["12.9.1", "12.9.4.post1", "13.0.0", "13.3.1"])
def test_contract_cuda_bindings_that_release_the_gil_are_used(fake_gpu, monkeypatch, version):
    """Checks our code's version check, not the API: 12.9.1+ and 13.0.0+ are accepted."""
    monkeypatch.setattr(sys.modules["cuda.bindings"], "__version__", version)
    assert cuda.mem_info().total == fake_gpu.total


def test_contract_legacy_cudart_module_is_refused_as_holding_the_gil(monkeypatch):
    """Checks our code's import fallback, not the API: cuda-python that only has `cuda.cudart`
    (before 12.6) holds the GIL, so it is refused rather than used."""
    legacy = FakeCudart()
    package = ModuleType("cuda")
    package.cudart = legacy
    monkeypatch.setitem(sys.modules, "cuda", package)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    monkeypatch.setitem(sys.modules, "cuda.cudart", legacy)
    monkeypatch.setattr(cuda, "_api_cache", None)
    with pytest.raises(BackendError, match="holds the Python GIL"):
        cuda.binding_name()
    assert not legacy.device


def test_contract_pycuda_alone_is_not_used(monkeypatch):
    """Checks our code's import choice, not pycuda's API: with pycuda installed and cuda-python
    missing, the first CUDA call says to install cuda-python instead of driving pycuda, whose
    per-thread context pushes were never popped (docs/tensorrt.md, "Why not pycuda")."""
    driver = ModuleType("pycuda.driver")
    calls: list[str] = []
    driver.init = lambda: calls.append("init")
    driver.mem_get_info = lambda: (calls.append("mem_get_info"), (1, 2))[1]
    package = ModuleType("pycuda")
    package.driver = driver
    for name, module in (("cuda", None), ("cuda.bindings", None), ("pycuda", package), ("pycuda.driver", driver)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(cuda, "_api_cache", None)
    with pytest.raises(BackendError, match=r"cuda-python>=12.9.1.*pycuda is not used"):
        cuda.mem_info()
    assert calls == []


def test_missing_bindings_say_what_to_install(monkeypatch):
    """Checks our code's import fallback, not the API: without cuda-python the first CUDA
    call raises a BackendError naming the package."""
    for name in ("cuda", "cuda.bindings", "pycuda", "pycuda.driver"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(cuda, "_api_cache", None)
    with pytest.raises(BackendError, match=r"cuda-python>=12.9.1,<13"):
        cuda.mem_info()


def test_contract_the_slot_copy_benchmark_runs_every_case(fake_gpu, monkeypatch):
    """Checks tests/gpu/bench_slot_d2h.py's use of the API on the stand-in, so the script a lent GPU
    machine runs does not rot; its figures come from the real GPU (tests/benchmarks/RESULTS.md)."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
    try:
        import bench_slot_d2h
    finally:
        sys.path.pop(0)
    registered: list[int] = []
    monkeypatch.setattr(fake_gpu, "check", lambda *args: None, raising=False)  # slots are not fake allocations
    monkeypatch.setattr(fake_gpu, "cudaHostRegister",
                        lambda ptr, n, flags: (registered.append(ptr), (FakeCudart.cudaError_t.cudaSuccess,))[1],
                        raising=False)
    monkeypatch.setattr(fake_gpu, "cudaHostUnregister",
                        lambda ptr: (registered.remove(ptr), (FakeCudart.cudaError_t.cudaSuccess,))[1], raising=False)
    results = {size: bench_slot_d2h.measure(nbytes, 3) for size, nbytes in bench_slot_d2h.SIZES.items()}
    text = bench_slot_d2h.report(results, 3)
    for case in ("pinned", "pinned + memcpy", "pageable slot", "registered slot", "register + unregister"):
        assert f"| {case} |" in text and "n/a" not in text
    assert registered == []  # every slot registered was unregistered


@pytest.mark.parametrize("stage", ["cap", "memory", "teardown", "pycuda", "standin", "vcompat", "graphs", "dla"])
def test_contract_the_run_sh_stages_run_on_the_stand_in(fake_trt, fake_gpu, monkeypatch, tmp_path, capsys, stage):
    """Checks tests/gpu/stages.py's use of the backend on the stand-in (whose profile is the classifier's
    batch range 1..8), so the stages a lent GPU machine runs do not rot, and that each passes where the
    stand-in behaves as the stage asserts (a DLA build puts layers on the DLA, a capture is made, a
    strict runtime refuses a version-compatible plan); their figures come from the GPU."""
    from pathlib import Path

    from support.fakes import tensorrt as fakes_tensorrt

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
    try:
        import stages
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(stages, "gpu_missing", lambda: None)
    monkeypatch.setattr(stages, "build_plan", lambda out, *args: fakes_tensorrt.write_plan(tmp_path, out.parent.name + ".plan"))
    monkeypatch.setattr(stages, "images", lambda n, seed=0: np.ones((n, 4), np.float32))
    monkeypatch.setattr(stages, "INPUT", "x")
    monkeypatch.setattr(stages, "OUTPUT", "total")
    monkeypatch.setattr(stages, "_diff_from_onnxruntime", lambda x, out: "n/a")  # not the classifier
    fake_trt.fixed_batch = 1 if stage == "graphs" else None
    fake_trt.dla_cores = 2 if stage == "dla" else 0
    assert stages.main([stage, str(tmp_path)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert ("FIGURE: " in out) != out.startswith("SKIP: ")
    if stage == "graphs":
        assert "graph captured: True" in out and "invalidated capture: fallback ok" in out
    if stage == "dla":
        assert "core 1: 2 of 2 layers on the DLA" in out and "dynamic batch refused" in out
    if stage == "vcompat":
        assert "without engine_host_code_allowed refuses it" in out
