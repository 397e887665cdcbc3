"""Bash completion offers what belongs where the cursor is, asked of the running daemon.

packaging/bash-completion/infermux runs in a real bash here, as an
interactive shell would run it, with the checkout's `infermux` on PATH and a
real daemon to ask: a model name where a model belongs (`infer`, `bench`,
`tune`, `ctl set|load|... MODEL`), never a file there, and each command's own
options only (not one named in another's help text, as `top`'s once offered
`--json`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.harness import REPO, TWO_VERSIONS_AND_FAST

COMPLETION = REPO / "packaging" / "bash-completion" / "infermux"
BIN = Path(sys.executable).parent


def complete(words: list[str], cwd: Path) -> list[str]:
    """COMPREPLY for the command line `words`, the last word being the one completed."""
    bash = shutil.which("bash")
    assert bash
    if not (BIN / "infermux").exists():
        pytest.skip("the infermux console script is not installed beside this Python")
    line = " ".join(words)
    script = (f"source {COMPLETION}\n"
              f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}\n"
              "_infermux; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    run = subprocess.run([bash, "--norc", "-c", script], capture_output=True, text=True, timeout=60, cwd=cwd,
                         env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": "/nonexistent"})
    assert run.returncode == 0, run.stderr
    return [w for w in run.stdout.splitlines() if w]


def test_model_names_are_offered_where_a_model_belongs(make_daemon, tmp_path: Path) -> None:
    d = make_daemon(TWO_VERSIONS_AND_FAST)
    (tmp_path / "addone.txt").write_text("")  # a file a filename completion would offer
    where = ["--config", str(d.config_path), "--runtime-dir", str(d.run_dir)]
    assert complete(["infermux", "infer", *where, ""], tmp_path) == ["addone", "fast"]
    assert complete(["infermux", "infer", *where, "a"], tmp_path) == ["addone"]
    assert complete(["infermux", "bench", "--json", *where, "f"], tmp_path) == ["fast"]
    assert complete(["infermux", "ctl", "set", *where, ""], tmp_path) == ["addone", "fast"]
    assert complete(["infermux", "ctl", *where, "pin", "a"], tmp_path) == ["addone"]
    assert complete(["infermux", "infer", *where, "--model", "f"], tmp_path) == ["fast"]
    assert complete(["infermux", "infer", *where, "addone", "a"], tmp_path) == []  # no file where none belongs
    assert complete(["infermux", "infer", *where, "addone", "--input", "a"], tmp_path) == ["addone.txt"]


def test_no_names_and_no_wait_without_a_daemon(tmp_path: Path) -> None:
    where = ["--config", str(tmp_path / "none.toml")]
    (tmp_path / "none.toml").write_text(f'[daemon]\nruntime_dir = "{tmp_path}/run"\n')
    assert complete(["infermux", "infer", *where, ""], tmp_path) == []


def test_each_command_is_offered_its_own_options_only(tmp_path: Path) -> None:
    top = complete(["infermux", "top", "--"], tmp_path)
    assert "--json" not in top and {"--config", "--admin", "--stats", "--from-file"} <= set(top), top
    assert "--names" not in complete(["infermux", "status", "--"], tmp_path)  # the completion's own
    assert {"--json", "--check"} <= set(complete(["infermux", "status", "--"], tmp_path))
