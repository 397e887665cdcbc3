"""Stand-ins for NVIDIA's management library (NVML), two GPUs each, no driver needed.

- StandInPynvml: pynvml's calls, as infermux.admin.hardware.NvmlSource makes them;
- NVML_STAND_IN_C: the same two devices as a C library (libnvidia-ml's entry points, for the ctypes path);
- StandInLibNvml: libnvidia-ml's calls as infermux.models.budget.Nvml makes them (ctypes byref
  arguments), over GPUs a test describes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from infermux.admin.hardware import NVML_TEMPERATURE_GPU


class NotSupported(Exception):
    """What pynvml raises for a reading a device lacks (NVMLError_NotSupported)."""


class StandInPynvml:
    """pynvml's calls over two fixed devices; the second has no power sensor."""

    def __init__(self) -> None:
        self.devices = [
            {"name": b"NVIDIA A2", "gpu": 37, "used": 3 << 30, "total": 16 << 30, "temp": 54, "power": 41_250},
            {"name": "NVIDIA T4", "gpu": 0, "used": 0, "total": 15 << 30, "temp": 31, "power": None},
        ]

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:  # noqa: N802
        return self.devices[index]

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> str | bytes:  # noqa: N802
        return handle["name"]

    def nvmlDeviceGetUtilizationRates(self, handle: dict[str, Any]) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=handle["gpu"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(used=handle["used"], total=handle["total"], free=handle["total"] - handle["used"])

    def nvmlDeviceGetTemperature(self, handle: dict[str, Any], sensor: int) -> int:  # noqa: N802
        assert sensor == NVML_TEMPERATURE_GPU
        return handle["temp"]

    def nvmlDeviceGetPowerUsage(self, handle: dict[str, Any]) -> int:  # noqa: N802
        if handle["power"] is None:
            raise NotSupported("power")
        return handle["power"]


# libnvidia-ml's entry points infermux's CtypesNvml calls, over the same two devices as StandInPynvml.
NVML_STAND_IN_C = r"""
#include <string.h>
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned long long total, free, used; } mem_t;
static int inited;
int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { if (!inited) return 1; *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { if (i > 1) return 2; *h = (void *)(long)(i + 1); return 0; }
static int idx(void *h) { return (int)(long)h - 1; }
int nvmlDeviceGetName(void *h, char *name, unsigned int len) {
    strncpy(name, idx(h) ? "NVIDIA T4" : "NVIDIA A2", len); return 0; }
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) { u->gpu = idx(h) ? 0 : 37; u->memory = 0; return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    m->total = idx(h) ? 15ULL << 30 : 16ULL << 30; m->used = idx(h) ? 0 : 3ULL << 30;
    m->free = m->total - m->used; return 0; }
int nvmlDeviceGetTemperature(void *h, int sensor, unsigned int *t) {
    if (sensor != 0) return 2; *t = idx(h) ? 31 : 54; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) {
    if (idx(h)) return 3; *mw = 41250; return 0; }  /* 3: NVML_ERROR_NOT_SUPPORTED */
"""


class StandInLibNvml:
    """libnvidia-ml's calls as budget.Nvml makes them (ctypes byref arguments), over two GPUs."""

    def __init__(self, totals: list[int], used: list[int], pids: list[dict[int, int]]) -> None:
        self.totals, self.used, self.pids = totals, used, pids

    def nvmlInit_v2(self) -> int:  # noqa: N802 (NVML's names)
        return 0

    def nvmlDeviceGetCount_v2(self, count) -> int:  # noqa: N802
        count._obj.value = len(self.totals)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, handle) -> int:  # noqa: N802
        if index >= len(self.totals):
            return 2  # NVML_ERROR_INVALID_ARGUMENT
        handle._obj.value = index + 1
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle, mem) -> int:  # noqa: N802
        i = handle.value - 1
        mem._obj.total, mem._obj.used = self.totals[i], self.used[i]
        mem._obj.free = self.totals[i] - self.used[i]
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, infos) -> int:  # noqa: N802
        listed = self.pids[handle.value - 1]
        for k, (pid, nbytes) in enumerate(listed.items()):
            infos[k].pid, infos[k].usedGpuMemory = pid, nbytes
        count._obj.value = len(listed)
        return 0
