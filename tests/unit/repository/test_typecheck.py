"""The type checker is part of the test command: daemon/, tui/ and plugins/ stay clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _package_tree(dest: Path) -> Path:
    """The infermux package as Python imports it (daemon/ at the top, tui/ and plugins/ inside), as links."""
    pkg = dest / "infermux"
    pkg.mkdir()
    for entry in (ROOT / "daemon").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "tui").symlink_to(ROOT / "tui")
    (pkg / "plugins").symlink_to(ROOT / "plugins")
    return dest


@pytest.mark.slow
def test_mypy_finds_no_error_in_the_package(tmp_path: Path) -> None:
    root = _package_tree(tmp_path)
    env = {**os.environ, "MYPYPATH": str(root)}
    run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          "--no-incremental", "-p", "infermux"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
