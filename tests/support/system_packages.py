"""System packages a test needs: installed in CI, a skip with the command elsewhere.

CI runs as root with the Debian package index reachable, so a test whose
tools are missing there installs them (`apt-get update` once per session,
then `apt-get install -y`) instead of skipping: a skipped install test
proves nothing about `apt install`. On a developer's box (not CI, or not
root) the test skips and says which command would make it run.

A package installed for a test starts no service (prometheus' postinst
would start one through its init script on a box without systemd): the
tests run what they need themselves, on their own ports.

Also the state those tests share: the cache folder of chroots, images and
downloads (made on first use), the locks, and the kernel's binfmt_misc
handler that runs another architecture's binaries through qemu-user-static.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

_updated = False
APT_TIMEOUT_S = 600
# The suite runs in several worker processes (pytest-xdist): one apt-get at a time among them,
# and one chroot or image build at a time (they share the apt and debootstrap caches).
APT_LOCK = Path("/tmp/infermux-test-apt.lock")
BUILD_LOCK = Path("/tmp/infermux-test-build.lock")
# Chroot tarballs, apt's .debs, pip's wheels and container images, kept between runs.
CACHE = Path(os.environ.get("INFERMUX_TEST_CACHE", "/var/cache/infermux-test"))
# What the install tests need on the host to build the .deb in a chroot (command -> Debian package).
DEB_TEST_TOOLS = {"debootstrap": "debootstrap", "git": "git", "unshare": "util-linux", "tar": "tar"}


def cache_dir(*parts: str) -> Path:
    """A folder under CACHE, made (with CACHE) when missing: a machine that never ran the suite has none."""
    path = CACHE.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


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


def require(needs: dict[str, str]) -> float:
    """Make every probe in `needs` present: install its package in CI, else skip the test.
    Returns the seconds the install took (0 when nothing was missing)."""
    packages = missing(needs)
    if not packages:
        return 0.0
    if not can_install():
        pytest.skip(f"{', '.join(packages)} missing: sudo apt-get install {' '.join(packages)}")
    started = time.monotonic()
    _apt("install", "-y", "--no-install-recommends", *packages)
    still = missing(needs)
    if still:
        pytest.fail(f"apt-get installed {' '.join(packages)} but {', '.join(still)} still missing")
    return time.monotonic() - started


POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


@contextlib.contextmanager
def no_services_started() -> Iterator[None]:
    """While the block runs, invoke-rc.d starts no service (policy-rc.d exit 101: "action forbidden");
    an existing policy-rc.d (a container's) is left as it is."""
    if POLICY_RC_D.exists():
        yield
        return
    POLICY_RC_D.write_text("#!/bin/sh\n# infermux's tests: packages installed for a test start no service\nexit 101\n")
    POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC_D.unlink(missing_ok=True)


def _apt(*args: str) -> None:
    global _updated
    with exclusive(APT_LOCK):
        if not _updated:
            _run("update")
            _updated = True
        with no_services_started():
            _run(*args)


def _run(*args: str) -> None:
    # The dpkg lock may be held by another apt (unattended-upgrades, a
    # parallel job): wait for it rather than fail at once.
    cmd = ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=300", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=APT_TIMEOUT_S,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if r.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-2000:]}")


# -- running another architecture's binaries ----------------------------------------------------

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# The ELF header of an executable for each architecture, as qemu-user-static registers it with binfmt_misc.
ELF_MAGIC = {"aarch64": "7f454c460201010000000000000000000200b700"}


@dataclass(frozen=True)
class Emulator:
    """An enabled binfmt_misc handler: the kernel runs `arch` executables with `interpreter`."""

    arch: str
    name: str
    interpreter: Path
    flags: str


def require_emulation(arch: str) -> Emulator:
    """Make the kernel run `arch` binaries through qemu-user-static, also inside chroots (root only).

    binfmt_misc is mounted when it is not, qemu-user-static and binfmt-support are installed in CI (else
    the test skips with the command), and qemu's handler is registered or enabled when it is not."""
    if not os.path.ismount(BINFMT):
        r = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip(f"cannot mount binfmt_misc here ({r.stderr.strip()}): no emulation of {arch}")
        print(f"mounted binfmt_misc on {BINFMT}")
    require({f"/usr/bin/qemu-{arch}-static": "qemu-user-static", "/usr/sbin/update-binfmts": "binfmt-support"})
    found = _handler(arch)
    if found is None or found[1] != "enabled":
        name = f"qemu-{arch}"
        for action in (("--import", name), ("--enable", name)):  # --import: a format binfmt-support never read
            subprocess.run(["update-binfmts", *action], capture_output=True, timeout=30)
        found = _handler(arch)
        print(f"update-binfmts --enable qemu-{arch}: {'done' if found else 'no handler'}")
    if found is None or found[1] != "enabled":
        pytest.fail(f"no enabled binfmt_misc handler for {arch} after update-binfmts --enable qemu-{arch}")
    emulator = found[0]
    # F (fix binary): the kernel opened the interpreter when it was registered, so it runs in a chroot too.
    if "F" not in emulator.flags:
        pytest.fail(f"{BINFMT / emulator.name} has flags {emulator.flags!r}, without F the chroot cannot find "
                    f"{emulator.interpreter}: update-binfmts --disable {emulator.name}, then register it with F")
    return emulator


def _handler(arch: str) -> tuple[Emulator, str] | None:
    """The binfmt_misc entry matching `arch`'s ELF header, and whether it is enabled."""
    for entry in sorted(BINFMT.iterdir()):
        if entry.name in ("register", "status"):
            continue
        lines = entry.read_text().splitlines()
        fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
        if fields.get("magic", "").startswith(ELF_MAGIC[arch]):
            flags = fields.get("flags:", "").strip()
            return Emulator(arch, entry.name, Path(fields["interpreter"]), flags), lines[0]
    return None
