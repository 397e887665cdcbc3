"""CURVE on tcp:// listeners: who gets served, who gets nothing, and the keys behind it."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq.auth

from infermux import config as cfg
from infermux.client import Client
from infermux.transport.curve import CurveError, client_options
from infermux.cli.keygen import make_keypair
from support.harness import CURVE_HEAD, free_port

X4 = np.ones((1, 4), np.float32)

ADDONE = """
[[models]]
name = "addone"
engine = "addone/1/model.onnx"
"""


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """server/ (the daemon's pair), alice/ (authorised, with server.key), mallory/ (not authorised)."""
    root = tmp_path / "keys"
    server_public, _ = make_keypair(root / "server", "server")
    (root / "authorized").mkdir()
    for client in ("alice", "mallory"):
        public, _ = make_keypair(root / client, client)
        shutil.copy(server_public, root / client / "server.key")
    shutil.copy(root / "alice" / "alice.key", root / "authorized")
    return root


@pytest.fixture
def curve_daemon(make_daemon, keys):
    port = free_port()
    daemon = make_daemon(ADDONE, head=CURVE_HEAD, port=str(port), keys=str(keys))
    daemon.tcp = f"tcp://127.0.0.1:{port}"
    return daemon


def infer(endpoint: str, timeout_s: float, curve=None):
    with Client(endpoint, timeout_s=timeout_s, curve=curve) as client:
        return client.infer("addone", {"x": X4})


def test_an_authorised_client_is_served_over_tcp(curve_daemon, keys) -> None:
    reply = infer(curve_daemon.tcp, 10.0, client_options(keys / "alice"))
    assert reply.status == 200
    np.testing.assert_array_equal(reply.outputs["y"], X4 + 1)


def test_ipc_stays_plain_beside_a_curve_listener(curve_daemon) -> None:
    # tcp is bound first: its CURVE options must not leak onto the ipc listener.
    assert infer(curve_daemon.endpoint, 10.0).status == 200


def test_an_unknown_key_gets_nothing_and_the_refusal_is_logged(curve_daemon, keys) -> None:
    with pytest.raises(TimeoutError):
        infer(curve_daemon.tcp, 1.0, client_options(keys / "mallory"))
    mallory = zmq.auth.load_certificate(keys / "mallory" / "mallory.key")[0].decode()
    curve_daemon.wait_for(f"refused CURVE client key {mallory}", timeout=20)
    assert infer(curve_daemon.tcp, 10.0, client_options(keys / "alice")).status == 200  # others unharmed


def test_a_client_without_curve_gets_nothing(curve_daemon) -> None:
    with pytest.raises(TimeoutError):
        infer(curve_daemon.tcp, 1.0)


def test_a_refused_client_times_out_instead_of_blocking_on_send(curve_daemon) -> None:
    # Once the server has refused the handshake, libzmq may drop the DEALER's only pipe, and a
    # plain send then waits for ever (seen in CI); the client's timeout covers the send too.
    def call(outcome: list, pause_s: float) -> None:
        with Client(curve_daemon.tcp, timeout_s=0.3) as client:
            time.sleep(pause_s)
            try:
                client.infer("addone", {"x": X4})
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                outcome.append(exc)

    for attempt in range(20):
        outcome: list = []
        thread = threading.Thread(target=call, args=(outcome, attempt * 0.01), daemon=True)
        thread.start()
        thread.join(5)
        assert not thread.is_alive(), f"attempt {attempt}: the client blocked past its timeout"
        assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError), outcome


def test_a_client_trusting_the_wrong_server_key_gets_nothing(curve_daemon, keys) -> None:
    options = client_options(keys / "alice", server_key=keys / "mallory" / "mallory.key")
    with pytest.raises(TimeoutError):
        infer(curve_daemon.tcp, 1.0, options)


def test_a_key_added_to_the_authorised_dir_counts_after_reload(curve_daemon, keys) -> None:
    shutil.copy(keys / "mallory" / "mallory.key", keys / "authorized")
    curve_daemon.admin().call("reload")
    assert infer(curve_daemon.tcp, 10.0, client_options(keys / "mallory" / "mallory.key_secret")).status == 200


