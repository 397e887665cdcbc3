"""Contract tests: DLA on Jetson and zero-copy I/O on integrated GPUs.

They run against the stand-in in tests/support/fakes/tensorrt.py (a device with `trt.dla_cores` DLA
cores; `gpu.integrated` for a Jetson-style GPU; the "orin" device model, both, on which a DLA build
with dynamic shapes fails or falls back to the GPU entirely, as TensorRT's does). They check our
code's use of the builder, runtime and CUDA APIs, not the APIs themselves (tests/gpu/ stages dla and
zerocopy do that on a Jetson).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.fakes.tensorrt import ACTIVATION_BYTES, PLAN_MAGIC, SITE, use_device, write_plan

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
    """Checks our code's use of the builder API: --dla-core 1 --gpu-fallback with a static batch makes
    DLA the default device on core 1 with GPU_FALLBACK, and stores the core for loading; a core the
    device lacks, or DLA without FP16/INT8, is refused (exit 1 and 2)."""
    fake_trt.dla_cores = 2
    out = tmp_path / "dla.plan"
    static = ["--profile", "1:1:1"]
    assert build.main([str(onnx), "-o", str(out), "--fp16", "--dla-core", "1", "--gpu-fallback", *static]) == 0
    config = fake_trt.configs[-1]
    assert (config.default_device_type, config.DLA_core) == (fake_trt.DeviceType.DLA, 1)
    assert fake_trt.BuilderFlag.GPU_FALLBACK in config.flags
    assert tensorrt_build.stored_settings(out)["dla_core"] == 1
    assert build.main([str(onnx), "-o", str(out), "--fp16", "--dla-core", "2", *static]) == 1
    assert build.main([str(onnx), "-o", str(out), "--dla-core", "0", *static]) == 2
    assert build.main([str(onnx), "-o", str(out), "--fp16", "--gpu-fallback"]) == 2


@pytest.mark.parametrize("batch", [[], ["--max-batch", "4"], ["--profile", "4:4:8"], ["--profile", "2:4:4"]])
def test_contract_a_dla_build_without_a_static_batch_is_refused_naming_profile(fake_trt, onnx: Path,
                                                                                tmp_path: Path, capsys, batch):
    """Checks our code: the DLA runs no dynamic dimensions, so a DLA build whose profile is not
    min = opt = max (the default batch 1..8 included) is refused in one line that names
    `--profile N:N:N`, before TensorRT builds anything (which would fall back to the GPU entirely)."""
    fake_trt.dla_cores = 2
    out = tmp_path / "dla.plan"
    assert build.main([str(onnx), "-o", str(out), "--fp16", "--dla-core", "0", "--gpu-fallback", *batch]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if line.startswith("infermux build:")]) == 1
    assert "--dla-core needs a static batch" in err[-1] and "--profile N:N:N" in err[-1]
    assert fake_trt.builds == [] and not out.exists()


def test_contract_a_dla_build_of_a_model_with_a_fixed_batch_needs_no_profile(fake_trt, onnx: Path, tmp_path: Path):
    """Checks our code: a model exported with a fixed batch has no dynamic dimension, so the default
    batch options do not matter and the DLA build goes ahead with no optimization profile."""
    fake_trt.dla_cores, fake_trt.onnx_inputs = 2, [("x", (4, 4))]
    assert build.main([str(onnx), "-o", str(tmp_path / "dla.plan"), "--fp16", "--dla-core", "0"]) == 0
    assert fake_trt.configs[-1].profiles == [] and fake_trt.builds[-1]["dla_layers"] == ["reduce_sum", "argmax"]


def test_contract_a_dla_build_reports_its_layers_on_the_dla_and_warns_when_none(fake_trt, onnx: Path,
                                                                                tmp_path: Path, capsys):
    """Checks our code's use of IBuilderConfig.get_device_type / can_run_on_DLA: a DLA build says how
    many layers run on the DLA; where none can (here: the stand-in's DLA refuses both layers), the
    GPU-fallback build is an ordinary GPU plan and a one-line warning says so."""
    fake_trt.dla_cores = 2
    args = [str(onnx), "-o", str(tmp_path / "dla.plan"), "--fp16", "--dla-core", "0", "--gpu-fallback",
            "--profile", "2:2:2"]
    assert build.main(args) == 0
    out = capsys.readouterr()
    assert "2 of 2 layers run on DLA core 0" in out.out and "warning" not in out.err
    assert (tmp_path / "dla.plan").read_bytes().startswith(DLA_PLAN)
    fake_trt.not_on_dla = {"reduce_sum", "argmax"}
    assert build.main(args) == 0
    out = capsys.readouterr()
    [warning] = [line for line in out.err.splitlines() if "warning" in line]
    assert "no layer of" in warning and "runs on DLA core 0: all fall back to the GPU" in warning
    assert "layers run on DLA" not in out.out
    assert not (tmp_path / "dla.plan").read_bytes().startswith(DLA_PLAN)


def test_contract_the_orin_stand_in_fails_a_dynamic_dla_build_as_tensorrt_does(fake_trt, fake_gpu, onnx: Path):
    """Checks the stand-in itself, driven through TensorRT's API as our code would without its
    refusal: on an Orin, a DLA build with a dynamic profile fails without GPU_FALLBACK and, with it,
    gives a plan with no layer on the DLA; a static profile puts the layers on the DLA."""
    use_device(fake_trt, fake_gpu, "orin")
    assert fake_gpu.integrated and fake_trt.Builder(None).num_DLA_cores == 2

    def build_with(low: int, high: int, fallback: bool) -> bytes | None:
        builder = fake_trt.Builder(trtlib.shared().logger)
        network = builder.create_network(0)
        assert fake_trt.OnnxParser(network, None).parse_from_file(str(onnx))
        config, profile = builder.create_builder_config(), builder.create_optimization_profile()
        profile.set_shape("x", (low, 4), (high, 4), (high, 4))
        config.add_optimization_profile(profile)
        config.set_flag(fake_trt.BuilderFlag.FP16)
        config.default_device_type, config.DLA_core = fake_trt.DeviceType.DLA, 0
        if fallback:
            config.set_flag(fake_trt.BuilderFlag.GPU_FALLBACK)
        return builder.build_serialized_network(network, config)

    assert build_with(1, 8, fallback=False) is None
    assert "not supported on DLA" in trtlib.shared().last_error()
    assert not build_with(1, 8, fallback=True).startswith(DLA_PLAN)
    assert build_with(4, 4, fallback=False).startswith(DLA_PLAN)


def _infermux_build(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m infermux.cli.build ARGS` in a process whose TensorRT is the Orin stand-in."""
    env = {**os.environ, "INFERMUX_FAKE_TRT": "1", "INFERMUX_FAKE_TRT_DEVICE": "orin",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "infermux.cli.build", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_contract_infermux_build_on_an_orin_needs_a_static_batch_for_the_dla(fake_trt, fake_gpu, onnx: Path,
                                                                            tmp_path: Path):
    """`infermux build` as an operator runs it on the Orin stand-in: the documented DLA command with
    the default dynamic batch is refused in one line naming --profile, no traceback, no plan; with
    `--profile 4:4:4` it builds a DLA plan, says how many layers run on the DLA, and the plan serves
    4-row requests on that core (zero-copy, as on an integrated GPU)."""
    plan = tmp_path / "det" / "1" / "model.plan"
    dla = [str(onnx), "-o", str(plan), "--fp16", "--dla-core", "0", "--gpu-fallback"]
    refused = _infermux_build(tmp_path, *dla)
    assert refused.returncode == 1, refused.stderr
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("infermux build:")]
    assert "--profile N:N:N" in line and "Traceback" not in refused.stderr and not plan.exists()
    built = _infermux_build(tmp_path, *dla, "--profile", "4:4:4")
    assert built.returncode == 0, built.stderr
    assert "2 of 2 layers run on DLA core 0" in built.stdout and "Traceback" not in built.stderr
    use_device(fake_trt, fake_gpu, "orin")
    fake_trt.profiles = [((4, 4), (4, 4), (4, 4))]  # the stand-in's plans do not carry their profiles
    engine = backends.for_path(plan).load(plan, {})
    try:
        assert engine._engine.dla_core == 0 and engine.zero_copy
        assert (engine.inputs[0].min_shape, engine.inputs[0].max_shape) == ((4, 4), (4, 4))
        x = np.arange(16, dtype=np.float32).reshape(4, 4)
        assert engine.create_context().infer({"x": x})["total"].tolist() == x.sum(1).tolist()
    finally:
        engine.close()


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


def test_contract_a_dla_plan_without_a_configured_core_gets_the_runtimes_default(fake_trt, tmp_path: Path):
    """Checks our code against IRuntime's DLA_core, which starts at -1 (unset), not 0: a DLA plan with
    no `dla_core` option and no stored setting (one trtexec built) is deserialized without our code
    choosing a core or reading the -1 as one; a configured core is set explicitly."""
    fake_trt.dla_cores = 2
    plan = write_plan(tmp_path, magic=DLA_PLAN)
    engine = backends.for_path(plan).load(plan, {})
    assert trtlib.shared().runtime.DLA_core == -1 and engine._engine.dla_core == -1
    engine.close()
    engine = backends.for_path(plan).load(plan, {"dla_core": 1})
    assert engine._engine.dla_core == 1
    engine.close()


def test_contract_zero_copy_on_an_integrated_gpu_binds_mapped_pinned_memory(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of the CUDA API (item 13): on an integrated GPU every tensor is bound
    to mapped pinned memory (cudaHostAlloc mapped, its cudaHostGetDevicePointer address), no
    cudaMalloc (but the context's activation memory) and no copy between host and device runs,
    results (and a worker's slot through infer_into) are right, and the budget is charged one
    buffer per tensor, not two."""
    fake_gpu.integrated = True
    engine = backends.for_path(write_plan(tmp_path)).load(tmp_path / "model.plan", {})
    ctx = engine.create_context()
    assert [len(b) for b in fake_gpu.device.values()] == [ACTIVATION_BYTES] and fake_gpu.mapped  # no I/O buffer
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
