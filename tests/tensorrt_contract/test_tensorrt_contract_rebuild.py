"""Contract tests: rebuilding a plan that no longer loads, and `--timing-cache`.

They run against the stand-in in fakes_tensorrt.py, whose builder writes plans its runtime accepts
and whose runtime refuses any other file as TensorRT refuses a plan from another version; the ONNX
model beside the plan is real and served by real onnxruntime meanwhile. They check our code's use
of the builder and runtime APIs, not TensorRT itself (tests/gpu/ rebuilds a real plan).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from support.fakes.tensorrt import PLAN_MAGIC
from onnx import TensorProto, helper, numpy_helper

from support import models
from infermux import config as cfg
from infermux.cli import build
from infermux.events import EventLog
from infermux.execution.hooks import FrontendHooks
from infermux.models.registry import Registry
from infermux.plugins import backends
from infermux.plugins.backends import tensorrt_build, tensorrt_rebuild
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
def stale(fake_trt, tmp_path: Path) -> Path:
    """engine_dir/det/1 holding a plan an older TensorRT built, its model.onnx and build settings."""
    folder = tmp_path / "det" / "1"
    same_model_as_onnx(folder / "model.onnx")
    plan = folder / "model.plan"
    plan.write_bytes(b"a plan TensorRT 8.6 built" + bytes(100))
    tensorrt_build.settings_path(plan).write_text(json.dumps({"max_batch": 4, "opt_batch": 2, "fp16": True}))
    (folder / "model.plan.sha256").write_text(hashlib.sha256(plan.read_bytes()).hexdigest() + "  model.plan\n")
    fake_trt.build_gate = threading.Event()
    yield plan
    fake_trt.build_gate.set()
    job = tensorrt_rebuild._rebuilds.pop(plan.resolve(), None)
    if job is not None:
        assert job.done.wait(10)


def test_contract_a_stale_plan_is_served_by_onnxruntime_and_swapped_once_rebuilt(fake_trt, stale: Path):
    """Checks our code's use of the builder and runtime: the plan is refused, onnxruntime serves the
    ONNX model within the stored batch range, the build uses the stored settings and a timing cache
    kept beside the plan, and each context moves to the new plan on its next request."""
    engine = backends.for_path(stale).load(stale, {})
    assert isinstance(engine, tensorrt_rebuild.RebuildingEngine)
    assert engine.inputs[0].max_shape == (4, 4)  # the stored max_batch, before and after the switch
    ctx = engine.create_context()
    assert ctx.infer({"x": X})["total"].tolist() == X.sum(1).tolist()
    assert not fake_trt.engines or all(e() is None for e in fake_trt.engines)  # served without TensorRT
    fake_trt.build_gate.set()
    assert engine.switched.wait(10)
    out = ctx.infer({"x": X})
    assert out["total"].tolist() == X.sum(1).tolist() and out["argmax"].tolist() == [3, 3]
    assert sum(c().executions for c in fake_trt.contexts if c() is not None) >= 1  # now on TensorRT
    assert stale.read_bytes().startswith(PLAN_MAGIC)
    settings = fake_trt.configs[-1]
    assert fake_trt.BuilderFlag.FP16 in settings.flags and settings.profiles[0].shapes["x"][2] == (4, 4)
    assert (stale.parent / "model.plan.timing").read_bytes() == b"t"
    assert json.loads(tensorrt_build.settings_path(stale).read_text())["max_batch"] == 4
    digest = hashlib.sha256(stale.read_bytes()).hexdigest()
    assert (stale.parent / "model.plan.sha256").read_text() == f"{digest}  model.plan\n"  # refreshed
    ctx.close()
    engine.close()


def test_contract_the_registry_reports_the_rebuild_in_events_and_status(fake_trt, stale: Path):
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
        fake_trt.build_gate.set()
        assert mv.engine.switched.wait(10)
        kinds = [e.kind for e in events.recent()]
        assert kinds.index("rebuilding") < kinds.index("rebuilt") and mv.reason == ""
    finally:
        registry.unload(mv, timeout=5)


def test_contract_without_onnxruntime_the_load_waits_for_the_build(fake_trt, stale: Path, monkeypatch):
    """Checks our code: with no onnxruntime to serve meanwhile, load returns the rebuilt plan (the
    version stays loading, so requests get 503 with a retry time); a failed build says why."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setattr(backends, "_cache", {})
    fake_trt.build_gate.set()
    engine = backends.for_path(stale).load(stale, {})
    assert not isinstance(engine, tensorrt_rebuild.RebuildingEngine)
    assert engine.create_context().infer({"x": X})["total"].tolist() == X.sum(1).tolist()
    engine.close()
    stale.write_bytes(b"stale again")
    fake_trt.fail_build = True
    with pytest.raises(BackendError, match="cannot load.*rebuilding .* failed: TensorRT could not build"):
        backends.for_path(stale).load(stale, {})


def test_contract_a_plan_without_an_onnx_source_fails_as_before(fake_trt, tmp_path: Path):
    """Checks our code: no model.onnx beside the plan, no rebuild: the load fails saying how to rebuild."""
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not a plan")
    with pytest.raises(BackendError, match="infermux build"):
        backends.for_path(plan).load(plan, {})
    assert plan.read_bytes() == b"not a plan"


def test_contract_timing_cache_is_read_before_and_written_after_the_build(fake_trt, tmp_path: Path):
    """Checks our code's use of the timing-cache API: `--timing-cache` starts from the saved cache,
    saves the grown one atomically, and a cache from another GPU is refused and replaced."""
    onnx, plan, cache = tmp_path / "model.onnx", tmp_path / "model.plan", tmp_path / "det.timing"
    onnx.write_bytes(b"an ONNX model, as far as the fake parser cares")
    argv = [str(onnx), "-o", str(plan), "--timing-cache", str(cache)]
    opts = build.options_from_args(_parse(argv))
    tensorrt_build.build_engine(opts)
    tensorrt_build.build_engine(opts)
    assert fake_trt.timing_caches_seen == [b"", b"t"] and cache.read_bytes() == b"tt"
    cache.write_bytes(b"OTHERGPU timings")
    tensorrt_build.build_engine(opts)
    assert fake_trt.timing_caches_seen[-1] == b"" and cache.read_bytes() == b"t"
    assert json.loads(tensorrt_build.settings_path(plan).read_text())["timing_cache"] == str(cache)


def _parse(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser()
    build.add_arguments(parser)
    return parser.parse_args(argv)
