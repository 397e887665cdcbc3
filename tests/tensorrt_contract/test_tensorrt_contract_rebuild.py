"""Contract tests: rebuilding a plan that no longer loads, and `--timing-cache`.

They run against the stand-in in fakes_tensorrt.py, whose builder writes plans its runtime accepts
and whose runtime refuses any other file as TensorRT refuses a plan from another version; the ONNX
model beside the plan is real and served by real onnxruntime meanwhile. They check our code's use
of the builder and runtime APIs, not TensorRT itself (tests/gpu/ rebuilds a real plan).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.fakes.tensorrt import PLAN_MAGIC, BuildChild
from support.fakes.tensorrt_builder import TIMING_MAGIC
from onnx import TensorProto, helper, numpy_helper

from support import models
from infermux import config as cfg
from infermux.cli import build
from infermux.events import EventLog
from infermux.execution.hooks import FrontendHooks
from infermux.models.registry import Registry
from infermux.plugins import backends
from infermux.plugins.backends import tensorrt_build, tensorrt_rebuild, trtlib
from infermux.plugins.base import BackendError

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def same_model_as_onnx(path: Path) -> Path:
    """The stand-in engine's model in ONNX: x float32 [N, 4] -> total = x.sum(1), argmax int32."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=0),
             helper.make_node("ArgMax", ["x"], ["idx"], axis=1, keepdims=0),
             helper.make_node("Cast", ["idx"], ["argmax"], to=TensorProto.INT32)]
    return models._save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                        [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["N"]),
                         helper.make_tensor_value_info("argmax", TensorProto.INT32, ["N"])], [axes], path)


@pytest.fixture
def stale(fake_trt, build_child, tmp_path: Path) -> Path:
    """engine_dir/det/1 holding a plan an older TensorRT built, its model.onnx and build settings;
    builds run in a child process (the stand-in there is held until `build_child.release()`)."""
    folder = tmp_path / "det" / "1"
    same_model_as_onnx(folder / "model.onnx")
    plan = folder / "model.plan"
    plan.write_bytes(b"a plan TensorRT 8.6 built" + bytes(100))
    tensorrt_build.settings_path(plan).write_text(json.dumps({"max_batch": 4, "opt_batch": 2, "fp16": True}))
    (folder / "model.plan.sha256").write_text(hashlib.sha256(plan.read_bytes()).hexdigest() + "  model.plan\n")
    build_child.hold()
    yield plan
    build_child.release()
    job = tensorrt_rebuild._rebuilds.pop(plan.resolve(), None)
    if job is not None:
        assert job.done.wait(30)


def builds(fake_trt, build_child) -> list[dict]:
    """What every build was asked, in this process or in a child."""
    return fake_trt.builds + build_child.records()


def test_contract_a_stale_plan_is_served_by_onnxruntime_and_swapped_once_rebuilt(fake_trt, build_child, stale: Path):
    """Checks our code's use of the builder and runtime: the plan is refused, onnxruntime serves the
    ONNX model within the stored batch range while the build runs in a child process with the stored
    settings and a timing cache kept beside the plan, its phases reach the version's progress, and
    each context moves to the new plan on its next request."""
    engine = backends.for_path(stale).load(stale, {})
    assert isinstance(engine, tensorrt_rebuild.RebuildingEngine)
    progress: list[str] = []
    engine.watch(lambda kind, reason: progress.append(reason))
    assert engine.inputs[0].max_shape == (4, 4)  # the stored max_batch, before and after the switch
    ctx = engine.create_context()
    assert build_child.wait_started()
    assert ctx.infer({"x": X})["total"].tolist() == X.sum(1).tolist()  # served while the build is held
    assert not fake_trt.engines or all(e() is None for e in fake_trt.engines)  # served without TensorRT
    build_child.release()
    assert engine.switched.wait(30)
    out = ctx.infer({"x": X})
    assert out["total"].tolist() == X.sum(1).tolist() and out["argmax"].tolist() == [3, 3]
    assert sum(c().executions for c in fake_trt.contexts if c() is not None) >= 1  # now on TensorRT
    assert stale.read_bytes().startswith(PLAN_MAGIC)
    [record] = builds(fake_trt, build_child)
    assert record["pid"] != os.getpid() and "FP16" in record["flags"] and record["profiles"][0][2] == [4, 4]
    assert any("Building engine 1/2" in reason for reason in progress), progress
    assert (stale.parent / "model.plan.timing").read_bytes() == TIMING_MAGIC + b"t"
    assert json.loads(tensorrt_build.settings_path(stale).read_text())["max_batch"] == 4
    digest = hashlib.sha256(stale.read_bytes()).hexdigest()
    assert (stale.parent / "model.plan.sha256").read_text() == f"{digest}  model.plan\n"  # refreshed
    ctx.close()
    engine.close()


