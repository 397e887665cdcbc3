"""Slow, hostile and careless clients cannot stop the daemon serving the others (docs/security.md).

Each test plays one attacker against a real daemon on real sockets and then
checks that a well-behaved client is still answered and the daemon still
stops on SIGTERM. Waits are bounded polls on the daemon's own counters,
never sleeps standing in for synchronisation.
"""

from __future__ import annotations

import json
import time

import numpy as np
import zmq

from harness import TESTS  # noqa: F401  (tests/ on sys.path, as for every test)

FAST = """
[[models]]
name = "fast512"
engine = "fast512/1/model.onnx"
max_queue = 100000
"""


def _request(i: int, width: int = 512) -> list[bytes]:
    header = {"model": "fast512", "id": i, "inputs": [{"name": "x", "dtype": "float32", "shape": [1, width]}]}
    return [b"", json.dumps(header).encode(), np.ones((1, width), np.float32).tobytes()]


def _until(check, timeout_s: float = 60.0, what: str = "") -> None:
    """Poll `check()` until true; fail after `timeout_s` (a liveness bound, not a timing outcome)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"still not {what} after {timeout_s} s"
        time.sleep(0.05)


def _served(daemon) -> bool:
    x = np.ones((1, 512), np.float32)
    with daemon.client(timeout_s=20) as client:
        reply = client.infer("fast512", {"x": x})
    return reply.status == 200


def _daemon_view(daemon) -> dict:
    return daemon.admin().call("status")["daemon"]


def test_a_client_that_never_reads_its_replies_costs_only_its_own(make_daemon) -> None:
    daemon = make_daemon(FAST)
    hostile = zmq.Context.instance().socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    hostile.setsockopt(zmq.RCVHWM, 1)
    hostile.setsockopt(zmq.RCVBUF, 4096)  # the kernel buffer fills after a reply or two
    hostile.setsockopt(zmq.SNDHWM, 0)
    hostile.connect(daemon.endpoint)
    try:
        for i in range(30000):
            hostile.send_multipart(_request(i))
        # Every request read means the pipe to this peer (SNDHWM 10000) filled long ago.
        _until(lambda: _daemon_view(daemon)["requests"] >= 30000, what="reading every request")
        assert _served(daemon)
        view = _daemon_view(daemon)["clients"]
        assert view["dropped_replies"] >= 1 and view["slow_peers"] >= 1
        assert daemon.log().count("is not reading its replies") == 1  # once per peer
    finally:
        hostile.close()
    assert _served(daemon)
    assert daemon.stop() == 0
