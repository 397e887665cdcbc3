"""The client commands as a user runs them: real subprocesses against a real daemon (or none).

Each failure mode is one row of FAILURES: the command line, the exit code
docs/operating.md ("Status and control") and infermux(1) document, and a phrase the one-line
message must hold. Every row also checks that stderr is a line or two with
no traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from support.harness import DAEMON_HEAD, Daemon

MODELS = """
[[models]]
name = "addone"
engine = "addone/1/model.onnx"
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
[[models]]
name = "broken"
engine = "broken/1/model.onnx"
"""


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    """A daemon serving two models and one that failed to load (its engine file is not ONNX)."""
    root = tmp_path_factory.mktemp("cli")
    own = root / "engines"
    shutil.copytree(engines, own)
    (own / "broken/1").mkdir(parents=True)
    (own / "broken/1/model.onnx").write_bytes(b"\x08 not an onnx model" * 64)
    workdir = root / "daemon"
    workdir.mkdir()
    daemon = Daemon(workdir, (DAEMON_HEAD + MODELS).format(engines=own)).start()
    yield daemon
    daemon.stop()


@dataclass(frozen=True)
class Case:
    """One command line, with {cfg}, {run}, {infer}, {admin}, {none} and {broken} filled in from the daemon."""

    name: str
    argv: str
    code: int
    says: str
    env: dict[str, str] = field(default_factory=dict)


WHERE = "--config {cfg} --runtime-dir {run}"
FAILURES = [
    Case("status: no daemon", "status -e {none}", 3, "is `infermux serve` running?"),
    Case("ctl: no daemon, at once", "ctl reload -e {none}", 3, "is `infermux serve` running?"),
    Case("infer: no daemon", "infer addone -e {none} --shape x=1x4", 3, "is `infermux serve` running?"),
    Case("infer: no daemon to ask for shapes", "infer addone -e {none}", 3, "--shape"),
    Case("bench: no daemon", "bench addone -e {none} --shape x=1x4 -n 1 --timeout 1", 3, "no daemon"),
    Case("status -e names the admin socket", "status -e {infer}", 2, "is not the admin socket"),
    Case("ctl -e names the admin socket", "ctl models -e {infer}", 2, "is not the admin socket"),
    Case("status: no configuration anywhere", "status", 2, "give --config",
         env={"INFERMUX_CONFIG": "/nonexistent/infermux.toml"}),
    Case("status: -c names a missing file", "status -c /nonexistent/infermux.toml", 2, "cannot read"),
    Case("status: malformed endpoint", "status -e nonsense", 2, "cannot use that socket"),
    Case("status --check: a model failed", f"status --check {WHERE}", 1, "broken:1"),
    Case("ctl: refused", f"ctl set addone contexts=0 {WHERE}", 1, "contexts"),
    Case("ctl: unknown model", f"ctl set nosuch contexts=2 {WHERE}", 1, "nosuch"),
    Case("ctl: a third positional word", f"ctl set addone 1 extra {WHERE}", 2, "key=value"),
    Case("ctl: weights that do not parse", f"ctl set addone weights=1:x {WHERE}", 2, "VERSION:WEIGHT"),
    Case("ctl: no weights", f"ctl set addone weights= {WHERE}", 1, "VERSION:WEIGHT,... (e.g. 1:90,2:10"),
    Case("ctl reload: the daemon refuses a broken file", "ctl reload --config {broken} --runtime-dir {run}",
         1, "not reloaded"),
    Case("infer: a bad --shape", "infer addone -e {infer} --shape x=1xfour", 2, "NAME=1x3x64x64"),
    Case("infer: a missing --input file", "infer addone -e {infer} --input x=/nonexistent.npy", 2, "--input"),
    Case("infer: the daemon answers 404", "infer nosuch -e {infer} --shape x=1x4", 1, "404"),
    Case("infer: no model named", "infer", 2, "MODEL"),
    Case("bench: two different models", "bench addone --model classifier -e {infer} --shape x=1x4", 2,
         "two models"),
]


def infermux(argv: list[str], env: dict[str, str] | None = None, **kwargs: object) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("INFERMUX_CONFIG", "INFERMUX_DEBUG")}
    streams = {"stdout": kwargs.pop("stdout", subprocess.PIPE), "stderr": subprocess.PIPE}
    return subprocess.run([sys.executable, "-m", "infermux", *argv], text=True, timeout=60,
                          env={**environ, **(env or {})}, **streams, **kwargs)  # type: ignore[call-overload]


def fill(argv: str, d: Daemon, broken: Path) -> list[str]:
    return argv.format(cfg=d.config_path, run=d.run_dir, infer=d.endpoint, admin=d.admin_endpoint,
                       none=f"ipc://{d.workdir}/nobody/admin.sock", broken=broken).split()


def assert_one_line(proc: subprocess.CompletedProcess, says: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert 1 <= len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    assert says in proc.stderr, proc.stderr


@pytest.fixture
def broken_copy(d: Daemon, tmp_path: Path) -> Path:
    """The daemon's configuration with a model setting broken: the sockets are still readable."""
    path = tmp_path / "broken.toml"
    path.write_text(d.config_path.read_text() + '[[models]]\nname = "x"\nengine = "x.onnx"\ncontexts = 0\n')
    return path


