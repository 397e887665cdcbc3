"""Start the real daemon (`python -m infermux serve`) for end-to-end tests."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Iterator

import zmq

from infermux.client import AdminClient, Client, Pipeline

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
FAKES = SUPPORT / "fakes"  # stand-ins: TensorRT, MPS control, misbehaving plugins


def example(name: str) -> ModuleType:
    """examples/<name>.py loaded as a module (examples/ is not a package), for tests and benchmarks."""
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DAEMON_HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
max_message_bytes = 1048576
watch = false  # these tests serve exactly their [[models]]; hot swap has its own (test_hot_swap.py)
"""
# DAEMON_HEAD's template for a daemon that also listens on TCP under CURVE: its server key and the
# clients' it authorises under the folder `keys` (the layout `infermux keygen` writes), port `port`.
CURVE_HEAD = """
[daemon]
listen = ["tcp://127.0.0.1:{port}", "ipc://infer.sock"]
engine_dir = "{engines}"
watch = false
curve_secret_key = "{keys}/server/server.key_secret"
curve_authorized_dir = "{keys}/authorized"
"""


Value = str | int | float | bool | Path  # a setting's value in a configuration the tests write


def toml_value(value: Value) -> str:
    """`value` as TOML writes it (a string or path quoted and escaped)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # JSON's escapes are TOML's basic string's


def toml_lines(settings: dict[str, Value]) -> str:
    return "".join(f"{key} = {toml_value(value)}\n" for key, value in settings.items())


def daemon_head(engine_dir: Path, **settings: Value) -> str:
    """A `[daemon]` table listening on ipc://infer.sock (in its runtime dir) with `engine_dir` and `settings`."""
    return '\n[daemon]\nlisten = ["ipc://infer.sock"]\n' + toml_lines({"engine_dir": engine_dir, **settings})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dealer(endpoint: str) -> Iterator[zmq.Socket]:
    """A DEALER socket connected to `endpoint` (no linger), closed on leaving."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close()


def exchange(endpoint: str, kind: int, frames: list[bytes], timeout_ms: int = 5000) -> list[bytes]:
    """One raw request/reply on a fresh socket of `kind` (REQ or DEALER), frames exactly as given."""
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        assert sock.poll(timeout_ms), f"no reply from {endpoint} within {timeout_ms} ms"
        return sock.recv_multipart()
    finally:
        sock.close()


# Two versions of one model plus a second model: what admin and console tests steer.
TWO_VERSIONS_AND_FAST = """
[[models]]
name = "addone"
version = "1"
engine = "addone/1/model.onnx"
[[models]]
name = "addone"
version = "2"
engine = "addone/2/model.onnx"
[[models]]
name = "fast"
engine = "fast512/1/model.onnx"
"""


class Daemon:
    """One daemon process with its own config, runtime dir and log file."""

    def __init__(self, workdir: Path, config_text: str, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None) -> None:
        self.workdir = workdir
        self.run_dir = workdir / "run"
        self.state_dir = workdir / "state"  # live changes (overrides.json): the test's own, kept across restarts
        self.config_path = workdir / "infermux.toml"
        self.log_path = workdir / "daemon.log"
        self.config_path.write_text(config_text)
        self.env = env or {}
        self.prefix = prefix or []  # e.g. ["prlimit", "--nofile=1024", "--"]: the command runs under it
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"ipc://{self.run_dir / 'infer.sock'}"

    @property
    def admin_endpoint(self) -> str:
        return f"ipc://{self.run_dir / 'admin.sock'}"

    @property
    def stats_endpoint(self) -> str:
        return f"ipc://{self.run_dir / 'stats.sock'}"

    def admin(self, timeout_s: float = 30.0) -> AdminClient:
        return AdminClient(self.admin_endpoint, timeout_s=timeout_s)

    def start(self, wait_ready: bool = True, timeout: float = 30.0) -> "Daemon":
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKES / "plugins"), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        since = len(self.log())  # a restart waits for its own lines, not the last run's
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "infermux", "serve", "--config", str(self.config_path),
             "--runtime-dir", str(self.run_dir), "--state-dir", str(self.state_dir)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        self.wait_for("listening", timeout, since)
        if wait_ready:
            self.wait_for(" ready ", timeout, since)
        return self

    def wait_for(self, text: str, timeout: float = 30.0, since: int = 0) -> None:
        """Block until the log holds `text` (after its first `since` characters); fail with the log if
        the daemon exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log()[since:]:
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise AssertionError(f"{text!r} not in the daemon log after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, timeout_s: float = 10.0) -> Client:
        return Client(self.endpoint, timeout_s=timeout_s)

    def pipeline(self, timeout_s: float = 10.0) -> Pipeline:
        return Pipeline(self.endpoint, timeout_s=timeout_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code (kills on timeout)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"daemon did not stop within {timeout} s:\n{self.log()}")
        self._log.close()
        return self.proc.returncode

    def ctl(self, *words: str) -> subprocess.CompletedProcess[str]:
        """`infermux ctl WORDS` as an operator types it: the daemon found from its config file and runtime dir."""
        return subprocess.run([sys.executable, "-m", "infermux", "ctl", *words, "-c", str(self.config_path),
                               "--runtime-dir", str(self.run_dir)], capture_output=True, text=True, timeout=30)
