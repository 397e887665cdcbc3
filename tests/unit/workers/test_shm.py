"""Shared-memory slots: reuse, bounds, growth, trimming and cleanup on every path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zmq

from infermux.workers import slots as shm


def names_on_disk(tag: str) -> list[str]:
    return sorted(p.name for p in shm.SHM_DIR.iterdir() if p.name.startswith(tag + "-"))


def pool(max_slots: int = 3, dropped: list | None = None) -> shm.SlotPool:
    tag = shm.segment_name(os.getpid(), 900 + max_slots)
    return shm.SlotPool(tag, max_slots, on_drop=(dropped.append if dropped is not None else None))


def test_slots_are_reused_bounded_and_all_unlinked_on_close() -> None:
    p = pool(max_slots=2)
    a = p.acquire(1000)
    p.release(a)
    assert p.acquire(500) is a  # a free slot that fits is reused, not a new file
    b = p.acquire(1000)
    assert b is not a and p.acquire(10) is None  # both busy: bounded
    assert names_on_disk(p.tag) == sorted([a.name, b.name])
    p.release(b)
    p.close()
    assert names_on_disk(p.tag) == []


def test_a_too_small_free_slot_is_replaced_by_a_bigger_one_and_the_worker_told() -> None:
    dropped: list[str] = []
    p = pool(max_slots=1, dropped=dropped)
    small = p.acquire(10)
    p.release(small)
    big = p.acquire(5 << 20)
    assert big.size >= 5 << 20 and dropped == [small.name]
    assert names_on_disk(p.tag) == [big.name]
    p.close()


def test_trim_keeps_the_most_recent_slots_and_unlinks_idle_ones() -> None:
    p = pool(max_slots=4)
    slots = [p.acquire(100) for _ in range(4)]
    for slot in slots:
        p.release(slot)
    assert p.trim(idle_s=0.0, keep=1) == 3
    assert names_on_disk(p.tag) == [slots[-1].name]
    p.close()


def test_the_worker_sees_what_the_daemon_wrote_and_writes_back() -> None:
    p = pool()
    slot = p.acquire(4096)
    x = np.arange(1024, dtype=np.float32)
    slot.view[:x.nbytes] = memoryview(x).cast("B")
    cache = shm.SlotCache()
    mapped = cache.get(slot.name)
    np.testing.assert_array_equal(np.frombuffer(mapped.view[:x.nbytes], np.float32), x)
    mapped.view[:4] = b"\x01\x02\x03\x04"
    assert bytes(slot.view[:4]) == b"\x01\x02\x03\x04"
    cache.forget(slot.name)
    p.close()


def test_a_slot_zmq_still_sends_from_is_reused_only_once_zmq_is_done() -> None:
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    p = pool(max_slots=2)
    try:
        tx.bind("inproc://slot-test")
        rx.connect("inproc://slot-test")
        slot = p.acquire(1 << 20)
        frame = zmq.Frame(slot.view[: 1 << 20], copy=False, track=True)
        tracker = frame.tracker
        tx.send(frame, copy=False)
        p.release(slot, tracker)
        other = p.acquire(1 << 20)
        assert not tracker.done and other is not slot  # zmq may still read the first one
        assert p.acquire(1 << 20) is None  # and it still counts against the bound
        p.release(other)
        del frame
        rx.recv()  # consumed: zmq lets go of the buffer (on pyzmq's own thread)
        tracker.wait(5)
        assert {p.acquire(1 << 20), p.acquire(1 << 20)} == {slot, other}
    finally:
        p.close()
        tx.close(0)
        rx.close(0)
        ctx.term()
    assert names_on_disk(p.tag) == []


@pytest.mark.timing
def test_sweep_removes_the_segments_of_dead_daemons_only(tmp_path: Path) -> None:
    # A directory of its own: in /dev/shm any daemon starting on the box meanwhile
    # (another test run) may sweep the stale segment first.
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout)
    stale = tmp_path / f"{shm.segment_name(dead, 1)}-0"
    live = tmp_path / f"{shm.segment_name(os.getpid(), 999)}-0"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    removed = shm.sweep_stale(tmp_path)
    assert removed == [stale.name] and not stale.exists() and live.exists()
