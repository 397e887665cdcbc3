"""The onnxruntime backend's options: `providers` (names, [name, {options}] pairs, fallbacks),
threads per context and spinning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend, direct_run, select_providers
from infermux.plugins.base import BackendError, InputRejected

MLP = Path(__file__).resolve().parents[3] / "engines" / "mlp" / "1" / "model.onnx"
GPU_FIRST = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_names_and_pairs_keep_order_and_options():
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    requested = [["CUDAExecutionProvider", {"device_id": 0}], "TensorrtExecutionProvider", "CPUExecutionProvider"]
    assert select_providers(requested, available) == [("CUDAExecutionProvider", {"device_id": 0}),
                                                      "CPUExecutionProvider"]


@pytest.mark.parametrize("bad", ["CPUExecutionProvider", [["CPUExecutionProvider"]], [42],
                                 [["CPUExecutionProvider", "not a table"]]])
def test_malformed_providers_are_refused(bad):
    with pytest.raises(BackendError, match="providers"):
        select_providers(bad, ["CPUExecutionProvider"])


def test_none_available_is_a_load_error():
    with pytest.raises(BackendError, match="none of the execution providers"):
        select_providers(["TensorrtExecutionProvider"], ["CPUExecutionProvider"])


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="this onnxruntime has GPU providers; the CPU fallback is not what loads")
def test_gpu_first_list_falls_back_to_cpu_and_serves():
    engine = OnnxRuntimeBackend().load(MLP, {"providers": [*GPU_FIRST[:2], ["CPUExecutionProvider", {}]]})
    assert engine.providers == ["CPUExecutionProvider"]
    out = engine.create_context().infer({"features": np.ones((2, 256), np.float32)})
    assert out["logits"].shape == (2, 10)


@pytest.mark.parametrize("options, threads, spinning", [
    ({}, 1, None),  # None: onnxruntime's own default (spinning on)
    ({"intra_op_num_threads": 2, "allow_spinning": False}, 2, "0"),
])
def test_thread_options_reach_every_contexts_session(options, threads, spinning):
    engine = OnnxRuntimeBackend().load(MLP, options)
    for context in (engine.create_context(), engine.create_context()):
        session_options = context._session.get_session_options()
        assert session_options.intra_op_num_threads == threads
        if spinning is None:
            with pytest.raises(RuntimeError, match="allow_spinning"):
                session_options.get_session_config_entry("session.intra_op.allow_spinning")
        else:
            assert session_options.get_session_config_entry("session.intra_op.allow_spinning") == spinning
        out = context.infer({"features": np.ones((2, 256), np.float32)})
        assert next(iter(out.values())).shape[0] == 2


def test_allow_spinning_that_is_not_a_boolean_is_a_load_error():
    with pytest.raises(BackendError, match="`allow_spinning` is true or false, got 'no'"):
        OnnxRuntimeBackend().load(MLP, {"allow_spinning": "no"})


def test_a_cpu_context_calls_the_binding_and_answers_as_the_session_does():
    engine = OnnxRuntimeBackend().load(MLP, {})
    context = engine.create_context()
    assert context._run == context._session._sess.run  # this onnxruntime still has the binding there
    features = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    expected = context._session.run(None, {"features": features})[0]
    assert np.array_equal(context.infer({"features": features})["logits"], expected)


def test_a_bad_input_through_the_binding_is_still_a_rejected_input():
    context = OnnxRuntimeBackend().load(MLP, {}).create_context()
    with pytest.raises(InputRejected, match="features"):
        context.infer({"features": np.ones((2, 7), np.float32)})


def test_only_the_cpu_provider_alone_skips_the_wrapper():
    session = ort.InferenceSession(str(MLP), providers=["CPUExecutionProvider"])
    assert direct_run(session, ["CPUExecutionProvider"])
    assert not direct_run(session, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert not direct_run(object(), ["CPUExecutionProvider"])  # a wrapper without the binding: its own run
