"""Slow, hostile and careless clients cannot stop the daemon serving the others (docs/security.md).

Each test plays one attacker against a real daemon on real sockets and then
checks that a well-behaved client is still answered and the daemon still
stops on SIGTERM. Waits are bounded polls on the daemon's own counters,
never sleeps standing in for synchronisation.
"""

from __future__ import annotations

import fcntl
import grp
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import zmq

from support.harness import DAEMON_HEAD, Daemon
from support.polling import eventually
from infermux.client import Client
from infermux.transport.peers import SILENT_GRACE_S

FAST = """
[[models]]
name = "fast512"
engine = "fast512/1/model.onnx"
max_queue = 100000
"""


def _request(i: int, width: int = 512) -> list[bytes]:
    header = {"model": "fast512", "id": i, "inputs": [{"name": "x", "dtype": "float32", "shape": [1, width]}]}
    return [b"", json.dumps(header).encode(), np.ones((1, width), np.float32).tobytes()]




def _served(daemon) -> bool:
    x = np.ones((1, 512), np.float32)
    with daemon.client(timeout_s=20) as client:
        reply = client.infer("fast512", {"x": x})
    return reply.status == 200


def _daemon_view(daemon, timeout_s: float = 30.0) -> dict:
    return daemon.admin(timeout_s).call("status")["daemon"]


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
        # Every request read means the pipe to this peer (SNDHWM 1000) filled long ago.
        eventually(lambda: _daemon_view(daemon)["requests"] >= 30000, "reading every request", timeout_s=60)
        assert _served(daemon)
        view = _daemon_view(daemon)["clients"]
        assert view["dropped_replies"] >= 1 and view["slow_peers"] >= 1
        assert daemon.log().count("is not reading its replies") == 1  # once per peer
    finally:
        hostile.close()
    assert _served(daemon)
    assert daemon.stop() == 0


def _computed(daemon) -> int:
    """Requests fast512 answered 200: computed, whether or not the reply reached its client."""
    views = daemon.admin().call("models")["models"]
    return sum(v["stats"]["by_status"].get("200", 0) for v in views if v["name"] == "fast512")


def _stalled(daemon) -> int:
    return _daemon_view(daemon)["clients"]["stalled_requests"]


def _reply_to(sock: zmq.Socket, ident: int, timeout_s: float) -> dict | None:
    """The reply header for request `ident` within `timeout_s` (others are skipped), else None."""
    deadline = time.monotonic() + timeout_s
    while sock.poll(max(1, int(1000 * (deadline - time.monotonic())))):
        header = json.loads(sock.recv_multipart()[1])
        if header.get("id") == ident:
            return header
        if time.monotonic() >= deadline:
            break
    return None


@pytest.mark.timing  # the stall must hold while the box is busy: it ends only on a reply that fits
def test_a_stalled_clients_requests_are_not_computed_and_it_is_served_once_it_reads(make_daemon) -> None:
    daemon = make_daemon(FAST)
    hostile = zmq.Context.instance().socket(zmq.DEALER)
    for option, value in ((zmq.LINGER, 0), (zmq.RCVHWM, 1), (zmq.RCVBUF, 4096), (zmq.SNDHWM, 0)):
        hostile.setsockopt(option, value)
    hostile.connect(daemon.endpoint)
    try:
        for i in range(3000):  # more than the daemon queues for one peer (SNDHWM 1000): the pipe fills
            hostile.send_multipart(_request(i))
        # Each request read ends computed or, once its peer is stalled, skipped: wait for all 3000.
        eventually(lambda: _computed(daemon) + _stalled(daemon) == 3000, "settling the first requests", timeout_s=60)
        assert _daemon_view(daemon)["clients"]["dropped_replies"] >= 1
        before, skipped = _computed(daemon), _stalled(daemon)
        assert skipped > 0  # fewer computed than sent: the pipe filled long before the 3000th
        for i in range(3000, 5000):  # the peer is stalled now: read and dropped, never computed
            hostile.send_multipart(_request(i))
        eventually(lambda: _stalled(daemon) == skipped + 2000, "skipping the later requests", timeout_s=60)
        assert _computed(daemon) == before
        assert _served(daemon)  # the others are served meanwhile
        while hostile.poll(200):  # the client reads at last
            hostile.recv_multipart()
        refusals, ident = [], 10_000
        while (reply := _reply_to(hostile, ident, 2.0)) is None or reply["status"] != 200:
            if reply is not None:
                refusals.append(reply)
            ident += 1
            assert ident < 10_050, f"never served again: {refusals[-3:]}"
            hostile.send_multipart(_request(ident))
        assert all(r["status"] == 429 and "does not read" in r["error"] and r["retry_after_ms"] > 0
                   for r in refusals), refusals
        assert len(refusals) <= 1  # the first reply that fits ends the stall
    finally:
        hostile.close()
    assert daemon.stop() == 0


