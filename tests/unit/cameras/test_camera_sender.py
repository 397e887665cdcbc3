"""A camera process's sender: one request in flight, the newest frame next, what it replaced told."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import zmq

from infermux.cameras.child import Counts, Sender
from infermux.cameras.config import CameraConfig
from infermux.cameras.source import Decoded
from infermux.protocol import encode_reply


def frame(value: int, captured: float) -> Decoded:
    return Decoded(np.full((4, 6, 3), value, np.uint8), captured, 1.0)


def test_a_frame_that_finds_one_in_flight_waits_and_a_newer_one_replaces_it(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path / 'infer.sock'}"
    daemon = zmq.Context.instance().socket(zmq.ROUTER)
    daemon.bind(endpoint)
    counts = Counts()
    sender = Sender(CameraConfig("gate-3", "a.mp4", "cams"), endpoint, "", "image", counts)
    try:
        now = time.time()
        for i in range(3):
            sender.offer(frame(i, now + i))
        assert daemon.poll(5000)
        first = daemon.recv_multipart()
        header = json.loads(first[2])
        assert (header["key"], header["captured"], header["model"]) == ("gate-3", now, "cams")
        assert "replaced" not in header and np.frombuffer(first[3], np.uint8).max() == 0
        assert (counts.sent, counts.superseded) == (1, 1) and not daemon.poll(100)  # one in flight, no more
        daemon.send_multipart([first[0], b"", *encode_reply({"id": header["id"], "status": 200})])
        deadline = time.monotonic() + 5
        while counts.sent < 2 and time.monotonic() < deadline:
            sender.socket.poll(50)
            sender.receive()
        second = daemon.recv_multipart()
        header = json.loads(second[2])
        assert header["replaced"] == 1 and header["captured"] == now + 2  # the newest frame, and the one it replaced
        assert np.frombuffer(second[3], np.uint8).max() == 2 and counts.served == 1
    finally:
        sender.socket.close(0)
        daemon.close(0)


def test_a_request_unanswered_is_given_up_and_the_camera_connects_again_as_itself(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """The daemon's ROUTER takes nothing from a connection that came while another of the same identity was
    there (a restarted camera whose previous process's connection lingered): the camera, its request
    unanswered, connects again under its identity, and is heard."""
    from infermux.cameras import child

    monkeypatch.setattr(child, "REPLY_TIMEOUT_S", 0.5)
    endpoint = f"ipc://{tmp_path / 'infer.sock'}"
    daemon = zmq.Context.instance().socket(zmq.ROUTER)
    daemon.bind(endpoint)
    previous = zmq.Context.instance().socket(zmq.DEALER)  # the camera's previous process, still connected
    previous.setsockopt(zmq.IDENTITY, b"camera-0123")
    previous.connect(endpoint)
    previous.send_multipart([b"", b"{}"])
    assert daemon.poll(5000) and daemon.recv_multipart()[0] == b"camera-0123"
    counts = Counts()
    sender = Sender(CameraConfig("gate-3", "a.mp4", "cams"), endpoint, "", "image", counts, identity="0123")
    try:
        sender.offer(frame(1, time.time()))
        assert not daemon.poll(300)  # the newcomer is not heard while the identity is taken
        previous.close(0)
        heard: list[list[bytes]] = []
        deadline = time.monotonic() + 10
        while counts.failed == 0 and time.monotonic() < deadline:
            sender.socket.poll(50)
            sender.receive()
            while daemon.poll(0):  # the daemon's frontend reads all the time
                heard.append(daemon.recv_multipart())
        assert counts.failed == 1 and "connected again" in sender.last_error
        assert not [m for m in heard if m[0] == b"camera-0123"]  # the first request was never heard as the camera's
        sender.offer(frame(2, time.time()))
        deadline = time.monotonic() + 5
        while not (mine := [m for m in heard if m[0] == b"camera-0123"]) and time.monotonic() < deadline:
            if daemon.poll(100):
                heard.append(daemon.recv_multipart())
        assert mine and json.loads(mine[0][2])["key"] == "gate-3"
    finally:
        sender.socket.close(0)
        daemon.close(0)
