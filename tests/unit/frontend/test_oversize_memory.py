"""The frontend's memory of requests whose reply was over max_reply_bytes (frontend/oversize.py)."""

from __future__ import annotations

import numpy as np

from infermux.frontend.oversize import ClientEnvelope, OversizeMemory
from infermux.protocol import Request
from support.clock import Clock


def _kind(identity: bytes = b"peer", rows: int = 4, outputs: tuple[str, ...] | None = None):
    envelope = ClientEnvelope([identity, b""])
    envelope.came_with(Request("tile", {"x": np.zeros((rows, 8), np.float32)}, id=1, outputs=outputs))
    return envelope.kind()


def test_a_kind_is_its_connection_model_version_input_shapes_and_outputs_named() -> None:
    assert _kind() == _kind()
    assert len({_kind(), _kind(b"other"), _kind(rows=5), _kind(outputs=("y",))}) == 4
    fresh = ClientEnvelope([b"peer", b""])
    fresh.came_with(Request("tile", {"x": np.zeros((4, 8), np.float32)}))
    assert fresh.kind() == _kind()  # ids differ, values differ: the same kind


def test_a_kind_is_refused_for_the_time_then_one_request_is_let_through_until_its_reply() -> None:
    clock = Clock()
    memory = OversizeMemory(1.0, clock=clock)
    kind = _kind()
    assert memory.refusal(kind) is None and not memory  # never over: computed
    memory.over(kind, 5000)
    assert memory.refusal(kind) == 5000 and memory.refusal(_kind(b"other")) is None
    clock.now += 1.01
    assert memory.refusal(kind) is None and memory.probing(kind)  # the probe
    assert memory.refusal(kind) == 5000  # while the probe is out, the others wait
    memory.fits(kind)
    assert memory.refusal(kind) is None and not memory.probing(kind)
    assert memory.refused == 2


def test_a_probe_that_never_answers_lets_another_through_after_the_time() -> None:
    clock = Clock()
    memory = OversizeMemory(1.0, clock=clock)
    kind = _kind()
    memory.over(kind, 5000)
    clock.now += 1.01
    assert memory.refusal(kind) is None  # a probe, whose reply never comes (its client went away)
    clock.now += 1.01
    assert memory.refusal(kind) is None


def test_the_memory_is_bounded_and_empties_once_nothing_is_over() -> None:
    clock = Clock()
    memory = OversizeMemory(1.0, max_kinds=8, clock=clock)
    for rows in range(100):  # a client varying its shapes
        memory.over(_kind(rows=rows), 5000)
    assert len(memory) == 8 and memory.refusal(_kind(rows=99)) == 5000 and memory.refusal(_kind(rows=0)) is None
    clock.now += 2.01
    assert memory.refusal(_kind(rows=1000)) is None and len(memory) == 0


def test_turned_off_it_remembers_nothing() -> None:
    memory = OversizeMemory(0.0)
    memory.over(_kind(), 5000)
    assert memory.refusal(_kind()) is None and len(memory) == 0
