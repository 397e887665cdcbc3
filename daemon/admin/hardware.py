"""Hardware readings for /metrics: GPUs, and the CPU and memory of infermux's processes.

The GPU source is chosen at run time (`gpu_source()`): on Jetson the sysfs
files tegrastats reads (GPU load, thermal zones, INA3221 power rails); on a
dGPU NVML, through `pynvml` (nvidia-ml-py) when it is importable, else
through ctypes on libnvidia-ml.so.1 (no CUDA context either way); else none.
A reading a device does not support is left out, not reported as 0.
docs/fleet.md lists the metric names.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

from infermux.models.budget import is_jetson

log = logging.getLogger("infermux.hardware")

T = TypeVar("T")
NVML_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t: the GPU die


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one scrape; None where the device cannot say."""

    gpu: str  # the index, as the `gpu` label
    name: str
    utilization_ratio: float | None = None  # busy fraction of the last sample period, 0..1
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None


class GpuSource(Protocol):
    """Where GPU samples come from (NVML, Jetson sysfs)."""

    kind: str

    def samples(self) -> list[GpuSample]:
        """Every GPU's current readings; an empty list when the source failed."""


class NvmlApi(Protocol):
    """The part of pynvml's API this module calls (CtypesNvml implements it too)."""

    def nvmlDeviceGetCount(self) -> int: ...  # noqa: N802 (NVML's names)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...  # noqa: N802

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...  # noqa: N802

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # noqa: N802 (.gpu in %)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # noqa: N802 (.used, .total)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...  # noqa: N802

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # noqa: N802 (milliwatts)


class NvmlSource:
    """dGPUs through NVML; `nvml` is pynvml, a CtypesNvml, or a stand-in (tests)."""

    kind = "nvml"

    def __init__(self, nvml: NvmlApi) -> None:
        self.nvml = nvml

    def samples(self) -> list[GpuSample]:
        try:
            count = self.nvml.nvmlDeviceGetCount()
        except Exception as exc:  # any NVML error: no GPU rows this scrape, the rest still served
            log.debug("NVML: no device count (%s)", exc)
            return []
        return [self._sample(i) for i in range(count)]

    def _sample(self, index: int) -> GpuSample:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _read(lambda: nvml.nvmlDeviceGetName(handle))
        util = _read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        mem = _read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        temp = _read(lambda: nvml.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU))
        power_mw = _read(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return GpuSample(str(index), name.decode() if isinstance(name, bytes) else str(name or ""),
                         utilization_ratio=None if util is None else util.gpu / 100.0,
                         memory_used_bytes=None if mem is None else int(mem.used),
                         memory_total_bytes=None if mem is None else int(mem.total),
                         temperature_celsius=None if temp is None else float(temp),
                         power_watts=None if power_mw is None else power_mw / 1000.0)


def _read(call: Callable[[], T]) -> T | None:
    """One NVML reading, or None where the device does not support it (NVMLError_NotSupported...)."""
    try:
        return call()
    except Exception:  # NVML raises its own error classes, one per return code
        return None


class NvmlError(Exception):
    """A non-zero NVML return code (CtypesNvml)."""


class _Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class CtypesNvml:
    """pynvml's calls (the few NvmlApi names) on libnvidia-ml.so.1 through ctypes."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._check(lib.nvmlInit_v2())

    @classmethod
    def open(cls) -> "CtypesNvml | None":
        """The driver's NVML, or None where there is no NVIDIA driver."""
        try:
            return cls(ctypes.CDLL("libnvidia-ml.so.1"))
        except (OSError, AttributeError, NvmlError):
            return None

    @staticmethod
    def _check(code: int) -> None:
        if code != 0:
            raise NvmlError(f"NVML error {code}")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        count = ctypes.c_uint()
        self._check(self._lib.nvmlDeviceGetCount_v2(ctypes.byref(count)))
        return count.value

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:  # noqa: N802
        handle = ctypes.c_void_p()
        self._check(self._lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)))
        return handle

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p) -> str:  # noqa: N802
        name = ctypes.create_string_buffer(96)
        self._check(self._lib.nvmlDeviceGetName(handle, name, len(name)))
        return name.value.decode(errors="replace")

    def nvmlDeviceGetUtilizationRates(self, handle: ctypes.c_void_p) -> _Utilization:  # noqa: N802
        util = _Utilization()
        self._check(self._lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)))
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: ctypes.c_void_p) -> _Memory:  # noqa: N802
        mem = _Memory()
        self._check(self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)))
        return mem

    def nvmlDeviceGetTemperature(self, handle: ctypes.c_void_p, sensor: int) -> int:  # noqa: N802
        temp = ctypes.c_uint()
        self._check(self._lib.nvmlDeviceGetTemperature(handle, sensor, ctypes.byref(temp)))
        return temp.value

    def nvmlDeviceGetPowerUsage(self, handle: ctypes.c_void_p) -> int:  # noqa: N802
        milliwatts = ctypes.c_uint()
        self._check(self._lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(milliwatts)))
        return milliwatts.value


