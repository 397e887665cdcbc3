"""Bad input never takes the daemon down and never disturbs other clients."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zmq

from support.harness import Daemon, exchange

X4 = np.ones((1, 4), np.float32)
GOOD_HEADER = {"model": "addone", "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}


def h(**fields) -> bytes:
    return json.dumps({**GOOD_HEADER, **fields}).encode()


MALFORMED = {
    "non-JSON header": [b"\x00\x01garbage"],
    "header not an object": [b'["addone"]'],
    "missing model": [json.dumps({"inputs": []}).encode()],
    "too few frames": [h()],
    "too many frames": [h(), X4.tobytes(), X4.tobytes()],
    "byte size mismatch": [h(), X4.tobytes()[:-1]],
    "unknown dtype": [h(inputs=[{"name": "x", "dtype": "float128", "shape": [1, 4]}]), X4.tobytes()],
    "negative shape": [h(inputs=[{"name": "x", "dtype": "float32", "shape": [-1, 4]}]), X4.tobytes()],
    "huge shape": [h(inputs=[{"name": "x", "dtype": "float32", "shape": [2**40, 2**40]}]), X4.tobytes()],
    "string shape": [h(inputs=[{"name": "x", "dtype": "float32", "shape": "1x4"}]), X4.tobytes()],
    "hundreds of frames": [h()] + [b"x"] * 300,
    # Over max_message_bytes (1 MiB), within the 64 KiB a frame may go over and still be read (limits.py).
    "oversize frame": [h(inputs=[{"name": "x", "dtype": "uint8", "shape": [1_100_000]}]), b"\0" * 1_100_000],
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_message_gets_a_4xx_and_others_are_still_served(daemon: Daemon, name: str) -> None:
    with daemon.client() as attacker, daemon.client() as bystander:
        reply = attacker.send_raw(MALFORMED[name])
        after = bystander.infer("addone", {"x": X4})
        again = attacker.infer("addone", {"x": X4})
    assert 400 <= reply.status < 500 and reply.error, reply.header
    assert after.status == 200 and again.status == 200
    assert daemon.alive()


def test_empty_message_from_a_req_socket_is_answered(daemon: Daemon) -> None:
    header = json.loads(exchange(daemon.endpoint, zmq.REQ, [b""])[0])
    assert header["status"] == 400 and "empty message" in header["error"]


def test_dealer_without_delimiter_still_gets_an_answer(daemon: Daemon) -> None:
    frames = exchange(daemon.endpoint, zmq.DEALER, [h(id=7), X4.tobytes()])
    header = json.loads(frames[0])
    assert header["status"] == 200 and header["id"] == 7


def test_client_vanishing_mid_request_harms_nobody(daemon: Daemon) -> None:
    ctx = zmq.Context.instance()
    for _ in range(20):
        ghost = ctx.socket(zmq.DEALER)
        ghost.setsockopt(zmq.LINGER, 0)
        ghost.connect(daemon.endpoint)
        ghost.send_multipart([b"", h(), X4.tobytes()])
        ghost.close()
    with daemon.client() as client:
        assert client.infer("addone", {"x": X4}).status == 200
    assert daemon.alive()
