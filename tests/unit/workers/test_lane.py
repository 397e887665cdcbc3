"""The fast lane between the daemon and a worker: packets, refusals, the end."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import numpy as np
import pytest

from infermux.workers.lane import MAX_PACKET, Lane, LaneClosed


@pytest.fixture
def lanes():
    mine, theirs = Lane.pair()
    other = Lane(theirs)
    yield mine, other
    mine.close()
    other.close()


def test_a_message_arrives_whole_with_its_frames(lanes) -> None:
    a, b = lanes
    tensor = np.arange(1000, dtype=np.float32)
    assert a.send([b"I{\"s\":1}", b"", memoryview(tensor)])
    frames = b.recv()
    assert frames is not None and len(frames) == 3
    assert frames[0] == b'I{"s":1}' and isinstance(frames[0], bytes)
    assert bytes(frames[1]) == b""
    assert np.array_equal(np.frombuffer(frames[2], np.float32), tensor)
    assert b.recv() is None  # nothing more waits


def test_messages_keep_their_boundaries_and_order(lanes) -> None:
    a, b = lanes
    for i in range(50):
        assert a.send([b"R%d" % i])
    assert b.readable()
    assert [b.recv()[0] for _ in range(50)] == [b"R%d" % i for i in range(50)]
    assert not b.readable()


def test_a_message_too_big_for_one_packet_is_refused_not_split(lanes) -> None:
    a, b = lanes
    assert not a.send([b"I", bytes(MAX_PACKET)])
    assert b.recv() is None


def test_a_full_buffer_refuses_instead_of_blocking(lanes) -> None:
    a, b = lanes
    chunk = bytes(32 * 1024)
    sent = 0
    while a.send([b"I", chunk]):  # nobody reads b: the socket buffer fills up
        sent += 1
        assert sent < 10_000, "the lane never filled up"
    assert sent >= 1
    received = 0
    while b.recv() is not None:
        received += 1
    assert received == sent  # what was accepted arrives; the refused one went nowhere
    assert a.send([b"I", chunk])  # room again


def test_the_end_of_the_other_process_reads_as_lane_closed(lanes) -> None:
    a, b = lanes
    assert a.send([b"R1"])
    a.close()
    assert b.recv()[0] == b"R1"  # what was sent before the end still arrives
    with pytest.raises(LaneClosed):
        b.recv()
    assert not b.send([b"X"])  # the peer is gone: refused, no exception


def test_a_child_process_talks_through_the_inherited_end() -> None:
    mine, theirs = Lane.pair()
    assert not os.get_inheritable(mine.fileno())  # workers started later must not hold the daemon's end
    code = ("import sys; from infermux.workers.lane import Lane; import select\n"
            "lane = Lane.from_fd(int(sys.argv[1]))\n"
            "select.select([lane.fileno()], [], [], 10)\n"
            "frames = lane.recv(); lane.send([b'R' + frames[0][1:], frames[1]])\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        assert mine.send([b"Ihello", b"\x01\x02"])
        select.select([mine.fileno()], [], [], 10)
        frames = mine.recv()
        assert frames[0] == b"Rhello" and bytes(frames[1]) == b"\x01\x02"
        assert child.wait(10) == 0
        with pytest.raises(LaneClosed):  # the child exited: its end closed with it
            mine.recv()
    finally:
        child.kill()
        mine.close()


def test_a_descriptor_travels_with_its_packet_and_waits_to_be_taken(lanes) -> None:
    a, b = lanes
    fd = os.memfd_create("lane-test")
    os.write(fd, b"region bytes")
    assert a.send_fd([b"Mtoken"], fd)
    assert a.send([b"I{}"])  # a packet without one takes none
    os.close(fd)  # the receiver holds its own duplicate
    assert b.recv() == [b"Mtoken"] and b.recv() == [b"I{}"]
    got = b.take_fd()
    assert got is not None and b.take_fd() is None
    assert os.pread(got, 12, 0) == b"region bytes"
    os.close(got)
