"""Outputs computed straight into a request's slot: learning shapes, placing arrays, falling back."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend
from infermux.plugins.base import OutputsMismatch, WritesOutputs
from infermux.execution.executor import BatchPolicy, Executor
from infermux.execution.job import Job
from infermux.protocol import OutputRegion, Request
from infermux.workers.slots import ALIGN, Slot
from infermux.execution.outputs import PLACE_MIN_BYTES, ShapeMemory
from infermux.workers.slotoutputs import SlotOutputs

_names = itertools.count()


@pytest.fixture
def slot():
    s = Slot.create(f"infermux-test-{os.getpid()}-out{next(_names)}", 1 << 20)
    yield s
    s.unlink()
    s.close()


def kind(shape: list[int], outputs: list[str] | None = None):
    return ShapeMemory.kind([["x", "float32", shape]], outputs)


def test_nothing_is_placed_until_a_reply_of_that_kind_taught_the_shapes(slot) -> None:
    memory = ShapeMemory()
    placement = SlotOutputs(slot, 1000, kind([2, 4]), memory)
    assert placement.arrays() is None
    memory.learn(kind([2, 4]), [{"name": "y", "dtype": "float32", "shape": [2, 4]}])
    assert SlotOutputs(slot, 1000, kind([3, 4]), memory).arrays() is None  # another kind: unknown
    arrays = placement.arrays()
    assert arrays is not None and arrays["y"].shape == (2, 4) and arrays["y"].dtype == np.float32


def test_outputs_go_after_the_inputs_aligned_and_say_where_they_are(slot) -> None:
    memory = ShapeMemory()
    memory.learn(kind([8]), [{"name": "a", "dtype": "float32", "shape": [8]},
                             {"name": "b", "dtype": "int64", "shape": [3]}])
    placement = SlotOutputs(slot, 1000, kind([8]), memory)
    arrays = placement.arrays()
    arrays["a"][:] = np.arange(8)
    arrays["b"][:] = [7, 8, 9]
    where = placement.where([{"name": "a"}, {"name": "b"}])
    assert where[0][0] >= 1000 and where[0][0] % ALIGN == 0 and where[1][0] % ALIGN == 0
    (a_at, a_n), (b_at, b_n) = where
    assert (a_n, b_n) == (32, 24)
    assert np.array_equal(np.frombuffer(slot.view[a_at:a_at + a_n], np.float32), np.arange(8))
    assert np.array_equal(np.frombuffer(slot.view[b_at:b_at + b_n], np.int64), [7, 8, 9])
    assert placement.where([{"name": "b"}]) == [[b_at, b_n]]  # an outputs filter keeps the places
    assert placement.where([{"name": "c"}]) is None


def test_outputs_that_do_not_fit_after_the_inputs_are_not_placed(slot) -> None:
    memory = ShapeMemory()
    memory.learn(kind([1]), [{"name": "y", "dtype": "uint8", "shape": [4096]}])
    assert SlotOutputs(slot, slot.size - 4095, kind([1]), memory).arrays() is None  # aligned up: 64 short
    assert SlotOutputs(slot, slot.size - 4096, kind([1]), memory).arrays() is not None  # just fits


def test_a_kind_whose_outputs_varied_is_never_placed_again(slot) -> None:
    memory = ShapeMemory()
    memory.learn(kind([4]), [{"name": "y", "dtype": "int64", "shape": [2, 5]}])
    placement = SlotOutputs(slot, 0, kind([4]), memory)
    assert placement.arrays() is not None
    placement.mismatch()
    assert placement.where([{"name": "y"}]) is None  # what the backend refused was not computed there
    memory.learn(kind([4]), [{"name": "y", "dtype": "int64", "shape": [2, 6]}])  # no second chance
    assert SlotOutputs(slot, 0, kind([4]), memory).arrays() is None


def test_the_memory_of_kinds_is_bounded() -> None:
    memory = ShapeMemory()
    for n in range(1000):
        memory.learn(kind([n]), [{"name": "y", "dtype": "float32", "shape": [n]}])
    assert len(memory._known) <= 256


def test_onnxruntime_computes_into_the_slot_and_refuses_shapes_that_are_not_the_runs(slot, engines: Path) -> None:
    engine = OnnxRuntimeBackend().load(engines / "fast512/1/model.onnx", {})
    context = engine.create_context()
    assert isinstance(context, WritesOutputs)
    x = np.random.default_rng(1).random((4, 512), dtype=np.float32)
    memory = ShapeMemory()
    memory.learn(kind([4, 512]), [{"name": "y", "dtype": "float32", "shape": [4, 512]}])
    placement = SlotOutputs(slot, 0, kind([4, 512]), memory)
    arrays = placement.arrays()
    outputs = context.infer_into({"x": x}, arrays)
    assert outputs["y"] is arrays["y"] and np.shares_memory(outputs["y"], np.frombuffer(slot.mm, np.uint8))
    np.testing.assert_array_equal(outputs["y"], context.infer({"x": x})["y"])
    wrong = {"y": np.ndarray((3, 512), np.float32, buffer=slot.mm, offset=0)}
    with pytest.raises(OutputsMismatch):
        context.infer_into({"x": x}, wrong)
    np.testing.assert_array_equal(context.infer({"x": x})["y"], x)  # the context still serves
    context.close()
    engine.close()


class Spy:
    """A real onnxruntime context that notes which way each request was computed."""

    def __init__(self, context) -> None:
        self.context, self.calls = context, []

    def infer(self, inputs):
        self.calls.append("infer")
        return self.context.infer(inputs)

    def infer_into(self, inputs, outputs):
        self.calls.append("into")
        return self.context.infer_into(inputs, outputs)


def run_with_output_region(engines: Path, rows: int) -> list[str]:
    """Three requests of `rows` rows through an executor, outputs asked into a region; how each ran."""
    engine = OnnxRuntimeBackend().load(engines / "fast512/1/model.onnx", {})
    spy = Spy(engine.create_context())
    replies = []
    executor = Executor("m", "1", 0, spy, lambda envelope, frames, outcome=None: replies.append(frames),
                        lambda job: None,
                        BatchPolicy(1, 0, (), False))
    region = bytearray(1 << 20)
    y = np.frombuffer(region, np.float32, count=rows * 512, offset=4096).reshape(rows, 512)
    for k in range(3):
        x = np.full((rows, 512), k, np.float32)
        request = Request("m", {"x": x}, output_regions={"y": OutputRegion("r1", 4096, memoryview(region)[4096:])})
        assert executor.compute(Job([b"c"], request, [], time.perf_counter_ns(), time.perf_counter_ns() + 10**9))
        np.testing.assert_array_equal(y, x)  # the identity's output, in the region either way
        assert "region" in json.loads(replies[-1][0])["outputs"][0] and len(replies[-1]) == 1
    engine.close()
    return spy.calls


def test_an_executor_computes_into_the_clients_region_once_it_knows_the_shapes(engines: Path) -> None:
    # 128 KB of output: the first run teaches the shape, the next ones write the region directly.
    assert run_with_output_region(engines, 64) == ["infer", "into", "into"]


def test_small_outputs_are_copied_into_the_region_rather_than_bound(engines: Path) -> None:
    # 8 KB: an IOBinding would cost more than the copy it saves (PLACE_MIN_BYTES).
    assert 4 * 512 * 4 < PLACE_MIN_BYTES
    assert run_with_output_region(engines, 4) == ["infer", "infer", "infer"]
