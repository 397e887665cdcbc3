"""The memory budget's NVML reader (daemon/budget.py) on a real GPU.

budget.Nvml reads NVML through ctypes (no CUDA context of its own). Here it
is checked against real device allocations made through
infermux.plugins.backends.cuda: NVML's free figure falls by what was
allocated, the budget takes the GPU's total, and, where NVML lists
processes in this machine at all, this process shows with at least what it
allocated. Where the machine hides per-process figures (some VMs and
containers do), that check skips with the reason instead of passing.

Jetson has no NVML memory figures (the budget uses host memory there), so
the module skips on integrated GPUs.
"""

from __future__ import annotations

import ctypes
import os

import pytest

from infermux.models import budget
from infermux.plugins.backends import cuda

pytestmark = pytest.mark.gpu

MiB = 1 << 20
ALLOC = 256 * MiB
# cudaMalloc rounds to 2 MiB pages and may map a little bookkeeping with the
# first large allocation; nothing else should be using this GPU meanwhile.
SLACK = 16 * MiB


@pytest.fixture(scope="module")
def nvml() -> budget.Nvml:
    if budget.is_jetson() or cuda.is_integrated():
        pytest.skip("integrated GPU (Jetson): the budget uses host memory, NVML has no GPU memory figures")
    cuda.set_device(0)  # CUDA device 0 is the first visible GPU, NVML index _first_visible_gpu()
    cuda.DeviceBuffer(1).close()  # the CUDA context exists before anything is measured
    reader = budget.Nvml.open()
    assert reader is not None, f"NVML unusable on a discrete GPU: {_why_no_nvml()}"
    return reader


def _why_no_nvml() -> str:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return f"libnvidia-ml.so.1 does not load: {exc}"
    rc = lib.nvmlInit_v2()
    if rc:
        return f"nvmlInit_v2 returned {rc}"
    handle = ctypes.c_void_p()
    index = budget._first_visible_gpu()
    rc = lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
    return f"nvmlDeviceGetHandleByIndex_v2({index}) returned {rc}"


def _raw_processes(reader: budget.Nvml) -> tuple[int, dict[int, int]]:
    """NVML's return code and every listed process, "not available" figures included."""
    count = ctypes.c_uint(64)
    infos = (budget._Process * 64)()
    rc = reader._lib.nvmlDeviceGetComputeRunningProcesses_v3(reader._handle, ctypes.byref(count), infos)
    return rc, ({infos[i].pid: infos[i].usedGpuMemory for i in range(count.value)} if rc == 0 else {})


def test_nvml_free_memory_moves_with_a_device_allocation(nvml: budget.Nvml) -> None:
    total, free_before = nvml.memory()
    cuda_before = cuda.mem_info()
    assert 0 < free_before <= total
    buf = cuda.DeviceBuffer(ALLOC)
    try:
        _, free_during = nvml.memory()
        cuda_during = cuda.mem_info()
    finally:
        buf.close()
    _, free_after = nvml.memory()
    fell = free_before - free_during
    assert ALLOC - SLACK <= fell <= ALLOC + SLACK, f"NVML free fell by {fell / MiB:.1f} MiB for a 256 MiB cudaMalloc"
    # NVML and cudaMemGetInfo see the same allocation.
    cuda_fell = cuda_before.free - cuda_during.free
    assert abs(fell - cuda_fell) <= SLACK, f"NVML: {fell / MiB:.1f} MiB, cudaMemGetInfo: {cuda_fell / MiB:.1f} MiB"
    assert abs(free_after - free_before) <= SLACK, "the memory came back after cudaFree"


def test_the_budget_is_taken_of_the_gpus_memory(nvml: budget.Nvml) -> None:
    total, free = nvml.memory()
    b = budget.MemoryBudget("50%", "test.toml")
    assert b.source == "gpu" and b.total == total and b.limit == total // 2
    assert abs(b.available() - free) <= SLACK
    # NVML's total counts memory the driver reserves; cudaMemGetInfo's does not.
    cuda_total = cuda.mem_info().total
    assert 0.95 * total <= cuda_total <= total, \
        f"NVML total {total / MiB:.0f} MiB, CUDA total {cuda_total / MiB:.0f} MiB"


def test_this_process_is_listed_with_its_allocation(nvml: budget.Nvml) -> None:
    pid = os.getpid()
    buf = cuda.DeviceBuffer(ALLOC)
    try:
        listed = nvml.used_by()
        rc, raw = _raw_processes(nvml)
    finally:
        buf.close()
    after = nvml.used_by()
    if rc != 0:
        pytest.skip(f"nvmlDeviceGetComputeRunningProcesses_v3 returned {rc}: per-process GPU memory unavailable here")
    if not raw:
        pytest.skip("NVML lists no compute processes on this machine (hidden by the VM or container), "
                    "so cold workers' GPU memory cannot be measured here")
    if pid not in raw:
        pytest.skip(f"NVML lists pids {sorted(raw)} but not this process ({pid}): another pid namespace "
                    "(container), so the daemon cannot match workers to their GPU memory here")
    if raw[pid] >= 1 << 63:
        pytest.skip("NVML lists this process but its memory as 'not available' (no rights to see it here)")
    assert listed.get(pid, 0) >= ALLOC, f"NVML puts {listed.get(pid, 0) / MiB:.1f} MiB on this process"
    assert listed[pid] - after.get(pid, 0) >= ALLOC - SLACK, "the per-process figure fell back after cudaFree"


def test_the_reader_agrees_with_nvidia_ml_py(nvml: budget.Nvml) -> None:
    """An independent reader (NVIDIA's own bindings) sees the same figures: struct layouts are right."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(budget._first_visible_gpu())
        buf = cuda.DeviceBuffer(ALLOC)
        try:
            ours, theirs = nvml.used_by(), pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            total, free = nvml.memory()
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        finally:
            buf.close()
    finally:
        pynvml.nvmlShutdown()
    assert total == mem.total and abs(free - mem.free) <= SLACK
    if not theirs:
        pytest.skip("NVML lists no compute processes here: only the memory figures could be compared")
    not_available = getattr(pynvml, "NVML_VALUE_NOT_AVAILABLE_ulonglong", None)
    expected = {p.pid: p.usedGpuMemory for p in theirs
                if p.usedGpuMemory is not None and p.usedGpuMemory != getattr(not_available, "value", -1)
                and p.usedGpuMemory < 1 << 63}
    assert ours == expected