def test_infer_and_bench_take_curve_keys(curve_daemon, keys) -> None:
    base = [sys.executable, "-m", "infermux"]
    infer_cmd = [*base, "infer", "addone", "--endpoint", curve_daemon.tcp, "--shape", "x=1x4",
                 "--curve-key", str(keys / "alice")]
    bench_cmd = [*base, "bench", "--endpoint", curve_daemon.tcp, "--model", "addone", "--shape", "x=1x4",
                 "-n", "50", "--warmup", "5", "--timeout", "5", "--curve-key", str(keys / "alice" / "alice.key_secret"),
                 "--curve-server-key", str(keys / "server" / "server.key")]
    for cmd in (infer_cmd, bench_cmd):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    assert '"status": 200' in subprocess.run(infer_cmd, capture_output=True, text=True, timeout=60).stdout


def test_keygen_makes_a_private_secret_and_says_where_things_go(tmp_path: Path) -> None:
    folder = tmp_path / "curve"
    out = subprocess.run([sys.executable, "-m", "infermux", "keygen", str(folder)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(folder / "server.key_secret") == 0o600
    assert mode(folder / "server.key") == 0o644
    assert mode(folder) == 0o700
    assert "curve_secret_key" in out.stdout and "curve_authorized_dir" in out.stdout
    public, secret = zmq.auth.load_certificate(folder / "server.key_secret")
    assert len(public) == len(secret) == 40  # z85 of 32 bytes
    again = subprocess.run([sys.executable, "-m", "infermux", "keygen", str(folder)], capture_output=True,
                           text=True, timeout=30)
    assert again.returncode == 1 and "exists" in again.stderr  # never overwrites a key silently
    client = subprocess.run([sys.executable, "-m", "infermux", "keygen", str(folder), "--name", "cam1"],
                            capture_output=True, text=True, timeout=30)
    assert client.returncode == 0 and "curve_authorized_dir" in client.stdout
    assert mode(folder / "cam1.key_secret") == 0o600


def test_client_key_lookup_explains_what_is_missing(tmp_path: Path, keys: Path) -> None:
    with pytest.raises(CurveError, match="no server public key"):
        client_options(keys / "server" / "server.key_secret", server_key=tmp_path / "nope.key")
    make_keypair(keys / "alice", "second")
    with pytest.raises(CurveError, match="several keys"):
        client_options(keys / "alice")
    with pytest.raises(CurveError, match="no secret key"):
        client_options(keys / "alice" / "alice.key", server_key=keys / "server" / "server.key")


FILE = Path("/nonexistent/infermux.toml")


@pytest.mark.parametrize("text, fragment", [
    ('listen = ["tcp://127.0.0.1:5555"]', "daemon.listen: tcp://127.0.0.1:5555 is reachable without file permissions"),
    ('listen = ["tcp://0.0.0.0:5555"]', "set curve_secret_key and curve_authorized_dir"),
    ('stats = "tcp://127.0.0.1:5556"', "daemon.stats: tcp://127.0.0.1:5556: the stats stream has no CURVE"),
    ('curve_secret_key = "/nonexistent/server.key_secret"', "daemon.curve_secret_key: /nonexistent/server.key_secret "
                                                           "is not a readable file"),
    ("allow_insecure_tcp = 1", "daemon.allow_insecure_tcp: must be bool"),
])
def test_tcp_without_curve_is_a_config_error(text: str, fragment: str) -> None:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.parse(f"[daemon]\n{text}\n", FILE)
    assert fragment in str(info.value)


def test_curve_needs_both_settings(keys: Path) -> None:
    with pytest.raises(cfg.ConfigError, match="daemon.curve_authorized_dir: CURVE needs both"):
        cfg.parse(f'[daemon]\ncurve_secret_key = "{keys}/server/server.key_secret"\n', FILE)
    config = cfg.parse(f'[daemon]\nlisten = ["tcp://127.0.0.1:1"]\ncurve_secret_key = "{keys}/server/server.key_secret"\n'
                       f'curve_authorized_dir = "{keys}/authorized"\n', FILE)
    assert config.daemon.curve_authorized_dir == keys / "authorized"


def test_allow_insecure_tcp_serves_plain_clients_and_warns(make_daemon) -> None:
    port = free_port()
    head = ('[daemon]\nlisten = ["ipc://infer.sock", "tcp://127.0.0.1:{port}"]\nengine_dir = "{engines}"\n'
            "watch = false\nallow_insecure_tcp = true\n")
    daemon = make_daemon(ADDONE, head=head, port=str(port))
    assert infer(f"tcp://127.0.0.1:{port}", 10.0).status == 200
    assert f"tcp://127.0.0.1:{port} has no CURVE (allow_insecure_tcp = true)" in daemon.log()