# -- descriptors ---------------------------------------------------------------

NOFILE_1024 = ["prlimit", "--nofile=1024", "--"]  # systemd's default soft limit, soft = hard here


def _fds(daemon) -> int:
    return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))


def _shut_down(clients: dict) -> int:
    """Connections the guard ended: new ones refused, and silent ones closed to make room."""
    return clients["refused_connections"] + clients["idle_closed"]


def _raw_connections(path: str, count: int) -> list[socket.socket]:
    """`count` plain connections to a unix socket that never speak ZMTP (as a scanner or a leak would)."""
    conns = []
    for _ in range(count):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        conns.append(conn)
    return conns


def test_connections_over_the_bound_are_shut_down_and_given_back_under_a_1024_limit(make_daemon) -> None:
    daemon = make_daemon(FAST, prefix=NOFILE_1024)
    soft, hard = (int(n) for n in open(f"/proc/{daemon.proc.pid}/limits").read()
                  .split("Max open files")[1].split()[:2])
    assert (soft, hard) == (1024, 1024)
    bound = _daemon_view(daemon)["clients"]["max_connections"]
    assert bound == 1024 - 512  # reserved_fds stay free for engines, workers and regions
    # More than the bound, fewer than the table holds. A flood past the table's end is more than
    # soft = hard = 1024 can promise, and the daemon says so at start (asserted below): libzmq's
    # I/O thread accepts up to ~1,000 connections ahead of the guard, and with no room for that
    # lead it can meet a full table and abort (a fresh-clone CI run on 2c2b03d did, with 1,100).
    # The shape with room is test_a_flood_faster_than_the_guard_cannot_fill_the_descriptor_table.
    count = bound + 200
    conns = _raw_connections(daemon.endpoint[len("ipc://"):], count)
    try:
        eventually(lambda: _shut_down(_daemon_view(daemon)["clients"]) >= count - bound,
                   "shutting down the connections over the bound", timeout_s=60)
        assert daemon.alive()
        eventually(lambda: _fds(daemon) < bound + 100, "giving the refused connections' descriptors back", timeout_s=60)
    finally:
        for conn in conns:
            conn.close()
    eventually(lambda: _daemon_view(daemon)["clients"]["connections"] == 0, "forgetting closed connections", timeout_s=60)
    assert _served(daemon)
    log = daemon.log()
    # Refused while the flood is young, or closed once it has been silent for SILENT_GRACE_S.
    assert re.search(r"(refused|closed) a connection to the inference socket", log)
    # 1024 leaves no room for the guard's lead: the daemon says a flood could still outrun it.
    assert "the descriptor limit (1024) is too low to keep a flood of connections from exhausting it" in log
    assert daemon.stop() == 0


# systemd's shape: soft 1024 (raised to the hard limit at start), a hard limit with room for
# the guard's lead (peers.MONITOR_LEAD) and reserved_fds.
NOFILE_SOFT_1024 = ["prlimit", "--nofile=1024:2700", "--"]
FLOODER = """
import socket, sys
conns = []
for _ in range(int(sys.argv[2])):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sys.argv[1])
    except OSError:
        conn.close()
        continue
    conns.append(conn)
print(len(conns), flush=True)
sys.stdin.read()
"""


