"""MPS for cold workers (workers/mps.py): `[daemon] mps`, each worker's MPS environment, status and doctor.

Every test here runs against a STAND-IN for nvidia-cuda-mps-control
(tests/support/fakes/bin/nvidia-cuda-mps-control, put first on PATH): it keeps the
tool's command interface (`-d`, `get_server_list`, `quit`) and a marker
file for "a control daemon runs", no GPU. What MPS does to throughput is
measured on a real GPU by the `mps` stage of tests/gpu/run.sh.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.harness import DAEMON_HEAD, FAKES
from infermux import config as cfg
from infermux.cli import doctor
from infermux.workers import mps

BIN = FAKES / "bin"


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in first on PATH; returns its log (one line per call)."""
    log = tmp_path / "mps-calls.log"
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    return log


def _parse(daemon: str, model: str = "") -> cfg.Config:
    return cfg.parse(f"[daemon]\n{daemon}\n[[models]]\nname = \"m\"\nengine = \"m.onnx\"\n{model}\n",
                     Path("/etc/infermux/infermux.toml"))


def test_the_settings_are_checked() -> None:
    c = _parse('mps = "auto"\nmps_thread_percentage = 50\nmps_pipe_dir = "/run/mps"', "mps_thread_percentage = 25")
    assert (c.daemon.mps, c.daemon.mps_thread_percentage, c.daemon.mps_pipe_dir) == ("auto", 50, Path("/run/mps"))
    assert c.models[0].mps_thread_percentage == 25
    assert _parse("").daemon.mps == "off"
    for daemon, model, where in (('mps = "yes"', "", "daemon.mps"), ("mps = true", "", "daemon.mps"),
                                 ("mps_thread_percentage = 101", "", "daemon.mps_thread_percentage"),
                                 ("", "mps_thread_percentage = -1", 'models[name="m"].mps_thread_percentage'),
                                 ("", 'mps_thread_percentage = "50%"', 'models[name="m"].mps_thread_percentage')):
        with pytest.raises(cfg.ConfigError) as exc:
            _parse(daemon, model)
        assert exc.value.path == where


