"""The linter is part of the test command: ruff finds nothing in the code or the tests.

The rules are pyproject.toml's [tool.ruff.lint] (pyflakes, and the pycodestyle errors and warnings
the code meets); the test runs the ruff of the `test` extra over every Python tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TREES = ("daemon", "tui", "plugins", "tests", "examples")


def test_ruff_finds_nothing_to_report() -> None:
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                          *TREES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "All checks passed" in run.stdout