def _flood(path: str, processes: int, each: int) -> None:
    """`processes` processes open `each` connections at once, as fast as they can, and hold them
    until all have: a burst faster than Python judges connections."""
    procs = [subprocess.Popen([sys.executable, "-c", FLOODER, path, str(each)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            proc.stdout.readline()
    finally:
        for proc in procs:
            proc.communicate("", timeout=60)


def test_a_flood_faster_than_the_guard_cannot_fill_the_descriptor_table(make_daemon) -> None:
    # Before the fix the frontend judged each connection between requests while libzmq's I/O
    # thread went on accepting: a flood filled the table and libzmq aborted (ipc_listener.cpp:297).
    daemon = make_daemon(FAST, head=DAEMON_HEAD + "max_connections = 64\n", prefix=NOFILE_SOFT_1024)
    assert _daemon_view(daemon)["clients"]["max_connections"] == 64
    path = daemon.endpoint[len("ipc://"):]
    busy = zmq.Context.instance().socket(zmq.DEALER)  # keeps the frontend computing meanwhile
    busy.setsockopt(zmq.LINGER, 0)
    busy.setsockopt(zmq.SNDHWM, 0)
    busy.connect(daemon.endpoint)
    try:
        for i in range(5000):
            busy.send_multipart(_request(i))
        _flood(path, processes=4, each=1500)
        assert daemon.alive(), daemon.log()[-2000:]
    finally:
        busy.close()
    # stats.sock (group infermux too) and admin.sock are ipc listeners as well: guarded alike.
    _flood(str(daemon.run_dir / "stats.sock"), processes=2, each=1500)
    assert daemon.alive(), daemon.log()[-2000:]
    assert f"refused a connection to {daemon.stats_endpoint}" in daemon.log()
    eventually(lambda: _daemon_view(daemon)["clients"]["connections"] == 0, "forgetting closed connections", timeout_s=60)
    assert _served(daemon)
    assert "Too many open files" not in daemon.log()
    assert daemon.stop() == 0


def _speaking_dealer(daemon, ident: int) -> zmq.Socket:
    """A DEALER that has been answered once: its connection has spoken."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.endpoint)
    sock.send_multipart(_request(ident))
    assert (_reply_to(sock, ident, 20.0) or {}).get("status") == 200
    return sock


def test_connections_that_never_speak_make_room_for_clients_that_do(make_daemon) -> None:
    # Before the fix a new connection over the bound was refused whoever held the slots, so a
    # bound full of silent connections locked every client out until libzmq dropped them at
    # ZMQ_HANDSHAKE_IVL (30 s): well under that here, the late client must be answered.
    daemon = make_daemon(FAST, head=DAEMON_HEAD + "max_connections = 64\n", prefix=NOFILE_SOFT_1024)
    early = _speaking_dealer(daemon, 1)
    watch = early.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    silent = _raw_connections(daemon.endpoint[len("ipc://"):], 100)  # 63 slots left: 37 too many
    try:
        eventually(lambda: _shut_down(_daemon_view(daemon)["clients"]) >= 37, "judging the flood", timeout_s=60)
        before = _daemon_view(daemon)["clients"]["idle_closed"]
        time.sleep(SILENT_GRACE_S)  # the policy's own time: from now on the flood's connections are silent
        with daemon.client(timeout_s=10) as late:
            assert late.infer("fast512", {"x": np.ones((1, 512), np.float32)}).status == 200
        # `late` took a silent one's place: the connection guard judges an accepted connection on its own
        # thread, as libzmq reports it, so `late` may have its answer before the count moves.
        eventually(lambda: _daemon_view(daemon)["clients"]["idle_closed"] == before + 1, "late took a silent one's "
                   "place", timeout_s=10)
        early.send_multipart(_request(2))
        assert (_reply_to(early, 2, 20.0) or {}).get("status") == 200
        assert not watch.poll(0), "the client that had spoken was disconnected"
        # admin.sock alike (at most 256 connections): an operator gets through a bound full of silence.
        silent += _raw_connections(daemon.admin_endpoint[len("ipc://"):], 300)
        time.sleep(SILENT_GRACE_S)
        assert _daemon_view(daemon, timeout_s=10)["clients"]["max_connections"] == 64  # admin got through
    finally:
        for conn in silent:
            conn.close()
        watch.close()
        early.close()
    assert "closed a connection to the inference socket that had sent nothing" in daemon.log()
    assert daemon.stop() == 0


def test_a_bound_full_of_clients_that_speak_refuses_the_newcomer(make_daemon) -> None:
    daemon = make_daemon(FAST, head=DAEMON_HEAD + "max_connections = 64\n", prefix=NOFILE_SOFT_1024)
    clients = [_speaking_dealer(daemon, i) for i in range(64)]
    try:
        newcomer = _raw_connections(daemon.endpoint[len("ipc://"):], 1)[0]
        eventually(lambda: _daemon_view(daemon)["clients"]["refused_connections"] == 1, "refusing the newcomer", timeout_s=60)
        newcomer.settimeout(20)
        while newcomer.recv(4096):  # the greeting libzmq sent, then EOF: the daemon ended it
            pass
        assert _daemon_view(daemon)["clients"]["idle_closed"] == 0
        for i, sock in enumerate(clients):  # every one of them is still served on its connection
            sock.send_multipart(_request(100 + i))
            assert (_reply_to(sock, 100 + i, 20.0) or {}).get("status") == 200
        newcomer.close()
    finally:
        for sock in clients:
            sock.close()
    assert f"none of them silent for {SILENT_GRACE_S:g} s" in daemon.log()
    assert daemon.stop() == 0


METRICS_HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
watch = false
metrics_port = {port}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connecting(port: int) -> socket.socket:
    """A TCP connection started without waiting for the daemon to accept it."""
    conn = socket.socket()
    conn.setblocking(False)
    conn.connect_ex(("127.0.0.1", port))
    conn.setblocking(True)
    return conn


def _scrape(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        return b"".join(iter(lambda: conn.recv(65536), b""))


def test_idle_connections_to_the_metrics_port_cost_a_bounded_few_descriptors(make_daemon) -> None:
    port = _free_port()
    daemon = make_daemon(FAST, head=METRICS_HEAD, prefix=NOFILE_1024, port=str(port))
    idle = [_connecting(port) for _ in range(1100)]
    try:
        assert _fds(daemon) < 1024 - 256
        assert _served(daemon)  # the inference socket still accepts
        assert daemon.alive()
        # A connection that says nothing is let go: the daemon closes its end (EOF here).
        idle[0].settimeout(60)
        assert idle[0].recv(1) == b""
    finally:
        for conn in idle:
            conn.close()
    # While the daemon still works through the flood's closed connections, a scrape may be reset to make
    # room (it has not been read yet, so it looks silent); a scraper tries again, as this does.
    eventually(lambda: _scrape_or_reset(port).startswith(b"HTTP/1.0 200"), "scraped", timeout_s=60)
    assert daemon.stop() == 0


def _scrape_or_reset(port: int) -> bytes:
    try:
        return _scrape(port)
    except ConnectionResetError:
        return b""


# -- the shared-memory registration socket -------------------------------------------

def _regions(daemon) -> str:
    return str(daemon.run_dir / "regions.sock")


def _seqpacket(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(20)
    sock.connect(path)
    return sock


def _memfd(size: int = 4096) -> int:
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def test_descriptors_sent_with_an_empty_packet_are_closed(make_daemon) -> None:
    daemon = make_daemon(FAST)
    assert _served(daemon)
    before = _fds(daemon)
    for _ in range(100):
        fds = [_memfd() for _ in range(4)]
        with _seqpacket(_regions(daemon)) as sock:
            socket.send_fds(sock, [b""], fds)
            assert sock.recv(4096) == b""  # the daemon took it as the end and hung up: handled
        for fd in fds:
            os.close(fd)
    assert _fds(daemon) < before + 20  # not +400
    assert daemon.stop() == 0


def test_deeply_nested_json_on_the_registration_socket_is_answered(make_daemon) -> None:
    daemon = make_daemon(FAST)
    fd = _memfd()
    with _seqpacket(_regions(daemon)) as sock:
        socket.send_fds(sock, [json.dumps({"op": "register", "name": "nest"}).encode()], [fd])
        token = json.loads(sock.recv(4096))["region"]
        sock.send(b"[" * 4000)
        answer = json.loads(sock.recv(4096))
        assert answer["ok"] is False and "JSON object" in answer["error"]
        sock.send(json.dumps({"op": "unregister", "region": "nope"}).encode())  # still served
        assert json.loads(sock.recv(4096))["ok"] is False
    os.close(fd)
    # The region went with its connection: a request naming it is refused.
    eventually(lambda: _daemon_view(daemon)["shared_memory"]["regions"] == 0, "releasing the region", timeout_s=60)
    header = {"model": "fast512", "id": 1,
              "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512], "region": token, "offset": 0}]}
    with daemon.client() as client:
        assert client.send_raw([json.dumps(header).encode()]).status == 400
    assert "internal error" not in daemon.log()
    assert daemon.stop() == 0


def _refused(sock: socket.socket) -> bool:
    """Ask something; True if the daemon said it is out of descriptors. It answers a refused
    client on accept and hangs up without reading, so our question may meet a reset instead
    (only a refusal closes a connection unread); no answer at all times out: a failure."""
    try:
        sock.send(json.dumps({"op": "unregister", "region": "x"}).encode())
        return "out of file descriptors" in json.loads(sock.recv(4096))["error"]
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_a_full_descriptor_table_pauses_registrations_and_never_ends_them(make_daemon) -> None:
    daemon = make_daemon(FAST)
    assert _served(daemon)
    pid = str(daemon.proc.pid)
    # Soft limit only (a lowered hard one could not be raised again), a few above what is open.
    subprocess.run(["prlimit", "--pid", pid, f"--nofile={_fds(daemon) + 4}:"], check=True)
    held, refused = [], 0
    try:
        while refused < 3:  # each accepted connection holds a descriptor until the table is full
            assert len(held) < 40, "the table never filled"
            sock = _seqpacket(_regions(daemon))
            held.append(sock)
            refused += _refused(sock)
    finally:
        subprocess.run(["prlimit", "--pid", pid, "--nofile=4096:"], check=True)
        for sock in held:
            sock.close()
    fd = _memfd()
    with _seqpacket(_regions(daemon)) as sock:  # the socket still serves
        socket.send_fds(sock, [json.dumps({"op": "register", "name": "after"}).encode()], [fd])
        assert json.loads(sock.recv(4096))["ok"] is True
    os.close(fd)
    assert "shared-memory registrations refused for now" in daemon.log()
    assert daemon.stop() == 0


# -- the admin socket ------------------------------------------------------------------

def _admin_raw(daemon, frame: bytes) -> zmq.Socket:
    """A DEALER on the admin socket that has sent `frame`, with a monitor on its connection."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, -1)  # a dropped connection stays dropped: we wait for it
    sock.connect(daemon.admin_endpoint)
    sock.send_multipart([b"", frame])
    return sock


def test_a_deeply_nested_admin_request_is_answered_and_admin_serves_on(make_daemon) -> None:
    daemon = make_daemon(FAST)
    sock = _admin_raw(daemon, b'{"cmd": ' + b"[" * 20000 + b"]" * 20000 + b"}")
    try:
        assert sock.poll(20000), "admin did not answer"
        assert b"nested too deeply" in sock.recv_multipart()[-1]
    finally:
        sock.close()
    assert _daemon_view(daemon)["requests"] == 0  # admin still answers
    assert daemon.stop() == 0


def test_an_admin_request_over_its_size_cap_is_never_read(make_daemon) -> None:
    daemon = make_daemon(FAST)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, -1)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(daemon.admin_endpoint)
    try:
        sock.send_multipart([b"", b'{"cmd": "status", "pad": "' + b"p" * (1 << 20) + b'"}'])
        # libzmq drops a peer whose frame passes MAXMSGSIZE: the connection ends, unanswered.
        assert monitor.poll(20000), "the 1 MiB admin request was read (MAXMSGSIZE had no effect)"
        assert not sock.poll(0)
    finally:
        monitor.close()
        sock.close()
    assert _daemon_view(daemon)["requests"] == 0
    assert daemon.stop() == 0


def test_set_with_a_huge_value_is_a_validation_error(make_daemon) -> None:
    daemon = make_daemon(FAST)
    reply = daemon.admin().call("set", check=False, model="fast512", batch_delay_us=10**400)
    assert reply["ok"] is False and "batch_delay_us' must be an integer >= 0 and <= " in reply["error"]
    assert "internal error" not in reply["error"]
    assert daemon.stop() == 0


def test_an_abstract_admin_endpoint_is_a_configuration_error() -> None:
    from infermux import config as cfg

    try:
        cfg.parse('[daemon]\nadmin = "ipc://@infermux-admin"\n', Path("/etc/infermux/test.toml"))
    except cfg.ConfigError as exc:
        assert exc.path == "daemon.admin" and "any local user could drain" in str(exc)
    else:
        raise AssertionError("an abstract admin socket, open to every local user, was accepted")


# -- a worker that stops answering -------------------------------------------------------

COLD = """
[[models]]
name = "cold"
engine = "fast512/1/model.onnx"
placement = "cold"
preload = true
"""


def _worker(daemon, name: str) -> dict:
    with daemon.admin() as admin:
        return next(m for m in admin.call("models")["models"] if m["name"] == name)["worker"]


def _cold_request(i: int, timeout_ms: int) -> list[bytes]:
    header = {"model": "cold", "id": i, "timeout_ms": timeout_ms,
              "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512]}]}
    return [b"", json.dumps(header).encode(), np.ones((1, 512), np.float32).tobytes()]


def test_a_stopped_workers_requests_are_answered_at_their_deadline_and_its_late_replies_dropped(
        make_daemon) -> None:
    daemon = make_daemon(COLD)
    pid = _worker(daemon, "cold")["pid"]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.endpoint)
    os.kill(pid, signal.SIGSTOP)  # it holds what it is sent from now on, and answers nothing
    try:
        for i in range(3):
            sock.send_multipart(_cold_request(i, timeout_ms=300))
        replies = []
        for _ in range(3):
            # Before the fix these came at worker_hang_s (10 s) as 503 "hung": the status tells.
            assert sock.poll(30000), "a request held by a stopped worker was never answered"
            replies.append(json.loads(sock.recv_multipart()[1]))
        assert all(r["status"] == 504 and "not computed" in r["error"] for r in replies), replies
        assert _worker(daemon, "cold")["pid"] == pid  # answered by its deadline, not by killing the worker
    finally:
        os.kill(pid, signal.SIGCONT)
    # The worker resumes and answers (or drops as late) what it held: nothing reaches the client.
    eventually(lambda: _worker(daemon, "cold")["expired"] == 0, "hearing back from the resumed worker", timeout_s=60)
    sock.send_multipart(_cold_request(99, timeout_ms=20000))
    assert sock.poll(20000)
    assert json.loads(sock.recv_multipart()[1])["id"] == 99  # no second reply to 0..2 came first
    sock.close()
    log = daemon.log()
    assert "at their deadline" in log and "Traceback" not in log
    assert daemon.stop() == 0


# -- what engine_dir's folder names and links can do ------------------------------------

ODD_HEAD = """
[daemon]
listen = ["ipc://infer.sock", "{abstract}"]
engine_dir = "{watched}"
metrics_port = {port}
watch_settle_s = 0.2
admin_group = "{admin_group}"
"""
NEWLINE, ESCAPE = "bad\nname", "esc\x1b[31mred"


@pytest.fixture(scope="module")
def odd_engines(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[tuple[Daemon, int, Path]]:
    """A daemon on an abstract socket too, watching an engine_dir with odd folders:
    names with a newline and with ESC, and a model folder linking outside engine_dir."""
    work = tmp_path_factory.mktemp("odd")
    watched, outside = work / "engines", work / "elsewhere"
    for name in ("fine", NEWLINE, ESCAPE):
        (watched / name / "1").mkdir(parents=True)
        shutil.copy(engines / "fast512/1/model.onnx", watched / name / "1/model.onnx")
    (outside / "1").mkdir(parents=True)
    shutil.copy(engines / "fast512/1/model.onnx", outside / "1/model.onnx")
    (watched / "linked").symlink_to(outside)
    port = _free_port()
    d = Daemon(work, ODD_HEAD.format(abstract=f"ipc://@infermux-test-{os.getpid()}", watched=watched,
                                     port=port, admin_group=_other_group() or "")).start()
    try:
        yield d, port, outside
    finally:
        assert d.stop() == 0, d.log()[-4000:]


def _other_group() -> str | None:
    """A group we may give files to (root: any) that is not our own: stands in for infermux-admin."""
    mine = os.getgid()
    candidates = [g for g in grp.getgrall() if g.gr_gid != mine and (os.getuid() == 0 or g.gr_gid in os.getgroups())]
    return candidates[0].gr_name if candidates else None


def test_admin_sock_is_given_to_the_admin_group_not_the_clients(odd_engines) -> None:
    d, _, _ = odd_engines
    group = _other_group()
    if group is None:
        pytest.skip("no second group to give admin.sock to")
    admin, infer = (os.stat(d.run_dir / name) for name in ("admin.sock", "infer.sock"))
    assert admin.st_gid == grp.getgrnam(group).gr_gid != infer.st_gid
    assert stat.S_IMODE(admin.st_mode) == 0o660


def test_an_abstract_inference_endpoint_is_warned_about(odd_engines) -> None:
    d, _, _ = odd_engines
    assert f"ipc://@infermux-test-{os.getpid()} is an abstract socket: no file permission guards it" in d.log()
    with Client(f"ipc://@infermux-test-{os.getpid()}", timeout_s=20) as client:  # and it serves
        assert client.infer("fine", {"x": np.ones((1, 512), np.float32)}).status == 200


def test_folder_names_with_control_characters_are_refused_and_never_logged_raw(odd_engines) -> None:
    d, port, _ = odd_engines
    log = d.log()
    for name in (NEWLINE, ESCAPE):
        assert f"refused folder {ascii(str(d.workdir / 'engines' / name))} in engine_dir: its name holds " \
               "control characters" in log
    assert "\x1b" not in log and "bad\n" not in log
    with d.admin() as admin:
        assert {m["name"] for m in admin.call("models")["models"]} == {"fine", "linked"}
    metrics = _scrape(port).decode()
    sample = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\\n]|\\["\\n])*",?)*\})? \S+$')
    for line in metrics.split("\r\n\r\n", 1)[1].splitlines():  # each line a comment or one whole sample
        assert line.startswith("#") or sample.match(line), line
    assert "infermux_replies_dropped_total 0" in metrics