def test_contract_a_rebuild_builds_on_the_models_gpu(fake_trt, fake_gpu, build_child, stale: Path, monkeypatch):
    """Checks our code's use of cudaSetDevice: a build is tied to the device current when the builder is
    made, so the rebuild of a model with `device = 1` builds on GPU 1 (two-GPU stand-in), not on the
    GPU 0 a new thread or process starts on, and the plan is loaded there."""
    fake_gpu.device_count = 2
    monkeypatch.setenv("INFERMUX_FAKE_TRT_GPUS", "2")
    build_child.release()
    engine = backends.for_path(stale).load(stale, {"device": 1})
    assert engine.switched.wait(30)
    assert [(r["device"], r["builder_device"]) for r in builds(fake_trt, build_child)] == [(1, 1)]
    assert engine.serving()[1].device == 1 and engine.create_context().infer({"x": X})["argmax"].tolist() == [3, 3]
    engine.close()


def test_contract_a_builder_crash_fails_the_rebuild_not_the_daemon(fake_trt, build_child, stale: Path):
    """Checks our code: the builder crashing in native code (SIGSEGV in the child) fails the rebuild with
    the signal, reported as rebuild_failed, while onnxruntime goes on serving in this process."""
    build_child.crash()
    build_child.release()
    engine = backends.for_path(stale).load(stale, {})
    assert engine.rebuild.done.wait(30)
    assert "crashed (SIGSEGV)" in engine.rebuild.error and engine.rebuild.progress() == engine.rebuild.error
    assert engine.create_context().infer({"x": X})["total"].tolist() == X.sum(1).tolist()
    engine.close()


def test_contract_the_builders_log_traffic_stays_out_of_the_serving_process(fake_trt, build_child, stale: Path,
                                                                           monkeypatch):
    """Checks our code against the binding's logger: TensorRT hands every builder message, VERBOSE
    included, to the Python ILogger from its own threads (a GIL round trip each). A rebuild's messages
    reach the child's logger only: the serving process's logger hears none of them."""
    heard: list[str] = []
    monkeypatch.setattr(trtlib.shared().logger, "log", lambda severity, msg: heard.append(msg))
    build_child.release()
    engine = backends.for_path(stale).load(stale, {})
    assert engine.switched.wait(30)
    assert len(build_child.records()) == 1 and fake_trt.verbose_per_build > 0
    assert not [msg for msg in heard if "timing tactic" in msg]
    engine.close()


def test_contract_the_registry_reports_the_rebuild_in_events_and_status(fake_trt, build_child, stale: Path):
    """Checks our code: the version is ready at once (onnxruntime), its status reason says a rebuild
    runs, and events `rebuilding` then `rebuilt` follow; the reason clears once it is in."""
    root = stale.parents[2]
    (root / "infermux.toml").write_text(f'[daemon]\nengine_dir = "{root}"\nwatch = false\n'
                                        '[[models]]\nname = "det"\nengine = "det/1/model.plan"\nmax_batch = 16\n')
    events = EventLog()
    registry = Registry(cfg.load(root / "infermux.toml"), events, FrontendHooks(lambda *a: None, lambda job: None))
    mv = registry.model("det").versions["1"]
    assert registry.load(mv), mv.reason
    try:
        assert "rebuilding model.plan from model.onnx" in mv.reason
        assert mv.placement.policy.max_batch == 4  # capped at the plan-to-be's batch maximum
        build_child.release()
        assert mv.engine.switched.wait(30)
        kinds = [e.kind for e in events.recent()]
        assert kinds.index("rebuilding") < kinds.index("rebuilt") and mv.reason == ""
    finally:
        registry.unload(mv, timeout=5)


