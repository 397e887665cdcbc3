"""One message in or out with plain-int flags (transport/multipart.py), checked against pyzmq's own
multipart calls on a real socket pair."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from infermux.transport.multipart import recv_frames, send_frames

MESSAGE = [b"identity", b"", b'{"id": 1}', b"\x00" * 48, b"last"]


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://multipart")
    b.connect("inproc://multipart")
    yield a, b
    ctx.destroy(linger=0)


@pytest.mark.parametrize("copy", [True, False])
def test_a_message_sent_is_the_message_pyzmq_receives(pair, copy: bool) -> None:
    a, b = pair
    send_frames(a, MESSAGE, blocking=False, copy=copy)
    assert b.recv_multipart() == MESSAGE


def test_a_message_pyzmq_sent_is_received_whole_and_the_next_one_apart(pair) -> None:
    a, b = pair
    a.send_multipart(MESSAGE)
    a.send_multipart([b"second"])
    assert [f.bytes for f in recv_frames(b)] == MESSAGE
    assert [f.bytes for f in recv_frames(b, blocking=False)] == [b"second"]


def test_nothing_waiting_raises_again_when_not_blocking(pair) -> None:
    with pytest.raises(zmq.Again):
        recv_frames(pair[1], blocking=False)


def test_a_one_frame_message(pair) -> None:
    a, b = pair
    send_frames(a, [b"only"])
    assert b.recv_multipart() == [b"only"]


def test_a_frame_that_is_not_a_buffer_sends_nothing(pair) -> None:
    a, b = pair
    with pytest.raises(TypeError):
        send_frames(a, [b"first", "not bytes", b"last"])
    send_frames(a, [b"next"])
    assert b.recv_multipart() == [b"next"]  # no half message joined to it
