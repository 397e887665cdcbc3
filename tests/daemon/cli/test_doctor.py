"""`infermux doctor`: each check's verdict and fix, here (onnxruntime, no GPU) and against the TensorRT stand-in."""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support.fakes.tensorrt import PLAN_MAGIC, write_plan
from support.harness import REPO
from infermux.cli import doctor
from infermux.models import budget
from support.users import infermux_as

pytest_plugins = ["support.fakes.tensorrt"]  # fake_gpu, fake_trt fixtures

SAMPLE = REPO / "etc/infermux/infermux.toml"


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infermux", "doctor", *args], capture_output=True, text=True,
                          timeout=120)


def _by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


def test_on_this_machine_it_passes_and_says_what_it_found() -> None:
    r = _doctor("--config", str(SAMPLE))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert all(line.split()[0] in ("OK", "WARN") for line in lines), r.stdout
    python = next(line for line in lines if " Python: " in line)
    assert f" on {platform.machine()} ({sys.executable})" in python  # which architecture the report is from
    ort = next(line for line in lines if " onnxruntime: " in line)
    assert ort.startswith("OK") and "CPUExecutionProvider" in ort
    gpu = next(line for line in lines if " GPU: " in line)
    if not budget.is_jetson() and budget.Nvml.open() is None:
        # No GPU here: said once, cleanly, with what to do on a GPU machine.
        assert gpu.startswith("WARN") and "no NVIDIA GPU found" in gpu and "->" in gpu


def test_json_lists_every_check() -> None:
    r = _doctor("--config", str(SAMPLE), "--json")
    assert r.returncode == 0, r.stderr
    checks = json.loads(r.stdout)
    assert {c["status"] for c in checks} <= {"OK", "WARN", "FAIL"}
    names = {c["name"] for c in checks}
    assert {"Python", "numpy", "pyzmq", "onnxruntime", "TensorRT", "cuda-python", "GPU", "configuration",
            "engine_dir", "sockets", "group", "RLIMIT_NOFILE", "memory budget", "MPS"} <= names
    assert all(c["fix"] for c in checks if c["status"] != "OK")


