"""System packages a test needs: installed in CI, a skip with the command elsewhere.

CI runs as root with the Debian package index reachable, so a test whose
tools are missing there installs them (`apt-get update` once per session,
then `apt-get install -y`) instead of skipping: a skipped install test
proves nothing about `apt install`. On a developer's box (not CI, or not
root) the test skips and says which command would make it run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

_updated = False
APT_TIMEOUT_S = 600
# The suite runs in several worker processes (pytest-xdist): one apt-get at a time among them,
# and one chroot or image build at a time (they share the apt and debootstrap caches).
APT_LOCK = Path("/tmp/infermux-test-apt.lock")
BUILD_LOCK = Path("/tmp/infermux-test-build.lock")


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold `lock` (a file lock across the suite's worker processes) while the block runs."""
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def missing(needs: dict[str, str]) -> list[str]:
    """The packages of `needs` (a command name or an absolute path -> its package) that are absent."""
    absent = [pkg for probe, pkg in needs.items()
              if not (Path(probe).exists() if probe.startswith("/") else shutil.which(probe))]
    return sorted(set(absent))


def can_install() -> bool:
    """True in CI as root with apt-get: where a test installs what it needs."""
    return bool(os.environ.get("CI")) and os.geteuid() == 0 and shutil.which("apt-get") is not None


def require(needs: dict[str, str]) -> None:
    """Make every probe in `needs` present: install its package in CI, else skip the test."""
    packages = missing(needs)
    if not packages:
        return
    if not can_install():
        pytest.skip(f"{', '.join(packages)} missing: sudo apt-get install {' '.join(packages)}")
    _apt("install", "-y", "--no-install-recommends", *packages)
    still = missing(needs)
    if still:
        pytest.fail(f"apt-get installed {' '.join(packages)} but {', '.join(still)} still missing")


def _apt(*args: str) -> None:
    global _updated
    with exclusive(APT_LOCK):
        if not _updated:
            _run("update")
            _updated = True
        _run(*args)


def _run(*args: str) -> None:
    # The dpkg lock may be held by another apt (unattended-upgrades, a
    # parallel job): wait for it rather than fail at once.
    cmd = ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=300", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=APT_TIMEOUT_S,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if r.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-2000:]}")
