"""A pipeline's memory of refused frames: keyed by what decides a refusal, bounded in size and age,
and hashing only the frames it might hold."""

from __future__ import annotations

import numpy as np
import pytest

from infermux.pipelines import refusals
from infermux.pipelines.refusals import FrameKind, Refusals
from infermux.plugins.processors.base import Sample
from support.clock import Clock


def _frame(data: bytes, fmt: str = "png", key: str | None = None,
           wanted: tuple[str, ...] = ()) -> tuple[Sample, FrameKind]:
    sample = Sample(data=np.frombuffer(data, np.uint8), format=fmt, key=key)
    return sample, FrameKind.of(sample, wanted)


def test_a_remembered_refusal_is_recalled_for_the_same_bytes_and_description_only() -> None:
    memory = Refusals()
    memory.remember(*_frame(b"frame"), 413, "too many regions")
    recalled = memory.recall(*_frame(b"frame"))
    assert recalled is not None and (recalled.status, recalled.message) == (413, "too many regions")
    for other in (_frame(b"framE"), _frame(b"frame", fmt="jpeg"), _frame(b"frame", key="cam1"),
                  _frame(b"frame", wanted=("det.out",))):
        assert memory.recall(*other) is None
    assert memory.recalled == 1


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The frames the memory hashes, in order."""
    frames: list[bytes] = []
    real = refusals.digest

    def counted(sample: Sample) -> bytes:
        frames.append(sample.data.tobytes() if sample.data is not None else b"")
        return real(sample)
    monkeypatch.setattr(refusals, "digest", counted)
    return frames


def test_only_a_frame_of_a_remembered_size_and_description_is_hashed(hashed: list[bytes]) -> None:
    memory = Refusals()
    assert memory.recall(*_frame(b"frame")) is None and hashed == []  # nothing remembered: no hash
    memory.remember(*_frame(b"frame"), 400, "undecodable")
    hashed.clear()
    for other in (_frame(b"longer frame"), _frame(b"frame", fmt="jpeg"), _frame(b"frame", key="cam1")):
        assert memory.recall(*other) is None
    assert hashed == []
    assert memory.recall(*_frame(b"framE")) is None and hashed == [b"framE"]  # same size: hashed


def test_a_refusal_is_forgotten_after_its_time(hashed: list[bytes]) -> None:
    clock = Clock()
    memory = Refusals(remember_s=60, clock=clock)
    memory.remember(*_frame(b"frame"), 400, "undecodable")
    clock.now += 59
    assert memory.recall(*_frame(b"frame")) is not None
    clock.now += 2
    hashed.clear()
    assert memory.recall(*_frame(b"framE")) is None and hashed == []  # forgotten: no hash
    assert memory.recall(*_frame(b"frame")) is None and len(memory) == 0


def test_a_recalled_refusal_says_when_it_was_made_and_how_long_it_still_holds() -> None:
    clock = Clock()
    memory = Refusals(remember_s=60, clock=clock)
    memory.remember(*_frame(b"frame"), 400, "undecodable")
    clock.now += 12.4
    recalled = memory.recall(*_frame(b"frame"))
    assert recalled is not None
    assert memory.reminder(recalled) == ("(this frame was refused 12 s ago and is not computed again "
                                         "for another 48 s: send a different frame)")
    clock.now += 47.9  # a fraction of a second left still reads as one
    assert memory.reminder(recalled).endswith("for another 1 s: send a different frame)")


def test_the_oldest_refusal_goes_when_the_memory_is_full() -> None:
    memory = Refusals(capacity=2)
    for data in (b"a", b"b", b"c"):
        memory.remember(*_frame(data), 413, data.decode())
    assert memory.recall(*_frame(b"a")) is None
    assert [memory.recall(*_frame(d)) is not None for d in (b"b", b"c")] == [True, True]


def test_a_raw_frame_is_keyed_by_its_declared_geometry() -> None:
    pixels = np.zeros(64, np.uint8)
    one = Sample(data=pixels, format="gray", width=8, height=8)
    other = Sample(data=pixels, format="gray", width=4, height=16)
    memory = Refusals()
    memory.remember(one, FrameKind.of(one, ()), 400, "8x8")
    assert memory.recall(other, FrameKind.of(other, ())) is None
    assert memory.recall(one, FrameKind.of(one, ())) is not None