def test_a_missing_configuration_fails_in_one_line(tmp_path: Path) -> None:
    r = _doctor("--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr
    fail = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and "configuration" in fail[0] and "nope.toml" in fail[0]


@pytest.mark.skipif(Path(doctor.DEFAULT_CONFIG).exists(), reason="an installed configuration is the one checked")
def test_without_config_it_finds_the_daemon_as_status_does(make_daemon, tmp_path: Path) -> None:
    d = make_daemon('[[models]]\nname = "classifier"\nengine = "classifier/1/model.onnx"\n')
    env = {k: v for k, v in os.environ.items() if k != "INFERMUX_CONFIG"}

    def doctor_in(run_dir: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infermux", "doctor", "--runtime-dir", str(run_dir)],
                              capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    status = subprocess.run([sys.executable, "-m", "infermux", "status", "--runtime-dir", str(d.run_dir)],
                            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert status.returncode == 0, status.stderr  # the other client commands find it so
    found = doctor_in(d.run_dir)
    assert found.returncode == 0, found.stdout + found.stderr
    lines = found.stdout.splitlines()
    assert any(line.startswith("OK    daemon: ") and f"serving {d.config_path}" in line for line in lines), lines
    assert any(line.startswith("OK    configuration: ") and str(d.config_path) in line for line in lines), lines
    assert any(line.startswith("OK    engine classifier 1") for line in lines), lines
    alone = doctor_in(tmp_path / "no-daemon")  # nothing listens there: the installed path, missing, and what to do
    fail = [line for line in alone.stdout.splitlines() if line.startswith("FAIL")]
    assert alone.returncode == 1 and len(fail) == 1, alone.stdout + alone.stderr
    assert doctor.DEFAULT_CONFIG in fail[0] and "give --config FILE" in fail[0], fail


def test_a_missing_or_unreadable_engine_fails_with_its_path(tmp_path: Path) -> None:
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nengine_dir = "{tmp_path}"\n[[models]]\nname = "gone"\n'
                      f'engine = "{tmp_path}/gone/1/model.onnx"\n')
    checks = _by_name(doctor.diagnose(config))
    assert checks["engine gone 1"].status == "FAIL"
    assert f"{tmp_path}/gone/1/model.onnx does not exist" in checks["engine gone 1"].detail
    assert checks["configuration"].status == "OK"


def test_a_low_open_files_limit_warns() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        check = doctor._nofile()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert check.status == "WARN" and "256" in check.detail and "LimitNOFILE" in check.fix


@pytest.mark.parametrize("version, status", [
    ("12.6.2", "FAIL"), ("12.9.0", "FAIL"), ("12.9.1", "OK"), ("12.9.2.post1", "OK"), ("13.0.0", "OK"),
    ("13.1.1", "OK"),
])
def test_cuda_python_that_holds_the_gil_fails_with_tensorrt(fake_trt, monkeypatch, version: str,
                                                             status: str) -> None:
    monkeypatch.setattr(doctor, "_version", lambda dist: version)
    check = doctor._cuda_python(tensorrt_ok=True)
    assert check.status == status, check
    if status == "FAIL":
        assert "holds the GIL" in check.detail and "cuda-python>=12.9.1" in check.fix


def test_without_cuda_python_tensorrt_cannot_run(fake_trt, monkeypatch) -> None:
    monkeypatch.setattr(doctor, "_version", lambda dist: None)
    assert doctor._cuda_python(tensorrt_ok=True).status == "FAIL"
    assert doctor._cuda_python(tensorrt_ok=False).status == "WARN"  # onnxruntime-only box


def test_tensorrt_lines_against_the_stand_in(fake_trt, tmp_path: Path) -> None:
    (tmp_path / "det/1").mkdir(parents=True)
    (tmp_path / "old/1").mkdir(parents=True)
    good = write_plan(tmp_path / "det/1")
    stale = tmp_path / "old/1/model.plan"
    stale.write_bytes(b"built by another TensorRT" + bytes(100))
    assert not stale.read_bytes().startswith(PLAN_MAGIC)
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nengine_dir = "{tmp_path}"\n'
                      f'[[models]]\nname = "det"\nengine = "{good}"\n'
                      f'[[models]]\nname = "old"\nengine = "{stale}"\n')
    checks = _by_name(doctor.diagnose(config))
    assert checks["TensorRT"].status == "OK" and checks["TensorRT"].detail == "10.3.0"
    assert checks["engine det 1"].status == "OK" and "deserializes on TensorRT 10.3.0" in checks["engine det 1"].detail
    old = checks["engine old 1"]
    assert old.status == "FAIL" and "not compatible" in old.detail and "infermux build" in old.fix


def test_plans_found_in_the_engine_dir_are_checked_too(fake_trt, tmp_path: Path) -> None:
    # After a JetPack upgrade, the operator's deployed plans are what stops working.
    (tmp_path / "cam/3").mkdir(parents=True)
    (tmp_path / "cam/3/model.plan").write_bytes(b"an older TensorRT's plan" + bytes(64))
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nengine_dir = "{tmp_path}"\n')
    check = _by_name(doctor.diagnose(config))["engine cam 3"]
    assert check.status == "FAIL" and str(tmp_path / "cam/3/model.plan") in check.detail


def test_a_tensorrt_too_old_fails(fake_trt) -> None:
    fake_trt.__version__ = "8.6.1"
    check = doctor._tensorrt()
    assert check.status == "FAIL" and "8.6.1" in check.detail


def test_release_numbers() -> None:
    assert doctor._release("12.9.1") == (12, 9, 1)
    assert doctor._release("12.9.2.post1") == (12, 9, 2)
    assert doctor._release("13.0.0rc1") == (13, 0, 0)
    assert doctor._release("10.3.0.30") == (10, 3, 0, 30)


def test_a_caller_outside_the_sockets_folder_is_told_to_join_the_group(tmp_path: Path, traversable: None) -> None:
    # Run as nobody (setpriv, so root only) against a runtime folder like /run/infermux: 0750, not theirs.
    import os

    if os.geteuid() != 0:
        pytest.skip("running doctor as another user needs root")
    top = Path(tempfile.mkdtemp(prefix="infermux-doctor-"))
    try:
        top.chmod(0o755)
        run = top / "run"
        run.mkdir(mode=0o750)
        run.chmod(0o750)
        (run / "infer.sock").touch()
        config = top / "infermux.toml"
        config.write_text(f'[daemon]\nruntime_dir = "{run}"\nengine_dir = "{top}"\n')
        r = subprocess.run([*infermux_as("nobody"), "doctor", "--config", str(config)], capture_output=True,
                           text=True, timeout=120)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(line for line in r.stdout.splitlines() if " sockets: " in line)
    assert line.startswith("FAIL") and "adduser" in line


def test_under_engine_signing_keys_each_engines_signature_is_checked(tmp_path: Path) -> None:
    from infermux import signing
    from support import models

    private, public = signing.keygen(tmp_path / "publisher")
    signed = models.add_one(tmp_path / "engines" / "signed" / "1" / "model.onnx")
    signing.sign(signing.load_private(private), signed)
    models.add_one(tmp_path / "engines" / "unsigned" / "1" / "model.onnx")
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nengine_dir = "{tmp_path}/engines"\nengine_signing_keys = ["{public}"]\n'
                      + "".join(f'[[models]]\nname = "{m}"\nengine = "{m}/1/model.onnx"\n'
                                for m in ("signed", "unsigned")))
    checks = _by_name(doctor.diagnose(config))
    assert checks["signature signed 1"].status == "OK"
    assert checks["signature unsigned 1"].status == "FAIL" and "is not signed" in checks["signature unsigned 1"].detail
    assert "infermux sign --key" in checks["signature unsigned 1"].fix


