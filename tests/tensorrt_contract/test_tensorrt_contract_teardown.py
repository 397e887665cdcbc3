"""Contract tests: device, stream, logging and warm-up details of the TensorRT backend.

They run against the stand-in in fakes_tensorrt.py and check our code's use of the TensorRT and
cuda-python APIs, not the APIs themselves (tests/gpu/run.sh proves those on a GPU).
"""

from __future__ import annotations

import logging
import threading
import warnings

import numpy as np
import pytest
from support.fakes.tensorrt import PROFILE, write_plan

from infermux.plugins import backends
from infermux.plugins.backends import trtlib

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures


def load(path, **options):
    return backends.for_path(path).load(path, options)


def test_contract_teardown_on_another_thread_makes_the_engines_device_current(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of cudaSetDevice, not the API: closing contexts and the engine of a
    model on GPU 1 from a thread whose current device is 0 (the unloader) frees every buffer,
    stream and TensorRT object with device 1 current, so no context is created on GPU 0."""
    fake_gpu.device_count = 2
    engine = load(write_plan(tmp_path), device=1)
    engine.create_context().infer({"x": np.ones((2, 4), np.float32)})
    engine.create_context()
    closer = threading.Thread(target=engine.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive()
    assert not fake_gpu.device and not fake_gpu.streams
    assert fake_gpu.wrong_device == []


def test_contract_the_shared_runtime_is_created_on_the_models_device(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of cudaSetDevice, not the API: the first model, on GPU 1, makes its
    device current before the process-wide runtime is created, so GPU 0 is never initialised."""
    fake_gpu.device_count = 2
    load(write_plan(tmp_path), device=1).close()
    assert trtlib.shared().runtime.device == 1


def test_contract_stream_handles_come_from_the_native_handle_accessor(fake_trt, fake_gpu, tmp_path):
    """Checks our code's use of cuda-bindings, not the API: the int handle TensorRT takes is read
    with get_cuda_native_handle, not the deprecated int(cudaStream_t)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        engine = load(write_plan(tmp_path))
        out = engine.create_context().infer({"x": np.ones((3, 4), np.float32)})
    assert list(out["total"]) == [4.0, 4.0, 4.0]
    engine.close()


class CountingLog:
    """Stands in for trtlib's `logging.Logger`: counts the records it is asked to make."""

    def __init__(self, debug: bool) -> None:
        self.calls: list[int] = []
        self._debug = debug

    def isEnabledFor(self, level: int) -> bool:
        return self._debug or level >= logging.INFO

    def log(self, level: int, msg: str, *args: object) -> None:
        self.calls.append(level)


@pytest.mark.parametrize("debug", [False, True])
def test_contract_verbose_messages_stop_at_the_severity_check(fake_trt, tmp_path, monkeypatch, debug):
    """Checks our code's use of the ILogger API, not the API: the VERBOSE messages TensorRT logs
    while deserializing never reach `logging` unless it logs at DEBUG; errors always do."""
    spy = CountingLog(debug)
    monkeypatch.setattr(trtlib, "log", spy)
    fake_trt.verbose_per_load = 200
    load(write_plan(tmp_path)).close()
    assert len(spy.calls) == (200 if debug else 0)
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"not a plan")
    with pytest.raises(Exception, match="not compatible"):
        load(bad)
    assert spy.calls[-1] == logging.ERROR


def test_contract_load_warms_the_opt_and_max_shapes(fake_trt, tmp_path):
    """Checks our code's use of the profile API, not the API: before the registry's own warm-up
    (the smallest shape), the load runs profile 0's opt and max shapes once, so the first large
    batch does not pay for kernels loaded lazily."""
    engine = load(write_plan(tmp_path))
    raw = fake_trt.contexts[-1]()
    _low, opt, high = PROFILE
    assert opt in raw.shape_calls and high in raw.shape_calls and raw.executions == 2
    engine.close()
