"""`infermux top` in a real terminal (tmux): it starts, shows the daemon's models in 256 colours, quits on q.

tmux forwards no COLORTERM, like ssh: the console must draw in the 256-colour
palette there. Skipped when tmux is missing and cannot be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from support.harness import Daemon
from support.polling import eventually

MODELS = """
[[models]]
name = "addone"
engine = "addone/1/model.onnx"
[[models]]
name = "fast512"
engine = "fast512/1/model.onnx"
"""


def tmux_binary() -> str:
    """tmux, installed with apt-get when missing and allowed; skip otherwise."""
    found = shutil.which("tmux")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "install", "-y", "-qq", "tmux"], ["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "tmux"]):
            try:
                subprocess.run(cmd, env=env, capture_output=True, timeout=180)
            except (OSError, subprocess.TimeoutExpired):
                break
            if shutil.which("tmux"):
                return shutil.which("tmux")  # type: ignore[return-value]
    pytest.skip("tmux is not installed and could not be installed")


def test_top_runs_in_tmux_and_shows_the_models(make_daemon) -> None:
    tmux = tmux_binary()
    d: Daemon = make_daemon(MODELS)
    server = f"infermux-test-{os.getpid()}"  # a private tmux server: the user's sessions are never touched
    top = (f"env -u COLORTERM TERM=xterm-256color {sys.executable} -m infermux top "
           f"--config {d.config_path} --runtime-dir {d.run_dir}")
    run = lambda *args: subprocess.run([tmux, "-L", server, *args], capture_output=True, text=True, timeout=10)  # noqa: E731
    try:
        assert run("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", top).returncode == 0
        deadline, pane = time.monotonic() + 20, ""
        while time.monotonic() < deadline:
            pane = run("capture-pane", "-p", "-t", "top").stdout
            if "addone" in pane and "fast512" in pane and "ready" in pane:
                break
            time.sleep(0.2)
        assert "addone" in pane and "fast512" in pane, pane
        assert "Traceback" not in pane
        colours = run("capture-pane", "-p", "-e", "-t", "top").stdout
        assert "38;5;" in colours or "48;5;" in colours, "no 256-colour codes"
        assert "38;2;" not in colours and "48;2;" not in colours, "truecolour codes where none was advertised"
        run("send-keys", "-t", "top", "q")
        eventually(lambda: run("has-session", "-t", "top").returncode != 0, "q to quit top", 10, interval_s=0.1)
    finally:
        run("kill-server")


def test_top_refuses_a_missing_configuration_without_a_traceback(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "infermux", "top", "--config", str(tmp_path / "none.toml")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "none.toml" in out.stderr and "Traceback" not in out.stderr
