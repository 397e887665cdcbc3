"""One daemon per socket: a second `infermux serve` on the same sockets refuses to start.

libzmq deletes whatever file lies where it binds an ipc:// socket, so without
a lock a second daemon would take the first one's sockets over and delete them
when it stopped, leaving the first loaded and unreachable. The second daemon
must say which process holds the sockets and exit 4 (docs/operating.md), touching
nothing; a daemon that was SIGKILLed holds nothing, and its stale socket files
are taken over. A stopping daemon deletes only the socket files it bound itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import zmq

from support.harness import DAEMON_HEAD, Daemon

MODEL = '[[models]]\nname = "addone"\nengine = "addone/1/model.onnx"\n'
X = {"x": np.ones((1, 4), np.float32)}
ALREADY_SERVING = 4


def serve(d: Daemon, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`infermux serve` with `d`'s runtime directory, run to its end."""
    return subprocess.run([sys.executable, "-m", "infermux", "serve", "--config", str(config or d.config_path),
                           "--runtime-dir", str(d.run_dir), "--state-dir", str(d.state_dir)],
                          capture_output=True, text=True, timeout=60)


def refusal(run: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused start says (the log lines before it say what it checked)."""
    assert "Traceback" not in run.stderr, run.stderr
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("infermux:")]
    return line


def sockets(d: Daemon) -> dict[str, int]:
    """The daemon's socket files and their inodes."""
    return {p.name: p.stat().st_ino for p in d.run_dir.glob("*.sock")}


def test_a_second_daemon_on_the_same_sockets_refuses_and_leaves_the_first_serving(make_daemon) -> None:
    first = make_daemon(MODEL)
    before = sockets(first)
    second = serve(first)
    assert second.returncode == ALREADY_SERVING, second.stderr
    line = refusal(second)
    assert f"pid {first.proc.pid}" in line and "runtime directory" in line, line
    assert sockets(first) == before  # not re-bound, not deleted
    with first.client() as client:
        assert client.infer("addone", X).status == 200
    with first.admin() as admin:
        assert admin.call("status")["daemon"]


def test_a_second_daemon_with_its_own_runtime_dir_but_the_same_socket_names_the_socket(make_daemon, tmp_path) -> None:
    first = make_daemon(MODEL)
    shared = f"ipc://{first.run_dir / 'infer.sock'}"
    other = tmp_path / "other.toml"
    other.write_text(first.config_path.read_text().replace('"ipc://infer.sock"', f'"{shared}"'))
    run = subprocess.run([sys.executable, "-m", "infermux", "serve", "--config", str(other),
                          "--runtime-dir", str(tmp_path / "other-run"), "--state-dir", str(tmp_path / "other-state")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == ALREADY_SERVING, run.stderr
    line = refusal(run)
    assert f"pid {first.proc.pid}" in line and shared in line, line
    with first.client() as client:
        assert client.infer("addone", X).status == 200


def test_a_process_listening_without_the_lock_is_named_and_its_socket_left_alone(tmp_path, engines) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ctx = zmq.Context.instance()
    squatter = ctx.socket(zmq.ROUTER)  # an older daemon, or another program: it holds no lock
    squatter.setsockopt(zmq.LINGER, 0)
    squatter.bind(f"ipc://{run_dir / 'infer.sock'}")
    try:
        d = Daemon(tmp_path, (DAEMON_HEAD + MODEL).format(engines=engines))
        inode = (run_dir / "infer.sock").stat().st_ino
        run = serve(d)
        assert run.returncode == ALREADY_SERVING, run.stderr
        line = refusal(run)
        assert f"pid {os.getpid()}" in line and "infer.sock" in line, line
        assert (run_dir / "infer.sock").stat().st_ino == inode
    finally:
        squatter.close()


def test_a_killed_daemons_stale_sockets_are_taken_over(make_daemon) -> None:
    first = make_daemon(MODEL)
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    assert (first.run_dir / "infer.sock").exists()  # stale: nobody listens
    second = Daemon(first.workdir, first.config_path.read_text())
    second.log_path = first.workdir / "second.log"
    second.start()
    try:
        with second.client() as client:
            assert client.infer("addone", X).status == 200
    finally:
        assert second.stop() == 0, second.log()
    assert not (first.run_dir / "infer.sock").exists()  # its own file, so it removed it


def test_a_stopping_daemon_leaves_a_socket_another_process_bound_at_its_path_since(make_daemon) -> None:
    first = make_daemon(MODEL)
    path = first.run_dir / "infer.sock"
    path.unlink()  # e.g. a cleaner swept the runtime directory, and another program bound the name since
    ctx = zmq.Context.instance()
    newcomer = ctx.socket(zmq.ROUTER)
    newcomer.setsockopt(zmq.LINGER, 0)
    newcomer.bind(f"ipc://{path}")
    try:
        inode = path.stat().st_ino
        assert first.stop() == 0, first.log()
        assert path.stat().st_ino == inode  # not the file the daemon bound: left where it is
        caller = ctx.socket(zmq.DEALER)
        caller.setsockopt(zmq.LINGER, 0)
        try:
            caller.connect(f"ipc://{path}")
            caller.send(b"still here")
            assert newcomer.poll(5000), "the newcomer's socket no longer receives"
            assert newcomer.recv_multipart()[-1] == b"still here"
        finally:
            caller.close()
    finally:
        newcomer.close()
