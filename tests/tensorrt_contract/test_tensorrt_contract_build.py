"""Contract tests: `infermux build` (cli/build.py) and the builder it runs (plugins/backends/tensorrt_build.py).

The tests that build run against the stand-in in fakes_tensorrt.py: they
check our code's use of the TensorRT builder API, and do not prove the API
itself (tests/gpu/ builds a real engine). The rest check argument handling
and the missing-TensorRT path, which need no stand-in.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infermux.cli import build
from infermux.plugins import backends
from infermux.plugins.backends import tensorrt_build, trtlib

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures

SAMPLE = Path(__file__).resolve().parents[2] / "engines" / "classifier" / "1" / "model.onnx"


@pytest.fixture
def onnx(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"an ONNX model, as far as the fake parser cares")
    return path


def test_batch_profile_covers_inputs_with_dynamic_batch_only():
    """Checks our code, not the TensorRT API: only inputs with a dynamic dim 0 get a profile."""
    profiles = tensorrt_build.batch_profile([("images", (-1, 3, 64, 64)), ("scale", (1,))], (1, 4, 8))
    assert profiles == {"images": ((1, 3, 64, 64), (4, 3, 64, 64), (8, 3, 64, 64))}
    with pytest.raises(tensorrt_build.BuildError, match="dynamic dimensions besides the batch"):
        tensorrt_build.batch_profile([("images", (-1, 3, -1, -1))], (1, 1, 1))


@pytest.mark.parametrize("argv, message", [
    (["--int8"], "--int8 needs --calib-cache"),
    (["--min-batch", "4", "--max-batch", "2"], "1 <= --min-batch <= --opt-batch <= --max-batch"),
    (["--opt-batch", "9"], "got 1, 9, 8"),
    (["--int8", "--calib-cache", "/nonexistent"], "no calibration cache"),
])
def test_bad_arguments_exit_2(argv, message, tmp_path, capsys):
    """Checks our code, not the TensorRT API: bad arguments are refused before TensorRT is needed."""
    assert build.main([str(SAMPLE), "-o", str(tmp_path / "m.plan"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_without_tensorrt_the_build_says_what_to_install(tmp_path, monkeypatch, capsys):
    """Checks our code, not the TensorRT API: no TensorRT -> exit 1 with install advice."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    monkeypatch.setattr(trtlib, "_shared", None)
    assert build.main([str(SAMPLE), "-o", str(tmp_path / "m.plan")]) == 1
    assert "TensorRT is not installed" in capsys.readouterr().err
    assert not (tmp_path / "m.plan").exists()


def test_build_sets_profile_workspace_precision_and_writes_atomically(fake_trt, onnx, tmp_path):
    """Checks our code's use of the builder API, not the API itself: one profile over the
    batch range, the workspace pool limit, the FP16 flag, the progress monitor; the plan is
    renamed into place and loads with the backend."""
    out = tmp_path / "engines" / "model.plan"
    phases: list[str] = []
    report = tensorrt_build.build_engine(tensorrt_build.BuildOptions(onnx, out, fp16=True, opt_batch=4, max_batch=16,
                                                                     workspace_mib=256), phases.append)
    [config] = fake_trt.configs
    assert config.flags == {fake_trt.BuilderFlag.FP16}
    assert config.pools == {fake_trt.MemoryPoolType.WORKSPACE: 256 << 20}
    assert [p.shapes for p in config.profiles] == [{"x": ((1, 4), (4, 4), (16, 4))}]
    assert phases[0] == "building" and phases[-1] == "finishing"  # the monitor saw a phase start and finish
    assert len(phases) > 2
    assert report.bytes == out.stat().st_size and sorted(p.name for p in out.parent.iterdir()) == ["model.plan", "model.plan.build.json"]
    backends.for_path(out).load(out, {}).close()


def test_int8_replays_the_calibration_cache(fake_trt, onnx, tmp_path):
    """Checks our code's use of the builder API, not the API itself: --int8 sets the INT8
    flag and a calibrator that hands TensorRT the cache and no data."""
    cache = tmp_path / "calib.cache"
    cache.write_bytes(b"TRT-calibration")
    tensorrt_build.build_engine(tensorrt_build.BuildOptions(onnx, tmp_path / "m.plan", int8=True, calib_cache=cache))
    [config] = fake_trt.configs
    assert fake_trt.BuilderFlag.INT8 in config.flags
    assert config.int8_calibrator.read_calibration_cache() == b"TRT-calibration"
    assert config.int8_calibrator.get_batch(["x"]) is None
    assert config.calibration_profile is config.profiles[0]


