"""Hardware readings: NVML through a stand-in module, Jetson from a sysfs tree written here,
processes from the real /proc (a daemon and its cold worker)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.harness import DAEMON_HEAD, free_port
from infermux.admin import hardware
from infermux.admin.hardware import CtypesNvml, GpuSample, JetsonSource, NvmlSource
from infermux.admin.metrics import Exposition, _gpus
from support.fakes.nvml import NVML_STAND_IN_C, NotSupported, StandInPynvml
from support.metrics import SAMPLE, scrape


def test_nvml_readings_in_operators_units() -> None:
    first, second = NvmlSource(StandInPynvml()).samples()
    assert first == GpuSample("0", "NVIDIA A2", utilization_ratio=0.37, memory_used_bytes=3 << 30,
                              memory_total_bytes=16 << 30, temperature_celsius=54.0, power_watts=41.25)
    assert second.name == "NVIDIA T4" and second.power_watts is None  # unsupported: left out, not 0


class GoneNvml(StandInPynvml):
    """A driver that went away after start (an Xid, a driver upgrade)."""

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        raise NotSupported("driver gone")


def test_an_nvml_that_fails_gives_no_gpu_rows() -> None:
    assert NvmlSource(GoneNvml()).samples() == []


def test_the_ctypes_path_reads_a_stand_in_libnvidia_ml_like_pynvml(tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in libnvidia-ml (apt-get install gcc)")
    source, library = tmp_path / "nvml.c", tmp_path / "libnvidia-ml-standin.so"
    source.write_text(NVML_STAND_IN_C)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    through_ctypes = NvmlSource(CtypesNvml(ctypes.CDLL(str(library)))).samples()
    assert through_ctypes == NvmlSource(StandInPynvml()).samples()


def test_gpu_families_parse_and_skip_missing_readings() -> None:
    out = Exposition()
    _gpus(out, NvmlSource(StandInPynvml()).samples())
    lines = [line for line in out.text().splitlines() if not line.startswith("#")]
    assert all(SAMPLE.match(line) for line in lines), lines
    assert 'infermux_gpu_power_watts{gpu="0",name="NVIDIA A2"} 41.25' in lines
    assert not any(line.startswith('infermux_gpu_power_watts{gpu="1"') for line in lines)
    assert 'infermux_gpu_utilization_ratio{gpu="1",name="NVIDIA T4"} 0' in lines


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture
def orin(tmp_path: Path) -> tuple[Path, Path]:
    """The files an Orin's kernel shows (JetPack 6), under tmp_path."""
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    write(sys_root, "devices/platform/17000000.ga10b/load", "512")
    write(sys_root, "class/thermal/thermal_zone0/type", "cpu-thermal")
    write(sys_root, "class/thermal/thermal_zone0/temp", "61000")
    write(sys_root, "class/thermal/thermal_zone1/type", "gpu-thermal")
    write(sys_root, "class/thermal/thermal_zone1/temp", "47500")
    write(sys_root, "class/hwmon/hwmon0/name", "ina3221")
    for channel, label, mv, ma in ((1, "VDD_IN", 5000, 2400), (2, "VDD_CPU_GPU_CV", 5000, 1200)):
        write(sys_root, f"class/hwmon/hwmon0/in{channel}_label", label)
        write(sys_root, f"class/hwmon/hwmon0/in{channel}_input", str(mv))
        write(sys_root, f"class/hwmon/hwmon0/curr{channel}_input", str(ma))
    write(proc_root, "meminfo", "MemTotal:        7994000 kB\nMemFree:          100000 kB\n"
                                "MemAvailable:    5994000 kB")
    return sys_root, proc_root


def test_jetson_readings_from_sysfs(orin: tuple[Path, Path]) -> None:
    (sample,) = JetsonSource(*orin).samples()
    assert sample.utilization_ratio == pytest.approx(0.512)
    assert sample.temperature_celsius == pytest.approx(47.5)  # the GPU zone, not the CPU's
    assert sample.power_watts == pytest.approx(6.0)  # 5 V x 1.2 A on the rail naming the GPU
    assert (sample.memory_used_bytes, sample.memory_total_bytes) == (2_000_000 * 1024, 7_994_000 * 1024)


def test_a_jetson_without_sensors_gives_what_it_has(orin: tuple[Path, Path]) -> None:
    sys_root, proc_root = orin
    (sys_root / "class/hwmon/hwmon0/name").write_text("tmp451\n")  # no INA3221: no power
    (sys_root / "class/thermal/thermal_zone1/type").write_text("soc0-thermal\n")
    (sample,) = JetsonSource(sys_root, proc_root).samples()
    assert sample.power_watts is None and sample.temperature_celsius is None
    assert sample.utilization_ratio == pytest.approx(0.512)


def test_no_load_file_is_no_jetson_gpu(tmp_path: Path) -> None:
    assert JetsonSource(tmp_path / "sys", tmp_path / "proc").samples() == []


def test_a_process_stat_with_spaces_and_parentheses_in_its_name(tmp_path: Path) -> None:
    fields = ["S"] + ["0"] * 10 + ["250", "50"] + ["0"] * 8 + ["1000"] + ["0"] * 20
    write(tmp_path, "42/stat", "42 (odd) name) " + " ".join(fields))
    sample = hardware.process_sample("daemon", 42, proc_root=tmp_path)
    assert sample is not None
    assert sample.cpu_seconds == pytest.approx(300 / os.sysconf("SC_CLK_TCK"))
    assert sample.resident_bytes == 1000 * os.sysconf("SC_PAGE_SIZE")
    assert hardware.process_sample("daemon", 43, proc_root=tmp_path) is None  # gone


def test_the_daemon_and_its_cold_worker_have_cpu_and_memory_series(make_daemon) -> None:
    port = free_port()
    d = make_daemon('[[models]]\nname = "cold"\nengine = "addone/1/model.onnx"\nplacement = "cold"\n'
                    'preload = true\n', head=DAEMON_HEAD + f"metrics_port = {port}\n")
    with d.admin() as admin:
        (view,) = admin.call("models")["models"]
    worker_pid = view["worker"]["pid"]
    samples = scrape(port)
    assert d.proc is not None
    for process, pid in (("daemon", d.proc.pid), ("worker cold:1", worker_pid)):
        labels = f'{{process="{process}",pid="{pid}"}}'
        assert samples[f"infermux_process_cpu_seconds_total{labels}"] > 0  # both imported numpy at least
        assert samples[f"infermux_process_resident_memory_bytes{labels}"] > 10 << 20
