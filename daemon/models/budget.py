"""The memory budget: how much the models may take, and what one more would need.

`[daemon] memory_budget` ("80%", "6GiB", bytes) is taken of the GPU's memory
when NVML can read it, else of host memory: CPU-only boxes, and Jetson, where
the GPU's memory is the system's. NVML is read through ctypes, which creates
no CUDA context (that alone would cost the daemon 300–500 MB).

Before a load the registry asks for room (`MemoryKeeper.make_room`): the estimate
is the version's last measured footprint, else the engine file's size times
`FILE_FACTOR` (plus a worker's base cost for a cold model). The loaded
footprint is taken afterwards (memory.py): hot, the engine's own figure;
cold, the worker's RSS plus its GPU memory.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import os
from pathlib import Path
from typing import Any

from infermux.config import COLD, ModelConfig, parse_budget
from infermux.plugins import backends

log = logging.getLogger("infermux.budget")

# An engine in memory costs about its file size again per loaded copy (weights,
# plus activations and the file read during deserialisation): x2 is what
# onnxruntime models measured (docs/performance.md); TensorRT plans are similar.
FILE_FACTOR = 2.0
DEFAULT_WORKER_BASE = 96 << 20  # a worker's Python + numpy + zmq + backend before any engine


class BudgetExceeded(Exception):
    """A load that would not fit the budget even after stopping every idle cold model."""


def meminfo(field: str) -> int:
    """A /proc/meminfo field in bytes (0 if unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def is_jetson() -> bool:
    """Jetson boards: the GPU shares the system memory."""
    if Path("/etc/nv_tegra_release").exists():
        return True
    try:
        return "jetson" in Path("/proc/device-tree/model").read_text(errors="replace").lower()
    except OSError:
        return False


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Process(ctypes.Structure):  # nvmlProcessInfo_t as the _v3 call fills it
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Nvml:
    """One GPU through NVML (libnvidia-ml), without CUDA."""

    def __init__(self, lib: Any, handle: ctypes.c_void_p) -> None:
        self._lib, self._handle = lib, handle

    @classmethod
    def open(cls) -> "Nvml | None":
        """The first visible GPU (CUDA device 0), or None without NVML."""
        gpus = cls.open_all()
        return gpus[0] if gpus else None

    @classmethod
    def open_all(cls, lib: Any = None) -> "list[Nvml]":
        """Every GPU CUDA makes visible, in CUDA's device order (`device = N` is the N-th); [] without
        NVML. `lib` is libnvidia-ml, or a stand-in with its calls (tests)."""
        try:
            lib = lib if lib is not None else ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return []
            gpus = []
            for index in _visible_gpus(lib):
                handle = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                    break  # CUDA numbers the visible devices densely: stop at the first NVML cannot open
                gpus.append(cls(lib, handle))
        except (OSError, AttributeError):
            return []
        return gpus

    def memory(self) -> tuple[int, int]:
        """(total, free) bytes."""
        mem = _Memory()
        if self._lib.nvmlDeviceGetMemoryInfo(self._handle, ctypes.byref(mem)) != 0:
            return 0, 0
        return mem.total, mem.free

    def used_by(self) -> dict[int, int]:
        """GPU memory per process id, for the processes with a context on this GPU."""
        try:
            call = self._lib.nvmlDeviceGetComputeRunningProcesses_v3
        except AttributeError:
            return {}
        count = ctypes.c_uint(64)
        infos = (_Process * 64)()
        if call(self._handle, ctypes.byref(count), infos) != 0:
            return {}
        # NVML reports "not available" (e.g. without the rights to see it) as all ones.
        return {infos[i].pid: infos[i].usedGpuMemory for i in range(count.value)
                if infos[i].usedGpuMemory < (1 << 63)}


def _visible_gpus(lib: Any) -> list[int]:
    """NVML indices of the GPUs CUDA sees, CUDA device 0 first: CUDA_VISIBLE_DEVICES' numbers where
    it is set, else every GPU NVML counts. NVML numbers GPUs in PCI bus order; CUDA does too only
    with CUDA_DEVICE_ORDER=PCI_BUS_ID (docs/tensorrt.md#several-gpus)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return [0]
        return list(range(count.value))
    indices = []
    for part in visible.split(","):
        if not part.strip().isdigit():
            break  # CUDA stops at the first entry it cannot parse
        indices.append(int(part))
    if not indices and visible.strip():
        return [0]  # UUIDs or MIG names: not mapped to NVML indices here; read the first GPU as before
    return indices


def _first_visible_gpu() -> int:
    """The NVML index of CUDA device 0 (tests/gpu)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def device_of(mc: ModelConfig) -> int:
    """The CUDA device a model's engine runs on: its `device` option (the TensorRT backend's), else 0."""
    try:
        return max(0, int(mc.options.get("device", 0)))
    except (TypeError, ValueError):
        return 0


class MemoryBudget:
    """The limit in bytes and where it is measured (GPU or host).

    With several GPUs each has its own limit, `memory_budget` taken of its own total, and a model
    is charged on the GPU it runs on (`device_of`): `limit` and `total` are GPU 0's.
    """

    def __init__(self, setting: object, config_path: Path | str, gpus: "list[Nvml] | None" = None) -> None:
        self.jetson = is_jetson()
        self.gpus = gpus if gpus is not None else ([] if self.jetson else Nvml.open_all())
        self.gpu = self.gpus[0] if self.gpus else None
        self.totals = [gpu.memory()[0] for gpu in self.gpus]
        if self.gpu is not None:
            self.total, self.source = self.totals[0], "gpu"
        else:
            self.total, self.source = meminfo("MemTotal"), "host"
        self._setting: object = None
        self.follow(setting, config_path)

    def follow(self, setting: object, config_path: Path | str) -> None:
        """Take a reloaded configuration's `memory_budget` (validated with the file already)."""
        if setting != self._setting or not hasattr(self, "limits"):
            totals = self.totals or [self.total]
            self.limits = [parse_budget(config_path, setting, total) for total in totals]
            self.limit, self._setting = self.limits[0], setting

    def device_for(self, mc: ModelConfig) -> int | None:
        """The GPU a model is charged on, or None where one budget covers every model
        (host memory, Jetson, a single GPU)."""
        if len(self.gpus) < 2:
            return None
        device = device_of(mc)
        return device if device < len(self.gpus) else 0

    def limit_of(self, device: int | None) -> int:
        """The limit of one GPU (None: the one budget)."""
        return self.limit if device is None else self.limits[device]

    def available(self, device: int | None = None) -> int:
        """Free memory right now where the budget is measured (on GPU `device`; None: GPU 0)."""
        if self.gpu is not None:
            return self.gpus[device or 0].memory()[1]
        return meminfo("MemAvailable") or self.total

    def gpu_used(self) -> dict[int, int]:
        """GPU memory per process id, summed over every GPU (a worker may hold memory on several)."""
        used: dict[int, int] = {}
        for gpu in self.gpus:
            for pid, nbytes in gpu.used_by().items():
                used[pid] = used.get(pid, 0) + nbytes
        return used


def estimate(mc: ModelConfig, measured: int, worker_base: int) -> int:
    """Bytes a version is expected to take once loaded."""
    if measured:
        return measured
    try:
        size = mc.engine.stat().st_size
    except OSError:
        size = 0
    copies = max(1, mc.contexts) if backends.weights_per_context(mc.engine, mc.backend, mc.options) else 1
    engine = int(size * FILE_FACTOR * copies)
    base = (worker_base or DEFAULT_WORKER_BASE) if mc.placement == COLD else 0
    return engine + base


def rss_bytes() -> int:
    """This process's resident memory (Linux), or 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB"


# glibc's malloc gives each thread that allocates its own arena, up to 8 per
# core. The daemon starts short-lived threads all the time (a reader per
# cold worker, an executor per context of every swapped-in engine, loader
# and stop threads); each lands in some arena and leaves long-lived
# allocations scattered there, so every arena's heap creeps up and no other
# thread reuses its free space. Under the soak's load (cold workers
# restarting all the time) RSS grew per restart with the default arenas,
# a quarter as much with 2 (docs/performance.md); hot-path QPS was the same
# within noise (threads mostly allocate under the GIL anyway).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt parameter, <malloc.h>


@functools.lru_cache(maxsize=1)
def _glibc() -> ctypes.CDLL | None:
    """libc, loaded once (a CDLL per call would build a new function-pointer class each time)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018  (glibc, not musl or another libc)
    except (OSError, AttributeError):
        return None
    return libc


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (see MALLOC_ARENAS); call before starting threads.

    An operator's `MALLOC_ARENA_MAX` in the environment wins: glibc has read
    it already. Returns whether the cap was set.
    """
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


def release_freed_memory() -> None:
    """Free what an unloaded engine left behind, then hand the freed heap pages back to the OS.

    First a full garbage collection: an unloaded version's executors, fair
    queues, statistics rings (4 x 32 KiB per recording thread) and, for a
    cold model, its worker proxy and slot pool sit in reference cycles that
    lived long enough to reach the oldest generation, which Python collects
    only every few minutes at the daemon's object count. Until then nothing
    was freed and there was nothing to trim: the soak's RSS saw-toothed by
    a few MiB. The collection holds the GIL, once per unload: for what was created since
    start-up only (cli/serve.py freezes what the imports made).

    Then glibc's malloc_trim: backends free their arenas into glibc, which
    keeps them mapped; across many swaps the daemon's RSS would creep up by
    tens of KiB each (measured in the soak benchmark). A no-op where glibc
    is not the allocator.
    """
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
