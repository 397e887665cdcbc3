"""The README's client commands run as written, from a checkout, against the sample configuration.

The README starts the daemon with `--config etc/infermux/infermux.toml` and
then shows `status`, `infer`, `bench` and `ctl` without `-c`: a checkout has
no /etc/infermux/infermux.toml, so they find the default sockets in the
runtime directory, where the sample configuration's daemon listens. Here the
runtime directory is the test's own ($RUNTIME_DIRECTORY, as systemd sets it),
so the test never meets another daemon.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.harness import REPO, Daemon

README = REPO / "README.md"
SAMPLE = REPO / "etc" / "infermux" / "infermux.toml"


def readme_commands() -> list[str]:
    """The README's `.venv/bin/infermux ...` client commands, comments stripped; `top` is interactive."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if re.match(r"\.venv/bin/infermux (status|ctl|infer|bench)\b", line)
            and "--image" not in line and not re.match(r"\S+ bench ocr\b", line)]
    # (not the OCR example's infer and bench, which need its own daemon and models)


@pytest.fixture
def sample_daemon(tmp_path: Path):
    """`infermux serve --config etc/infermux/infermux.toml`, as the README starts it, its sockets in tmp_path
    and its live changes in tmp_path/state ($STATE_DIRECTORY, as systemd sets it): the README's `ctl set`
    must not land in this machine's /var/lib/infermux, where every later daemon would serve it."""
    env = {**os.environ, "RUNTIME_DIRECTORY": str(tmp_path), "STATE_DIRECTORY": str(tmp_path / "state"),
           "PYTHONUNBUFFERED": "1"}
    env.pop("INFERMUX_CONFIG", None)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "infermux", "serve", "--config", str(SAMPLE)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while " ready " not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        yield env
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_readmes_client_commands_run_from_a_checkout_without_c(sample_daemon: dict[str, str]) -> None:
    commands = readme_commands()
    assert {c.split()[1] for c in commands} >= {"status", "infer", "bench", "ctl"}, commands
    assert not [c for c in commands if re.search(r"\s(-c|--config)\s", c)]
    assert not Path("/etc/infermux/infermux.toml").exists(), "an installed configuration would be read instead"
    for command in commands:
        argv = shlex.split(command)
        argv = [sys.executable, "-m", "infermux", *argv[1:]]
        if argv[3] == "bench":
            argv = [a if a != "5" else "1" for a in argv]  # --duration 5: one second says as much here
        run = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=sample_daemon, cwd=REPO)
        assert run.returncode == 0, f"{command}: {run.stderr}"
    if any(" ctl set " in c for c in commands):  # the live change was kept in the test's own state folder
        assert (Path(sample_daemon["STATE_DIRECTORY"]) / "overrides.json").is_file()


def readme_ocr_block() -> list[str]:
    """The README's shell block that serves the OCR example, a command per line, comments stripped."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    block = next(b for b in blocks if "examples/ocr.toml" in b)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readmes_ocr_commands_install_opencv_and_read_the_page_they_draw(tmp_path: Path) -> None:
    pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")
    lines = readme_ocr_block()
    serve = next(i for i, line in enumerate(lines) if " serve " in line)
    assert any("processors" in line and "pip install" in line for line in lines[:serve]), lines
    engines = tmp_path / "ppocr"
    fetch = subprocess.run([sys.executable, str(REPO / "engines/fetch_ppocr.py"), "--into", str(engines)],
                           capture_output=True, text=True, timeout=120)
    assert fetch.returncode == 0, fetch.stderr
    text = (REPO / "etc/infermux/examples/ocr.toml").read_text()
    (tmp_path / "d").mkdir()
    config = text.replace('engine_dir = "../../../engines/ppocr"', f'engine_dir = "{engines}"')
    daemon = Daemon(tmp_path / "d", config).start(timeout=120)
    try:
        draw = next(shlex.split(line) for line in lines if line.startswith(".venv/bin/python -c"))
        subprocess.run([sys.executable, *draw[1:]], check=True, cwd=tmp_path, timeout=60)
        infer = shlex.split(next(line for line in lines if " infer ocr " in line))
        argv = [sys.executable, "-m", "infermux", *infer[1:]]
        argv[argv.index("--config") + 1] = str(daemon.config_path)
        env = {**os.environ, "RUNTIME_DIRECTORY": str(daemon.run_dir)}  # this test's daemon, not one at /run
        run = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        assert run.returncode == 0 and "'infermux reads this'" in run.stdout, run.stdout + run.stderr
    finally:
        assert daemon.stop() == 0, daemon.log()[-3000:]
