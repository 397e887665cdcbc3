"""The TensorRT backend on a real GPU with real TensorRT.

Engines are built from engines/classifier/1/model.onnx with `infermux build`
(batch 1..8) and compared with onnxruntime on the CPU: atol 1e-3 and rtol
1e-3 for FP32 (TensorRT may use TF32 on Ampere and newer), atol 1e-2 for FP16.
The outputs are softmax probabilities in [0, 1].
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import numpy as np
import pytest
from gpu_support import CLASSIFIER_ONNX, images

from infermux.plugins import backends
from infermux.plugins.backends import cuda
from infermux.plugins.base import BackendError, InputRejected

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def load(path: Path, **options: object):
    return backends.for_path(path).load(path, options)


@pytest.mark.parametrize("precision, atol, rtol", [("fp32", 1e-3, 1e-3), ("fp16", 1e-2, 0)])
def test_outputs_match_onnxruntime(precision, atol, rtol, request, reference):
    engine = load(request.getfixturevalue(f"plan_{precision}"))
    ctx = engine.create_context()
    for batch in (1, 3, 8, 2):
        x = images(batch, seed=batch)
        got = ctx.infer({"images": x})["probs"]
        assert got.shape == (batch, 10) and got.dtype == np.float32
        np.testing.assert_allclose(got, reference(x), atol=atol, rtol=rtol)
    ctx.close()
    engine.close()


def test_outputs_copied_into_a_shared_memory_slot_match(plan_fp32, reference, tmp_path):
    # What a cold worker does (slotoutputs.py): the outputs go from the device straight into
    # views on a /dev/shm slot; shapes that are not the run's are refused before it runs.
    import os

    from infermux.plugins.base import OutputsMismatch
    from infermux.workers.slots import Slot

    engine = load(plan_fp32)
    ctx = engine.create_context()
    slot = Slot.create(f"infermux-gputest-{os.getpid()}", 1 << 20)
    try:
        for batch in (1, 5):
            x = images(batch, seed=batch)
            probs = np.ndarray((batch, 10), np.float32, buffer=slot.mm, offset=4096)
            out = ctx.infer_into({"images": x}, {"probs": probs})
            assert out["probs"] is probs
            np.testing.assert_allclose(probs, reference(x), atol=1e-3, rtol=1e-3)
            del out, probs
        with pytest.raises(OutputsMismatch):
            ctx.infer_into({"images": images(2)}, {"probs": np.zeros((3, 10), np.float32)})
        assert ctx.infer({"images": images(2)})["probs"].shape == (2, 10)
    finally:
        slot.unlink()
        slot.close()
        ctx.close()
        engine.close()


def test_specs_come_from_the_profile(plan_fp32):
    engine = load(plan_fp32)
    [spec] = engine.inputs
    assert (spec.name, spec.dtype, spec.shape) == ("images", "float32", (-1, 3, 64, 64))
    assert (spec.min_shape, spec.max_shape) == ((1, 3, 64, 64), (8, 3, 64, 64))
    [out] = engine.outputs
    assert (out.name, out.min_shape, out.max_shape) == ("probs", (1, 10), (8, 10))
    engine.close()


def test_input_outside_the_profile_is_rejected(plan_fp32):
    engine = load(plan_fp32)
    ctx = engine.create_context()
    with pytest.raises(InputRejected, match=r"\[1, 3, 64, 64\]\.\.\[8, 3, 64, 64\]"):
        ctx.infer({"images": images(9)})
    assert ctx.infer({"images": images(8)})["probs"].shape == (8, 10)
    engine.close()


def test_two_contexts_under_concurrent_load(plan_fp32, reference):
    engine = load(plan_fp32)
    inputs = [images(1 + i % 8, seed=i) for i in range(16)]
    expected = [reference(x) for x in inputs]
    failures: list[str] = []

    def serve(ctx, offset: int) -> None:
        for i in range(200):
            k = (i + offset) % len(inputs)
            got = ctx.infer({"images": inputs[k]})["probs"]
            if not np.allclose(got, expected[k], atol=1e-3, rtol=1e-3):
                failures.append(f"thread {offset} request {i}")

    threads = [threading.Thread(target=serve, args=(engine.create_context(), n)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and failures == []
    engine.close()


def test_memory_is_returned_after_close(plan_fp32):
    load(plan_fp32).close()  # first load in a process pays one-off library and kernel memory
    gc.collect()
    slack = 64 * MiB if cuda.is_integrated() else 16 * MiB
    before = cuda.mem_info().free
    engine = load(plan_fp32)
    contexts = [engine.create_context(), engine.create_context()]
    for ctx in contexts:
        ctx.infer({"images": images(8)})
    assert engine.measured_load_bytes > 0
    assert engine.memory_bytes() >= 2 * engine.context_bytes()
    for ctx in contexts:
        ctx.close()
    engine.close()
    del engine, contexts
    gc.collect()
    assert before - cuda.mem_info().free <= slack


def test_wrong_engine_files_are_rejected_cleanly(plan_fp32, tmp_path):
    plan = plan_fp32.read_bytes()
    bad = {"random.plan": np.random.default_rng(0).bytes(len(plan)),
           "truncated.plan": plan[: len(plan) // 2],
           "onnx.plan": CLASSIFIER_ONNX.read_bytes()}
    for name, data in bad.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(BackendError, match="infermux build"):
            load(path)
    load(plan_fp32).close()  # a good engine still loads afterwards
