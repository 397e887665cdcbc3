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

from support.harness import REPO

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
    """`infermux serve --config etc/infermux/infermux.toml`, as the README starts it, its sockets in tmp_path."""
    env = {**os.environ, "RUNTIME_DIRECTORY": str(tmp_path), "PYTHONUNBUFFERED": "1"}
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