def test_precision_flags_gone_in_tensorrt_11_are_explained(fake_trt, onnx, tmp_path):
    """Checks our code, not the API: where BuilderFlag.FP16 no longer exists (TensorRT 11)
    --fp16 fails with what to do instead."""
    fake_trt.BuilderFlag = type("BuilderFlag", (), {})
    with pytest.raises(tensorrt_build.BuildError, match="removed in 11.*ONNX model"):
        tensorrt_build.build_engine(tensorrt_build.BuildOptions(onnx, tmp_path / "m.plan", fp16=True))


def test_parser_and_builder_failures_are_reported(fake_trt, onnx, tmp_path):
    """Checks our code's use of the builder API, not the API itself: parser errors and a
    build returning None become BuildErrors with TensorRT's reasons, and no file is written."""
    out = tmp_path / "m.plan"
    fake_trt.fail_build = True
    with pytest.raises(tensorrt_build.BuildError, match="no implementation for layer conv1"):
        tensorrt_build.build_engine(tensorrt_build.BuildOptions(onnx, out))
    onnx.write_bytes(b"BAD model")
    with pytest.raises(tensorrt_build.BuildError, match="parser rejected.*unsupported operator"):
        tensorrt_build.build_engine(tensorrt_build.BuildOptions(onnx, out))
    assert list(tmp_path.iterdir()) == [onnx]


def test_run_reports_what_was_built(fake_trt, onnx, tmp_path, capsys):
    """Checks our code, not the API: the summary names the file, batch range and the
    device-specific warning."""
    assert build.main([str(onnx), "-o", str(tmp_path / "m.plan"), "--max-batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "m.plan" in out and "x [1, 4]..[4, 4]" in out and "only on this GPU model" in out



def test_contract_several_profiles_are_built_in_order(fake_trt, onnx: Path, tmp_path: Path):
    """Checks our code's use of the builder API: each `--profile MIN:OPT:MAX`
    becomes one optimization profile over the dynamic batch, in order; INT8 calibrates with the first;
    the ranges are stored for a rebuild; a gap between ranges or a bad range is refused (exit 2)."""
    out = tmp_path / "model.plan"
    args = [str(onnx), "-o", str(out), "--profile", "1:2:8", "--profile", "9:16:32"]
    assert build.main(args) == 0
    config = fake_trt.configs[-1]
    assert [p.shapes["x"] for p in config.profiles] == [((1, 4), (2, 4), (8, 4)), ((9, 4), (16, 4), (32, 4))]
    stored = tensorrt_build.stored_settings(out)
    assert stored["profiles"] == [[1, 2, 8], [9, 16, 32]]
    assert tensorrt_build.BuildOptions.from_settings(onnx, out, stored).batch_range() == (1, 2, 32)
    assert build.main([str(onnx), "-o", str(out), "--profile", "1:2:4", "--profile", "9:16:32"]) == 2
    assert build.main([str(onnx), "-o", str(out), "--profile", "8:2:4"]) == 2
    with pytest.raises(SystemExit):
        build.main([str(onnx), "-o", str(out), "--profile", "1-8"])


def test_contract_device_picks_the_gpu_the_builder_builds_for(fake_trt, fake_gpu, onnx: Path, tmp_path: Path):
    """Checks our code's use of cudaSetDevice: a builder builds for the device current when it is
    made, so `--device 1` (two-GPU stand-in) makes GPU 1 current first; a negative device is refused."""
    fake_gpu.device_count = 2
    assert build.main([str(onnx), "-o", str(tmp_path / "m.plan"), "--device", "1"]) == 0
    assert [(r["device"], r["builder_device"]) for r in fake_trt.builds] == [(1, 1)]
    assert "device" not in tensorrt_build.stored_settings(tmp_path / "m.plan")  # the model's option, not the plan's
    assert build.main([str(onnx), "-o", str(tmp_path / "m.plan"), "--device", "-1"]) == 2
