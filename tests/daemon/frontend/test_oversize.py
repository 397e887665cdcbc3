"""A request over max_message_bytes is answered, never met with silence.

libzmq drops a connection whose frame is over max_message_bytes + 64 KiB
unread: no reply, and every request pipelined on that connection loses its
reply. So the project's clients ask the daemon its limit before a large
request and refuse one over it themselves, naming max_message_bytes and the
size (`infermux infer` exits 1 with that line); a message a little over the
limit is read and answered 413, naming the limit; and the daemon counts and
logs the connections it drops for a frame over the cap (docs/protocol.md,
"Size limits").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import zmq

from support.harness import DAEMON_HEAD, dealer, free_port
from infermux.client import Client, Pipeline, RequestTooLarge

MODEL = '[[models]]\nname = "addone"\nengine = "addone/1/model.onnx"\n'
LIMIT = 1048576  # DAEMON_HEAD's max_message_bytes
SMALL = {"x": np.ones((1, 4), np.float32)}
OVER_THE_CAP = {"x": np.ones((2, LIMIT // 4), np.float32)}  # 2 MiB: libzmq would drop it unread


def test_the_client_refuses_a_request_over_the_limit_and_says_why(make_daemon) -> None:
    d = make_daemon(MODEL)
    with Client(d.endpoint, timeout_s=10, retries=2) as client:
        started = time.monotonic()
        with pytest.raises(RequestTooLarge) as caught:
            client.infer("addone", OVER_THE_CAP)
        assert time.monotonic() - started < 5  # not a timeout, three times over
        message = str(caught.value)
        assert caught.value.size > OVER_THE_CAP["x"].nbytes and caught.value.limit == LIMIT
        assert "max_message_bytes" in message and f"{caught.value.size} bytes" in message and str(LIMIT) in message
        assert client.infer("addone", SMALL).status == 200  # the same client goes on


def test_a_pipeline_keeps_the_replies_of_requests_in_flight_when_one_is_too_large(make_daemon) -> None:
    d = make_daemon(MODEL)
    with Pipeline(d.endpoint, timeout_s=10) as pipe:
        ids = [pipe.submit("addone", SMALL) for _ in range(50)]
        with pytest.raises(RequestTooLarge):
            pipe.submit("addone", OVER_THE_CAP)
        assert [r.status for r in pipe.gather(ids)] == [200] * 50


def test_a_message_a_little_over_the_limit_is_answered_413_naming_the_limit(make_daemon) -> None:
    d = make_daemon(MODEL)
    frames = [json.dumps({"model": "addone", "inputs": [{"name": "x", "dtype": "float32",
                                                          "shape": [1, LIMIT // 4]}]}).encode(),
              np.ones((1, LIMIT // 4), np.float32).tobytes()]
    with dealer(d.endpoint) as sock:
        sock.send_multipart([b"", *frames])
        assert sock.poll(10_000), "no reply to a message just over max_message_bytes"
        header = json.loads(sock.recv_multipart()[1])
    assert header["status"] == 413 and header["max_message_bytes"] == LIMIT, header
    assert "max_message_bytes" in header["error"]


def test_a_client_in_another_language_can_ask_the_limits(make_daemon) -> None:
    d = make_daemon(MODEL)
    with dealer(d.endpoint) as sock:
        sock.send_multipart([b"", b'{"limits": true, "id": 7}'])
        assert sock.poll(10_000)
        header = json.loads(sock.recv_multipart()[1])
    assert header["status"] == 200 and header["id"] == 7
    assert header["limits"]["max_message_bytes"] == LIMIT


def test_infer_exits_1_naming_the_limit_and_the_size(make_daemon, tmp_path) -> None:
    d = make_daemon(MODEL)
    big = tmp_path / "x.npy"
    np.save(big, OVER_THE_CAP["x"])
    run = subprocess.run([sys.executable, "-m", "infermux", "infer", "addone", "--input", f"x={big}",
                          "-e", d.endpoint, "--admin", d.admin_endpoint, "--timeout", "5"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("infermux: ") and "max_message_bytes" in line and str(LIMIT) in line, line
    (size,) = re.findall(r"request is (\d+) bytes", line)
    assert int(size) > OVER_THE_CAP["x"].nbytes


def test_bench_exits_1_naming_the_limit_instead_of_waiting_for_replies(make_daemon, tmp_path) -> None:
    d = make_daemon(MODEL)
    big = tmp_path / "x.npy"
    np.save(big, OVER_THE_CAP["x"])
    run = subprocess.run([sys.executable, "-m", "infermux", "bench", "addone", "--input", f"x={big}",
                          "-e", d.endpoint, "--requests", "5", "--timeout", "30"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    assert "max_message_bytes" in run.stderr and str(LIMIT) in run.stderr and "Traceback" not in run.stderr


def test_the_daemon_counts_and_logs_connections_dropped_for_a_frame_over_the_cap(make_daemon) -> None:
    port = free_port()
    d = make_daemon(MODEL, head=DAEMON_HEAD + f"metrics_port = {port}\n")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "infermux_requests_dropped_oversize_total 0" in metrics.splitlines()
    frame = OVER_THE_CAP["x"].tobytes()
    request = [b"", json.dumps({"model": "addone", "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]})
               .encode(), SMALL["x"].tobytes()]
    for _ in range(5):  # clients that hang up after their replies are not counted
        with dealer(d.endpoint) as sock:
            sock.send_multipart(request)
            assert sock.poll(10_000)
            sock.recv_multipart()
    for _ in range(3):  # a client in another language that did not ask: libzmq drops its connection
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, -1)  # one connection each, not one per reconnect
        sock.connect(d.endpoint)
        sock.send_multipart(request)  # served: a connection that already spoke (oversize.py)
        assert sock.poll(10_000) and json.loads(sock.recv_multipart()[1])["status"] == 200
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.send_multipart([b"", b'{"model": "addone", "inputs": []}', frame])
        # the daemon hangs up unread; closing before it has would make this a client that hung up itself
        assert monitor.poll(30_000), "the daemon kept a connection that sent a frame over the cap"
        assert not sock.poll(0)  # no reply came: the daemon never read it
        sock.disable_monitor()
        monitor.close()
        sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        if "infermux_requests_dropped_oversize_total 3" in metrics.splitlines():
            break
        time.sleep(0.1)
    assert "infermux_requests_dropped_oversize_total 3" in metrics.splitlines(), metrics
    with d.admin() as admin:
        assert admin.call("status")["daemon"]["clients"]["dropped_oversize"] == 3
    log = d.log()
    assert "max_message_bytes" in log and "fd " in log, log
    with d.client() as client:
        assert client.infer("addone", SMALL).status == 200
    time.sleep(0.5)  # that client has hung up too: still three
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "infermux_requests_dropped_oversize_total 3" in metrics.splitlines()
