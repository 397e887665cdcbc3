"""A pipeline's memory of refused frames: keyed by what decides a refusal, bounded in size and age."""

from __future__ import annotations

import numpy as np

from infermux.pipelines.refusals import FrameKind, Refusals
from infermux.plugins.processors.base import Sample


def _kind(data: bytes, fmt: str = "png", key: str | None = None, wanted: tuple[str, ...] = ()) -> FrameKind:
    return FrameKind.of(Sample(data=np.frombuffer(data, np.uint8), format=fmt, key=key), wanted)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_remembered_refusal_is_recalled_for_the_same_bytes_and_description_only() -> None:
    memory = Refusals()
    memory.remember(_kind(b"frame"), 413, "too many regions")
    recalled = memory.recall(_kind(b"frame"))
    assert recalled is not None and (recalled.status, recalled.message) == (413, "too many regions")
    for other in (_kind(b"framE"), _kind(b"frame", fmt="jpeg"), _kind(b"frame", key="cam1"),
                  _kind(b"frame", wanted=("det.out",))):
        assert memory.recall(other) is None
    assert memory.recalled == 1


def test_a_refusal_is_forgotten_after_its_time() -> None:
    clock = Clock()
    memory = Refusals(remember_s=60, clock=clock)
    memory.remember(_kind(b"frame"), 400, "undecodable")
    clock.now += 59
    assert memory.recall(_kind(b"frame")) is not None
    clock.now += 2
    assert memory.recall(_kind(b"frame")) is None and len(memory) == 0


def test_the_oldest_refusal_goes_when_the_memory_is_full() -> None:
    memory = Refusals(capacity=2)
    for data in (b"a", b"b", b"c"):
        memory.remember(_kind(data), 413, data.decode())
    assert memory.recall(_kind(b"a")) is None
    assert [memory.recall(_kind(d)) is not None for d in (b"b", b"c")] == [True, True]


def test_a_raw_frame_with_a_stride_is_keyed_by_its_declared_geometry() -> None:
    pixels = np.zeros(64, np.uint8)
    one = FrameKind.of(Sample(data=pixels, format="gray", width=8, height=8), ())
    other = FrameKind.of(Sample(data=pixels, format="gray", width=4, height=16), ())
    assert one != other and one.digest == other.digest