@pytest.mark.parametrize("case", FAILURES, ids=[c.name for c in FAILURES])
def test_each_failure_is_one_line_with_its_exit_code(case: Case, d: Daemon, broken_copy: Path) -> None:
    argv = fill(case.argv, d, broken_copy)
    if case.argv.startswith("ctl reload --config {broken}"):
        argv = fill(case.argv.replace("{broken}", "{cfg}"), d, broken_copy)
        original = d.config_path.read_text()
        d.config_path.write_text(broken_copy.read_text())  # the operator's bad edit, then reload
        try:
            proc = infermux(argv, case.env)
        finally:
            d.config_path.write_text(original)
    else:
        proc = infermux(argv, case.env)
    assert proc.returncode == case.code, (proc.returncode, proc.stdout, proc.stderr)
    assert_one_line(proc, case.says)


def test_status_and_ctl_read_only_the_sockets_of_a_broken_config(d: Daemon, broken_copy: Path) -> None:
    where = ["--config", str(broken_copy), "--runtime-dir", str(d.run_dir)]
    status = infermux(["status", *where])
    assert status.returncode == 0 and "addone" in status.stdout, status.stderr
    ctl = infermux(["ctl", "status", *where])
    assert ctl.returncode == 0 and '"ok": true' in ctl.stdout, ctl.stderr


def test_a_config_that_is_not_toml_falls_back_to_the_default_sockets_with_a_warning(d: Daemon,
                                                                                  tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\nlisten = \n")
    proc = infermux(["status", "--config", str(bad), "--runtime-dir", str(d.run_dir)])
    assert proc.returncode == 0, proc.stderr  # the default admin.sock in that runtime dir is the daemon's
    assert "not valid TOML" in proc.stderr and "Traceback" not in proc.stderr


def test_status_into_a_closed_pipe_is_quiet(d: Daemon) -> None:
    """`infermux status | head -1`: the reader has gone before the table is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = infermux(["status", "-e", d.admin_endpoint], stdout=write)
    finally:
        os.close(write)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_status_shows_the_failed_version_and_check_passes_without_one(d: Daemon, tmp_path: Path) -> None:
    proc = infermux(["status", "-e", d.admin_endpoint])
    assert proc.returncode == 0  # without --check a failed model is shown, not an error
    assert "failed" in proc.stdout and "broken:1:" in proc.stdout and "ERR" in proc.stdout


def test_ctl_models_is_short_and_json_is_whole(d: Daemon) -> None:
    short = infermux(["ctl", "models", "-e", d.admin_endpoint])
    assert short.returncode == 0, short.stderr
    lines = short.stdout.splitlines()
    assert "addone:1  (hot, ready, default)" in lines
    assert any(line.split() == ["input", "x", "float32", "[-1,", "4]"] for line in lines), short.stdout
    assert any(line.split()[:3] == ["output", "probs", "float32"] for line in lines), short.stdout
    assert len(lines) < 20
    whole = infermux(["ctl", "models", "--json", "-e", d.admin_endpoint])
    assert '"stats"' in whole.stdout and len(whole.stdout.splitlines()) > 100


def test_ctl_events_lines_carry_an_iso_time_and_the_admin_commands_model(d: Daemon) -> None:
    assert infermux(["ctl", "set", "addone", "max_queue=50", "-e", d.admin_endpoint]).returncode == 0
    proc = infermux(["ctl", "events", "-e", d.admin_endpoint])
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if " admin " in x and "max_queue" in x]
    stamp, kind, target = line.split()[:3]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp) and (kind, target) == ("admin", "addone")


def test_infer_prints_a_classifiers_top_classes(d: Daemon) -> None:
    proc = infermux(["infer", "classifier", "-e", d.endpoint, "--top", "3"])
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.strip().startswith("[0] top 3:")]
    scores = [float(part.split("(")[1].rstrip("),")) for part in line.split(":", 1)[1].split(", ")]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_bench_takes_the_model_as_infer_does_and_the_old_flag_still(d: Daemon) -> None:
    for spelling in (["addone"], ["--model", "addone"]):
        proc = infermux(["bench", *spelling, "-e", d.endpoint, "--shape", "x=1x4", "-n", "5", "--warmup", "0"])
        assert proc.returncode == 0, proc.stderr