def _silent_server() -> tuple[socket.socket, int]:
    """A TCP port that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server, server.getsockname()[1]


def test_each_camera_is_opened_once_and_says_its_decoder_or_what_to_do(tmp_path: Path, engines: Path,
                                                                         monkeypatch) -> None:
    pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
    from support.camera_files import camera, write_clip
    from support.harness import free_port
    from support.pipelines import camera_pipeline

    clip = write_clip(tmp_path / "front.mp4", 64, 48, frames=5)
    server, silent_port = _silent_server()
    cameras = (camera("front", str(clip)) + camera("far", f"rtsp://127.0.0.1:{free_port()}/never", transport="tcp")
               + camera("mute", f"rtsp://127.0.0.1:{silent_port}/live") + camera("gone", str(tmp_path / "gone.mp4"),
                                                                                 enabled=False))
    config = tmp_path / "infermux.toml"
    config.write_text((f'[daemon]\nengine_dir = "{engines}"\n[[models]]\nname = "classifier"\n'
                       'engine = "classifier/1/model.onnx"\n' + camera_pipeline("cams") + cameras).format())
    monkeypatch.setattr(doctor, "CAMERA_PROBE_S", 1.5)  # the silent camera's bound, not FFmpeg's own timeout
    try:
        checks = _by_name(doctor.diagnose(config))
    finally:
        server.close()
    front, far, mute, gone = (checks[f"camera {n}"] for n in ("front", "far", "mute", "gone"))
    assert front.status == "OK" and front.detail.startswith("software (FFmpeg through PyAV")
    assert "a 64x48 frame in" in front.detail
    assert far.status == "FAIL" and "Connection refused" in far.detail and "rtsp://127.0.0.1" in far.detail
    assert "reachable from this box" in far.fix and 'transport = "tcp"' in far.fix
    assert mute.status == "FAIL" and "no frame within 1.5 s" in mute.detail
    assert gone.status == "WARN" and gone.detail.endswith("(disabled)") and "ffprobe" in gone.fix
    assert len(far.line().splitlines()) == 1


def test_doctor_without_cameras_has_no_camera_line(tmp_path: Path) -> None:
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nengine_dir = "{tmp_path}"\n')
    assert not [c for c in doctor.diagnose(config) if c.name.startswith("camera ")]


def test_each_sink_is_reached_once_and_says_what_is_wrong_in_one_line(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("paho.mqtt", reason="the mqtt sink needs paho-mqtt: pip install -e '.[mqtt]'")
    from support.harness import free_port
    from support.sinks import Endpoint, Mosquitto

    broker = Mosquitto(tmp_path / "broker").start()
    hook, (silent, silent_port) = Endpoint([200]), _silent_server()
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    sinks = {"broker": ("mqtt", f'{{ host = "127.0.0.1", port = {broker.port} }}'),
             "nobroker": ("mqtt", f'{{ host = "127.0.0.1", port = {free_port()} }}'),
             "mute": ("mqtt", f'{{ host = "127.0.0.1", port = {silent_port} }}'),
             "hook": ("webhook", f'{{ url = "{hook.url}" }}'),
             "nohook": ("webhook", f'{{ url = "http://127.0.0.1:{free_port()}/x" }}'),
             "pub": ("zmq", f'{{ bind = "tcp://127.0.0.1:{free_port()}" }}'),
             "held": ("zmq", f'{{ bind = "tcp://127.0.0.1:{held.getsockname()[1]}" }}'),
             "files": ("jsonl", f'{{ path = "{tmp_path / "new" / "events.jsonl"}" }}'),
             "nofiles": ("jsonl", f'{{ path = "{blocker / "events.jsonl"}" }}')}
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nengine_dir = "{tmp_path}"\n' + "".join(
        f'[[sinks]]\nname = "{name}"\nkind = "{kind}"\noptions = {options}\n' for name, (kind, options) in sinks.items()))
    monkeypatch.setattr(doctor, "SINK_PROBE_S", 1.5)  # the silent broker's bound
    held.listen(1)  # libzmq's bind fails on a port another socket listens on
    try:
        checks = _by_name(doctor.diagnose(config))
    finally:
        silent.close()
        held.close()
        hook.close()
        broker.stop()
    got = {name: checks[f"sink {name} ({kind})"] for name, (kind, _) in sinks.items()}
    assert [n for n, c in got.items() if c.status == "OK"] == ["broker", "hook", "pub", "files"], got
    assert "accepted the connection" in got["broker"].detail and f":{broker.port}" in got["broker"].detail
    assert got["nobroker"].status == "FAIL" and "refused" in got["nobroker"].detail.lower()
    assert "broker runs" in got["nobroker"].fix
    assert got["mute"].status == "FAIL" and "did not accept the connection" in got["mute"].detail
    assert got["nohook"].status == "FAIL" and "ConnectionRefusedError" in got["nohook"].detail
    assert got["held"].status == "WARN" and "in use" in got["held"].detail
    assert got["nofiles"].status == "FAIL" and "not a folder" in got["nofiles"].detail
    assert not (tmp_path / "new").exists()  # the probe makes nothing
    assert hook.posts == 0  # and sends no event
    assert all(len(c.line().splitlines()) == 1 for c in got.values())
