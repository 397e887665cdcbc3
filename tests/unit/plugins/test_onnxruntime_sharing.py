"""The onnxruntime backend holds a version's weights once: its contexts share one session on the
CPU, and the engine's memory figure counts the weights once and the activations per context."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend
from infermux.plugins.base import BackendError

MLP = Path(__file__).resolve().parents[3] / "engines" / "mlp" / "1" / "model.onnx"
WEIGHTS = MLP.stat().st_size
ACTIVATIONS = 256 * 4 + 10 * 4  # one row of `features` in, one of `logits` out


def test_cpu_contexts_share_one_session_and_count_the_weights_once():
    engine = OnnxRuntimeBackend().load(MLP, {})
    contexts = [engine.create_context() for _ in range(4)]
    assert len({id(c._session) for c in contexts}) == 1
    assert engine.memory_bytes() == WEIGHTS + 4 * ACTIVATIONS
    contexts.pop().close()
    assert engine.memory_bytes() == WEIGHTS + 3 * ACTIVATIONS


def test_a_session_per_context_when_asked_counts_the_weights_per_context():
    engine = OnnxRuntimeBackend().load(MLP, {"share_session": False})
    contexts = [engine.create_context() for _ in range(3)]
    assert len({id(c._session) for c in contexts}) == 3
    assert engine.memory_bytes() == 3 * (WEIGHTS + ACTIVATIONS)
    contexts.pop().close()
    assert engine.memory_bytes() == 2 * (WEIGHTS + ACTIVATIONS)


def test_share_session_must_be_a_boolean():
    with pytest.raises(BackendError, match="share_session"):
        OnnxRuntimeBackend().load(MLP, {"share_session": "yes"})


def test_contexts_of_one_session_compute_their_own_answers_side_by_side():
    engine = OnnxRuntimeBackend().load(MLP, {})
    alone = engine.create_context()
    rows = [np.full((2, 256), i / 10, np.float32) for i in range(4)]
    expected = [alone.infer({"features": x})["logits"] for x in rows]
    wrong: list[int] = []
    start = threading.Barrier(4)

    def work(i: int) -> None:
        context = engine.create_context()
        start.wait()
        for _ in range(200):
            if not np.array_equal(context.infer({"features": rows[i]})["logits"], expected[i]):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
