"""Python 3.10 (JetPack 6 is Ubuntu 22.04) is supported, but no 3.10 interpreter runs here.

So the code is checked statically: vermin finds the lowest Python version
each construct and standard-library name needs, and everything under
daemon/, tui/, plugins/ and tests/ must run on 3.10. A 3.11-only module
(tomllib) is fine behind `if sys.version_info >= (3, 11):` with the 3.10
fallback (tomli) in the else branch, which vermin understands.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TREES = ("daemon", "tui", "plugins", "tests")


def _vermin(*paths: str) -> subprocess.CompletedProcess[str]:
    vermin = shutil.which("vermin", path=str(Path(sys.executable).parent)) or shutil.which("vermin")
    assert vermin, "vermin is missing: pip install -e '.[test]'"
    return subprocess.run([vermin, "--target=3.10-", "--violations", "--no-tips", "--eval-annotations", *paths],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_everything_runs_on_python_3_10() -> None:
    r = _vermin(*TREES)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_check_sees_a_3_11_only_import(tmp_path: Path) -> None:
    (tmp_path / "new.py").write_text("import tomllib\n")
    r = _vermin(str(tmp_path / "new.py"))
    assert r.returncode != 0 and "tomllib" in r.stdout