def test_a_model_folder_linking_outside_engine_dir_is_logged_and_served(odd_engines) -> None:
    d, _, outside = odd_engines
    assert f"{d.workdir / 'engines' / 'linked'} is a symlink to {outside}, outside engine_dir" in d.log()
    with d.client(timeout_s=20) as client:
        assert client.infer("linked", {"x": np.ones((1, 512), np.float32)}).status == 200
    # Scanned again since (the new folder is served): the link is not logged at every scan.
    (d.workdir / "engines/later/1").mkdir(parents=True)
    shutil.copy(d.workdir / "engines/fine/1/model.onnx", d.workdir / "engines/later/1/model.onnx")
    with d.client(timeout_s=20) as client:
        eventually(lambda: client.infer("later", {"x": np.ones((1, 512), np.float32)}).status == 200,
                   "serving a folder published later", timeout_s=60)
    assert d.log().count("is a symlink to") == 1


# -- what one message can make the daemon hold -----------------------------------------------

def _rss_mib(daemon) -> float:
    status = Path(f"/proc/{daemon.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) / 1024


def test_a_message_costs_at_most_its_frames_each_capped_at_the_limit(make_daemon) -> None:
    daemon = make_daemon(FAST)  # max_message_bytes = 1 MiB (harness)
    assert _served(daemon)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, -1)  # a dropped connection stays dropped: we wait for it
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(daemon.endpoint)
    header = _request(1)[1]
    try:
        before = _rss_mib(daemon)
        # 40 frames each under the limit, 40 MB in all: libzmq has no frame-count limit, so the
        # daemon holds it whole, answers 413, and lets it go. Each 413 comes a moment late, so a
        # client looping on the refusal sends a few such messages a second, not as many as it can.
        for _ in range(3):
            start = time.monotonic()
            sock.send_multipart([b"", header, *([bytes(1_000_000)] * 40)])
            assert sock.poll(30000), "no answer to a 40-frame message over max_message_bytes"
            reply = json.loads(sock.recv_multipart()[1])
            assert reply["status"] == 413 and "(max_message_bytes)" in reply["error"], reply
            assert time.monotonic() - start >= 0.1
        # Let go once answered (the frames are freed after the reply is sent: poll, bounded).
        eventually(lambda: _rss_mib(daemon) - before < 20, "giving the 40 MB message back", timeout_s=20)
        # One frame over the limit (and its 64 KiB slack): dropped with the connection, unread.
        sock.send_multipart([b"", header, bytes(3 << 19)])
        assert monitor.poll(30000), "a 1.5 MiB frame was read (the per-frame cap is not the limit)"
        assert not sock.poll(0)
    finally:
        monitor.close()
        sock.close()
    assert _served(daemon)
    assert daemon.stop() == 0
