"""The onnxruntime backend's `providers` option: names, [name, {options}] pairs, fallbacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend, select_providers
from infermux.plugins.base import BackendError

MLP = Path(__file__).resolve().parents[1] / "engines" / "mlp" / "1" / "model.onnx"
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