# Where Jetson kernels put the GPU's load (per mille): the first that exists wins.
JETSON_LOAD_FILES = ("devices/gpu.0/load", "devices/platform/gpu.0/load",
                     "devices/platform/17000000.ga10b/load", "devices/platform/17000000.gv11b/load",
                     "devices/platform/17000000.gp10b/load")
JETSON_GPU_ZONES = ("gpu-thermal", "gpu-therm")  # thermal_zone*/type, lower-cased


class JetsonSource:
    """The integrated GPU of a Jetson, from sysfs (what tegrastats reads).

    Memory is the system's (the GPU shares it): used = MemTotal - MemAvailable.
    Power is the INA3221 rail whose label names the GPU (VDD_GPU_SOC on Orin).
    """

    kind = "jetson"

    def __init__(self, sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> None:
        self.sys_root, self.proc_root = sys_root, proc_root
        self.load_file = next((sys_root / f for f in JETSON_LOAD_FILES if (sys_root / f).is_file()), None)

    def samples(self) -> list[GpuSample]:
        if self.load_file is None:
            return []
        load = _int_file(self.load_file)
        temp = self._temperature_mc()
        total, available = _meminfo(self.proc_root, "MemTotal"), _meminfo(self.proc_root, "MemAvailable")
        power = self._power_w()
        return [GpuSample("0", "jetson", utilization_ratio=None if load is None else load / 1000.0,
                          memory_used_bytes=total - available if total and available is not None else None,
                          memory_total_bytes=total or None,
                          temperature_celsius=None if temp is None else temp / 1000.0, power_watts=power)]

    def _temperature_mc(self) -> int | None:
        for zone in sorted((self.sys_root / "class/thermal").glob("thermal_zone*")):
            if _text(zone / "type").lower() in JETSON_GPU_ZONES:
                return _int_file(zone / "temp")
        return None

    def _power_w(self) -> float | None:
        """The GPU rail: in<N>_input (mV) times curr<N>_input (mA) of an ina3221 hwmon."""
        for hwmon in sorted((self.sys_root / "class/hwmon").glob("hwmon*")):
            if _text(hwmon / "name") != "ina3221":
                continue
            for label in sorted(hwmon.glob("in*_label")):
                if "GPU" not in _text(label).upper():
                    continue
                channel = label.name[2:-len("_label")]
                millivolts = _int_file(hwmon / f"in{channel}_input")
                milliamps = _int_file(hwmon / f"curr{channel}_input")
                if millivolts is not None and milliamps is not None:
                    return millivolts * milliamps / 1e6
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _int_file(path: Path) -> int | None:
    try:
        return int(_text(path))
    except ValueError:
        return None


def _meminfo(proc_root: Path, field: str) -> int | None:
    """A /proc/meminfo field in bytes."""
    for line in _text(proc_root / "meminfo").splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else None
    return None


def gpu_source() -> GpuSource | None:
    """The GPU source this machine has: Jetson sysfs, NVML (pynvml, else ctypes), or None."""
    if is_jetson():
        jetson = JetsonSource()
        if jetson.load_file is not None:
            return jetson
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        return NvmlSource(pynvml)
    except Exception:  # not installed, or no driver (pynvml.NVMLError_LibraryNotFound...)
        pass
    nvml = CtypesNvml.open()
    return NvmlSource(nvml) if nvml is not None else None


@dataclass(frozen=True)
class ProcessSample:
    """CPU time and resident memory of one process, from /proc/<pid>/stat."""

    process: str  # "daemon", or "worker" with the model's labels
    pid: int
    cpu_seconds: float
    resident_bytes: int


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_sample(process: str, pid: int, proc_root: Path = Path("/proc")) -> ProcessSample | None:
    """Read /proc/<pid>/stat (utime + stime, rss); None once the process is gone."""
    text = _text(proc_root / str(pid) / "stat")
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rfind(")") + 2:].split() if ")" in text else []
    if len(fields) < 22:
        return None
    utime, stime, rss_pages = int(fields[11]), int(fields[12]), int(fields[21])
    return ProcessSample(process, pid, (utime + stime) / _CLOCK_TICKS, rss_pages * _PAGE)
