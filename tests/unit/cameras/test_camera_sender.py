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
