"""Running infermux as another user (root or "nobody"), as an operator starts it by hand."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from support.harness import REPO

NOBODY = 65534


@pytest.fixture(scope="module")
def traversable() -> Iterator[None]:
    """As root: every folder above the checkout and the venv's packages lets others through (o+x)
    while this module runs, then gets its mode back. A clone in a `mktemp -d` folder (0700) would
    otherwise hide infermux's own code from user nobody; nothing is made readable that was not."""
    changed: dict[Path, int] = {}  # folder: its mode before
    if os.geteuid() == 0:
        for leaf in (REPO, Path(site_packages())):
            for folder in (leaf, *leaf.parents):
                mode = folder.stat().st_mode
                if not mode & stat.S_IXOTH and folder not in changed:
                    changed[folder] = mode
                    folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    yield
    for folder, mode in reversed(changed.items()):
        folder.chmod(stat.S_IMODE(mode))


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temporary folder other users may traverse (0755; pytest's tmp_path is its user's alone), for
    tests that play another user or group against the daemon's files and sockets."""
    path = Path(tempfile.mkdtemp(prefix="infermux-others-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def infermux_as(user: str) -> list[str]:
    """The command that runs `infermux` as `user` ("root" or "nobody")."""
    if user == "root":
        if os.geteuid() != 0:
            pytest.skip("starting as root needs root")
        return [sys.executable, "-m", "infermux"]
    if os.geteuid() != 0:
        return [sys.executable, "-m", "infermux"]  # already an ordinary user
    setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    for python in (sys.executable, "/usr/bin/python3"):
        # The venv's base interpreter may sit in root's home (pyenv): then a
        # system Python of the same version runs the venv's packages.
        boot = f"import site, sys; site.addsitedir({site_packages()!r}); from infermux.cli import main; sys.exit(main())"
        probe = subprocess.run([*setpriv, python, "-c", boot.replace("sys.exit(main())", "import onnxruntime, zmq")],
                               capture_output=True, timeout=60)
        if probe.returncode == 0:
            return [*setpriv, python, "-c", boot]
    pytest.skip(f"no Python that user nobody may run sees infermux's packages: {probe.stderr.decode()[-300:]}")


def site_packages() -> str:
    import numpy
    return str(Path(numpy.__file__).resolve().parent.parent)
