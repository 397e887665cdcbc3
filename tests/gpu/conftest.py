"""Fixtures for tests/gpu/: real GPU, real CUDA, real TensorRT where present.

Every test here skips cleanly, with the reason, on a machine without an
NVIDIA GPU or without a CUDA binding for Python; the TensorRT tests also
skip where `tensorrt` is not installed. A GPU that is present but fails is
an error, not a skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from gpu_support import CLASSIFIER_ONNX, build_plan, gpu_missing


@pytest.fixture(scope="session", autouse=True)
def _needs_gpu() -> None:
    # Session scope: it runs before the session fixtures below, so the GPU reason wins.
    reason = gpu_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def trt(_needs_gpu: None) -> Any:
    """The real `tensorrt` module (skips where it is not installed)."""
    return pytest.importorskip("tensorrt", reason="TensorRT is not installed for this Python")


@pytest.fixture(scope="session")
def plan_fp32(trt: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_plan(tmp_path_factory.mktemp("fp32") / "model.plan")


@pytest.fixture(scope="session")
def plan_fp16(trt: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_plan(tmp_path_factory.mktemp("fp16") / "model.plan", "--fp16")


@pytest.fixture(scope="session")
def reference() -> Callable[[np.ndarray], np.ndarray]:
    """The classifier's probabilities from onnxruntime on the CPU."""
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(CLASSIFIER_ONNX), providers=["CPUExecutionProvider"])
    return lambda images: session.run(["probs"], {"images": images})[0]