def test_contract_without_onnxruntime_the_load_waits_for_the_build(fake_trt, build_child, stale: Path, monkeypatch):
    """Checks our code: with no onnxruntime to serve meanwhile, load returns the rebuilt plan (the
    version stays loading, so requests get 503 with a retry time); a failed build says why."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setattr(backends, "_cache", {})
    build_child.release()
    engine = backends.for_path(stale).load(stale, {})
    assert not isinstance(engine, tensorrt_rebuild.RebuildingEngine)
    assert engine.create_context().infer({"x": X})["total"].tolist() == X.sum(1).tolist()
    engine.close()
    stale.write_bytes(b"stale again")
    build_child.fail()
    with pytest.raises(BackendError, match="cannot load.*rebuilding .* failed: TensorRT could not build"):
        backends.for_path(stale).load(stale, {})


def test_contract_a_plan_without_an_onnx_source_fails_as_before(fake_trt, tmp_path: Path):
    """Checks our code: no model.onnx beside the plan, no rebuild: the load fails saying how to rebuild."""
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not a plan")
    with pytest.raises(BackendError, match="infermux build"):
        backends.for_path(plan).load(plan, {})
    assert plan.read_bytes() == b"not a plan"


def test_contract_timing_cache_is_read_before_and_written_after_the_build(fake_trt, tmp_path: Path, caplog):
    """Checks our code's use of the timing-cache API: `--timing-cache` starts from the saved cache and
    saves the grown one atomically; a cache from another GPU (set_timing_cache refuses it) and one
    TensorRT cannot read at all (create_timing_cache gives None: another version's, or damaged) are
    each replaced by a new cache, said in one warning, and the build goes on."""
    onnx, plan, cache = tmp_path / "model.onnx", tmp_path / "model.plan", tmp_path / "det.timing"
    onnx.write_bytes(b"an ONNX model, as far as the fake parser cares")
    argv = [str(onnx), "-o", str(plan), "--timing-cache", str(cache)]
    opts = build.options_from_args(_parse(argv))
    tensorrt_build.build_engine(opts)
    tensorrt_build.build_engine(opts)
    assert fake_trt.timing_caches_seen == [b"", b"t"] and cache.read_bytes() == TIMING_MAGIC + b"tt"
    for stale in (TIMING_MAGIC + b"OTHERGPU timings", b"a timing cache TensorRT 8.6 wrote", b"\0" * 7):
        cache.write_bytes(stale)
        caplog.clear()
        tensorrt_build.build_engine(opts)
        assert fake_trt.timing_caches_seen[-1] == b"" and cache.read_bytes() == TIMING_MAGIC + b"t"
        [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert warning.name == "infermux.build" and "starting a new one" in warning.getMessage()
    assert json.loads(tensorrt_build.settings_path(plan).read_text())["timing_cache"] == str(cache)


def test_contract_infermux_build_replaces_a_foreign_timing_cache_in_one_line(fake_trt, tmp_path: Path, capsys):
    """`infermux build --timing-cache` with a cache from another TensorRT version (create_timing_cache
    gives None): one line on stderr says a new one starts, no traceback, exit 0, and the file now holds
    the new cache."""
    onnx, cache = tmp_path / "model.onnx", tmp_path / "det.timing"
    onnx.write_bytes(b"an ONNX model, as far as the fake parser cares")
    cache.write_bytes(b"a timing cache TensorRT 8.6 wrote")
    assert build.main([str(onnx), "-o", str(tmp_path / "model.plan"), "--timing-cache", str(cache)]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "timing cache" in line] == [
        f"infermux build: warning: timing cache {cache} cannot be read by TensorRT 10.3.0 (fake: the serialized "
        f"timing cache is corrupt or from another TensorRT version): starting a new one, saved in its place"]
    assert "Traceback" not in err and cache.read_bytes() == TIMING_MAGIC + b"t"


def test_contract_the_infermux_build_command_says_one_line_about_a_foreign_timing_cache(tmp_path: Path):
    """`infermux build` run as an operator runs it (its own process, the stand-in for TensorRT): with a
    timing cache another TensorRT version wrote, stderr has the start line and one warning, and no
    traceback or TensorRT error line; the plan is built and the cache replaced."""
    onnx, cache, plan = tmp_path / "model.onnx", tmp_path / "det.timing", tmp_path / "model.plan"
    onnx.write_bytes(b"an ONNX model, as far as the fake parser cares")
    cache.write_bytes(b"a timing cache TensorRT 8.6 wrote")
    env = {**os.environ, **BuildChild(tmp_path / "state").env()}
    done = subprocess.run([sys.executable, "-m", "infermux.cli.build", str(onnx), "-o", str(plan),
                           "--timing-cache", str(cache)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("building ") and "starting a new one" in lines[1], lines
    assert cache.read_bytes() == TIMING_MAGIC + b"t" and plan.read_bytes().startswith(PLAN_MAGIC)


def _parse(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser()
    build.add_arguments(parser)
    return parser.parse_args(argv)