def test_standin_auto_joins_only_a_running_control_daemon(standin: Path, tmp_path: Path) -> None:
    pipes = tmp_path / "pipes"
    keeper = mps.Mps()
    assert keeper.environment("auto", pipes, 30) == {}  # none runs: workers go without MPS
    assert "no MPS control daemon answers" in keeper.view("auto")["detail"]
    assert "-d|" not in standin.read_text()  # auto never starts one
    other = mps.Mps()
    assert other.environment("on", pipes, 0) == {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}
    joined = mps.Mps()
    assert joined.environment("auto", pipes, 30) == {"CUDA_MPS_PIPE_DIRECTORY": str(pipes),
                                                     "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    assert joined.view("auto")["active"] and not joined.view("auto")["started"]
    joined.close()  # it did not start the control daemon: it leaves it running
    assert (pipes / "control").exists()
    other.close()   # it did: it quits it
    assert not (pipes / "control").exists()
    assert "|quit" in standin.read_text()


def test_standin_on_fails_a_worker_start_with_the_reason(standin: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_REFUSE", "1")
    keeper = mps.Mps()
    with pytest.raises(mps.MpsUnavailable, match=r"-d started no control daemon .*already running"):
        keeper.environment("on", tmp_path / "pipes", 0)
    assert keeper.refused("on"), "no spare worker is started (and fails) on every watcher turn"
    assert "already running" in keeper.view("on")["detail"]
    with pytest.raises(mps.MpsUnavailable):  # the cached verdict: the tool is not run again at once
        keeper.environment("on", tmp_path / "pipes", 0)
    assert standin.read_text().count("-d|") == 1
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(mps.MpsUnavailable, match="not on PATH"):
        mps.Mps().environment("on", tmp_path / "pipes", 0)
    assert mps.Mps().environment("auto", tmp_path / "pipes", 0) == {}  # auto: no tool, no MPS, no error
    assert mps.Mps().environment("off", tmp_path / "pipes", 50) == {}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _worker_pid(log: str, model: str) -> int:
    found = re.findall(rf"worker_started model={model} version=1 pid=(\d+)", log)
    assert found, log
    return int(found[-1])


def test_standin_cold_workers_start_as_mps_clients_shown_in_status_and_doctor(make_daemon, standin: Path,
                                                                              tmp_path: Path) -> None:
    pipes = tmp_path / "pipes"
    # The spare starts with the daemon, without a percentage: "quarter" (loaded at start) must not take it;
    # "whole" (loaded after) takes it or its successor.
    head = DAEMON_HEAD + f'spare_worker = true\nmps = "on"\nmps_pipe_dir = "{pipes}"\n'
    models = ('[[models]]\nname = "quarter"\nengine = "addone/1/model.onnx"\nplacement = "cold"\n'
              'preload = true\nmps_thread_percentage = 25\n'
              '[[models]]\nname = "whole"\nengine = "addone/1/model.onnx"\nplacement = "cold"\n')
    d = make_daemon(models, head=head, env={"PATH": os.environ["PATH"], "FAKE_MPS_LOG": str(standin)})
    with d.admin() as admin:
        admin.call("load", model="whole")
    quarter, whole = _environ(_worker_pid(d.log(), "quarter")), _environ(_worker_pid(d.log(), "whole"))
    assert quarter["CUDA_MPS_PIPE_DIRECTORY"] == whole["CUDA_MPS_PIPE_DIRECTORY"] == str(pipes)
    assert quarter["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in whole
    assert standin.read_text().count("-d|") == 1  # started once, joined for the second worker

    status = subprocess.run([sys.executable, "-m", "infermux", "status", "--config", str(d.config_path),
                             "--runtime-dir", str(d.run_dir)], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert f"mps on: active, started the control daemon in {pipes}" in status.stdout
    shown = json.loads(subprocess.run([sys.executable, "-m", "infermux", "status", "--json", "--config",
                                       str(d.config_path), "--runtime-dir", str(d.run_dir)],
                                      capture_output=True, text=True, timeout=60).stdout)
    assert shown["daemon"]["mps"]["active"] and shown["daemon"]["mps"]["started"]

    check = {c.name: c for c in doctor.diagnose(d.config_path)}["MPS"]
    assert check.status == "OK" and f"cold workers join the control daemon in {pipes}" in check.detail
    assert d.stop() == 0, d.log()
    assert not (pipes / "control").exists(), "the daemon quits the control daemon it started"


def test_standin_doctor_says_what_mps_would_do(standin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "infermux.toml"

    def mps_check(daemon: str, model: str = "") -> doctor.Check:
        config.write_text(f'[daemon]\nengine_dir = "{tmp_path}"\n{daemon}\n'
                          f'[[models]]\nname = "m"\nengine = "m.onnx"\n{model}\n')
        return {c.name: c for c in doctor.diagnose(config)}["MPS"]

    pipes = f'mps_pipe_dir = "{tmp_path / "pipes"}"'
    assert mps_check("").status == "OK" and "off" in mps_check("").detail
    assert mps_check("", "mps_thread_percentage = 20").status == "WARN"
    auto = mps_check(f'mps = "auto"\n{pipes}')
    assert auto.status == "OK" and "run without MPS" in auto.detail
    on = mps_check(f'mps = "on"\n{pipes}')
    assert on.status == "OK" and "starts `nvidia-cuda-mps-control -d`" in on.detail
    assert "-d|" not in standin.read_text()  # doctor asks; it starts nothing
    monkeypatch.setenv("PATH", "/nonexistent")
    missing = mps_check(f'mps = "on"\n{pipes}')
    assert missing.status == "FAIL" and "not found on PATH" in missing.detail and missing.fix
