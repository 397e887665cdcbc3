"""sd_notify sender against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid

import pytest

from infermux.admin.notify import Notifier

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sd_notify is Linux-only")


class NotifySocket:
    """What systemd listens on: a bound datagram socket we read messages from."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(2.0)

    def recv(self) -> str:
        return self.sock.recv(4096).decode()

    def assert_empty(self) -> None:
        self.sock.settimeout(0.05)
        with pytest.raises((socket.timeout, BlockingIOError)):
            self.sock.recv(4096)
        self.sock.settimeout(2.0)


@pytest.fixture
def listener(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = NotifySocket(path)
    yield path, sock
    sock.sock.close()


def test_each_call_sends_exactly_its_message(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.status("loading classifier")
    assert sock.recv() == "STATUS=loading classifier"
    assert n.extend_timeout(30_000_000)
    assert sock.recv() == "EXTEND_TIMEOUT_USEC=30000000"
    assert n.ready()
    assert sock.recv() == "READY=1"
    assert n.ready("serving 2 models")
    assert sock.recv() == "READY=1\nSTATUS=serving 2 models"
    assert n.watchdog()
    assert sock.recv() == "WATCHDOG=1"
    assert n.stopping()
    assert sock.recv() == "STOPPING=1"
    sock.assert_empty()


def test_reloading_carries_the_monotonic_clock(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert n.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = sock.recv().split("\n")
    assert first == "RELOADING=1"
    key, value = second.split("=")
    assert key == "MONOTONIC_USEC"
    assert before <= int(value) <= after


def test_status_stays_on_one_line(listener):
    path, sock = listener
    Notifier({"NOTIFY_SOCKET": path}).status("a\nREADY=1")
    # A raw newline would have smuggled in a second assignment.
    assert sock.recv() == "STATUS=a READY=1"


def test_abstract_namespace_socket():
    name = f"infermux-test-{uuid.uuid4().hex}"
    sock = NotifySocket(b"\0" + name.encode())
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv() == "READY=1"
    finally:
        sock.sock.close()


def test_threads_share_one_notifier(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    got: list[str] = []
    # Read while they send: the kernel queues only ~10 datagrams per socket.
    reader = threading.Thread(target=lambda: got.extend(sock.recv() for _ in range(8 * 50)))
    reader.start()
    senders = [threading.Thread(target=lambda i=i: [n.status(f"t{i} {k}") for k in range(50)])
               for i in range(8)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    reader.join(10)
    assert sorted(got) == sorted(f"STATUS=t{i} {k}" for i in range(8) for k in range(50))
    sock.assert_empty()


def test_a_listener_that_stopped_reading_does_not_wedge_the_caller(listener):
    path, _ = listener
    n = Notifier({"NOTIFY_SOCKET": path}, send_timeout_s=0.05)
    start = time.monotonic()
    sent = [n.watchdog() for _ in range(24)]  # more than the queue holds
    assert sent[0] is True and sent[-1] is False
    assert time.monotonic() - start < 10


def test_noop_without_notify_socket(listener):
    _, sock = listener
    n = Notifier({})
    assert not n.enabled
    assert not any([n.ready("x"), n.status("x"), n.watchdog(), n.extend_timeout(1),
                    n.reloading(), n.stopping()])
    assert n.watchdog_interval_s() is None
    sock.assert_empty()


def test_unusable_socket_is_not_an_error(tmp_path):
    # systemd went away (or the path is wrong): the daemon must keep going.
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    assert n.enabled
    assert n.ready() is False
    assert Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled is False


def test_reads_os_environ_by_default(listener, monkeypatch):
    path, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert Notifier().watchdog()
    assert sock.recv() == "WATCHDOG=1"


def test_unset_environment_hides_the_socket_from_children(listener, monkeypatch):
    path, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    n = Notifier(unset_environment=True)
    assert "NOTIFY_SOCKET" not in os.environ and "WATCHDOG_USEC" not in os.environ
    # ...while this notifier keeps what it read.
    assert n.watchdog_interval_s() == 2.0
    assert n.ready()
    assert sock.recv() == "READY=1"


@pytest.mark.parametrize("env, expected", [
    ({"WATCHDOG_USEC": "1000000"}, 0.5),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
    ({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
    ({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "nope"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_interval(env, expected):
    assert Notifier(env).watchdog_interval_s() == expected
