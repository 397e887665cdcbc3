"""A library a step needs and this machine lacks is named, with what to install.

A pipeline whose processors need OpenCV, on a machine without it: the file
is fine and the extra is missing, so `serve`, `doctor` and `ctl reload` say
which package to install (`pip install 'infermux[processors]'`, `apt install
python3-opencv`), never "configuration error" or "fix the file". OpenCV is
made unimportable for the daemon's processes only, by a `cv2` module on their
PYTHONPATH that fails as a missing one does; nothing is uninstalled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from support.harness import DAEMON_HEAD, Daemon

MODEL = '[[models]]\nname = "classifier"\nengine = "classifier/1/model.onnx"\n'
PIPELINE = ('[[pipelines]]\nname = "frames"\n[[pipelines.steps]]\nprocessor = "decode"\n'
            '[[pipelines.steps]]\nprocessor = "resize"\noptions = { size = [64, 64] }\n'
            '[[pipelines.steps]]\nprocessor = "normalize"\n[[pipelines.steps]]\nmodel = "classifier"\n')
INSTALL = ("pip install 'infermux[processors]'", "apt install python3-opencv")


def without_opencv(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import cv2` fails as it does where OpenCV is not installed."""
    shim = tmp_path / "no-opencv"
    shim.mkdir(exist_ok=True)
    (shim / "cv2.py").write_text('raise ModuleNotFoundError("No module named \'cv2\'", name="cv2")\n')
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))}


def infermux(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infermux", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def says_what_to_install(text: str) -> None:
    assert all(way in text for way in INSTALL), text
    assert "OpenCV" in text and "configuration error" not in text and "fix the file" not in text, text
    assert "Traceback" not in text, text


def test_serve_names_the_missing_library_and_how_to_install_it(tmp_path: Path, engines: Path) -> None:
    d = Daemon(tmp_path, DAEMON_HEAD.format(engines=engines) + MODEL + PIPELINE)
    run = infermux("serve", "--config", str(d.config_path), "--runtime-dir", str(d.run_dir),
                   env=without_opencv(tmp_path))
    assert run.returncode == 1, run.stderr
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("infermux:")]
    says_what_to_install(line)
    assert "'decode'" in line  # the step that needs it


def test_doctor_names_the_missing_library(tmp_path: Path, engines: Path) -> None:
    d = Daemon(tmp_path, DAEMON_HEAD.format(engines=engines) + MODEL + PIPELINE)
    run = infermux("doctor", "--config", str(d.config_path), "--runtime-dir", str(d.run_dir),
                   env=without_opencv(tmp_path))
    (line,) = [line for line in run.stdout.splitlines() if "OpenCV" in line]
    assert "FAIL" in line, run.stdout
    says_what_to_install(line)
    assert run.returncode == 1


def test_ctl_reload_names_the_missing_library_and_keeps_serving(make_daemon, tmp_path: Path) -> None:
    env = without_opencv(tmp_path)
    d = make_daemon(MODEL, env=env)
    d.config_path.write_text(d.config_path.read_text() + PIPELINE)
    run = infermux("ctl", "reload", "--endpoint", d.admin_endpoint, env=env)
    assert run.returncode == 1, run.stderr
    (line,) = run.stderr.strip().splitlines()
    says_what_to_install(line)
    with d.client() as client:
        assert client.infer("classifier", {"images": np.zeros((1, 3, 64, 64), np.float32)}).status == 200


def test_top_without_textual_says_what_to_install(tmp_path: Path) -> None:
    """An install without the `tui` extra: `infermux top` says which extra, in one line, exit 1."""
    shim = tmp_path / "no-textual"
    shim.mkdir()
    (shim / "textual.py").write_text('raise ModuleNotFoundError("No module named \'textual\'", name="textual")\n')
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))}
    run = infermux("top", "--admin", "ipc:///nonexistent/admin.sock", "--stats", "ipc:///nonexistent/stats.sock",
                   env=env)
    assert run.returncode == 1, run.stderr
    (line,) = run.stderr.splitlines()
    assert line.startswith("infermux top: ") and "Textual" in line and "pip install 'infermux[tui]'" in line, line
