"""A Debian root file system that a system test installs into and runs commands in (as root, no systemd).

Made once by debootstrap and cached as a tarball (system_packages.CACHE);
each test unpacks its own copy, mounts what programs expect (/proc, a
read-only /sys, a private /dev, a pseudo-terminal instance), runs commands
in it with a clean environment, and on close ends every process still
running inside, unmounts and deletes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterable, Mapping

import pytest

from infermux.workers.slots import pid_alive

MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What packaging/test-install.sh's in_chroot gives a command: nothing of the caller's environment.
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LC_ALL": "C.UTF-8",
            "DEBIAN_FRONTEND": "noninteractive"}
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


def debootstrap(tarball: Path, arch: str, apt_cache: Path, suite: str = "bookworm") -> None:
    """A minbase `suite` for `arch` as `tarball` (kept for the next run), its .debs cached in apt_cache."""
    if tarball.is_file() and tarball.stat().st_size:
        return
    (apt_cache / "partial").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"debootstrap-{arch}.", dir=tarball.parent))
    try:
        r = subprocess.run(["debootstrap", f"--arch={arch}", "--variant=minbase", f"--cache-dir={apt_cache}",
                            suite, str(work / "root"), MIRROR], capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            pytest.fail(f"debootstrap --arch={arch} {suite} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
        pack(work / "root", tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def pack(root: Path, tarball: Path) -> None:
    """`root` as `tarball`, written under a temporary name first: a run killed midway leaves no bad cache."""
    partial = tarball.with_name(tarball.name + ".tmp")
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True, timeout=600)
    os.replace(partial, tarball)


# A chroot's folder is named for the process that made it, so that a later run can tell one whose
# maker was killed before its close() (sweep_abandoned) from one in use by a run still going.
WORK_PREFIX = "infermux-chroot."


def sweep_abandoned(base: Path | None = None) -> list[Path]:
    """Dismantle the chroots under `base` (the temporary folder) whose maker is gone; return them.

    A run killed midway (a timeout, a ^C, a lost CI runner) leaves its chroot
    mounted: /proc, /sys and /dev bound under /tmp, and bind mounts of the
    caches. The next chroot made sweeps them. Folders named before the maker's
    pid was in the name are left alone: nothing tells whether they are in use.
    """
    swept = []
    for work in sorted((base or Path(tempfile.gettempdir())).glob(f"{WORK_PREFIX}*")):
        maker = work.name[len(WORK_PREFIX):].split(".", 1)[0]
        if not maker.isdigit() or pid_alive(int(maker)):
            continue
        try:
            dismantle(work)
        except RuntimeError as exc:  # a mount that will not go: the next sweep tries again
            warnings.warn(f"an abandoned chroot stays: {exc}", stacklevel=2)
            continue
        swept.append(work)
    return swept


def dismantle(work: Path) -> None:
    """End every process rooted in `work`/root, undo every mount under `work` (newest first), delete it.

    A mount that will not go keeps the folder, and says why (RuntimeError).
    """
    root = str(work / "root")
    for _ in range(50):
        pids = _rooted_in(root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    unmount_all(work)
    still = _mounts_under(work)
    if still:
        raise RuntimeError(f"still mounted under {work}, not deleting it: {still}")
    shutil.rmtree(work, ignore_errors=True)


def unmount_all(work: Path) -> None:
    """Every mount under `work`, newest first (lazily where something still holds one)."""
    for target in reversed(_mounts_under(work)):
        if subprocess.run(["umount", target], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", target], capture_output=True, timeout=30)


def _mounts_under(work: Path) -> list[str]:
    """Mount points below `work`, in the order they were mounted."""
    inside = str(work) + "/"
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(inside)]


def _rooted_in(root: str) -> list[int]:
    """Every process whose root directory is `root`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "root") == root:
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours to read
                continue
    return found


class Chroot:
    """One unpacked root file system under a fresh temporary folder; `close()` leaves nothing behind."""

    def __init__(self, tarball: Path) -> None:
        sweep_abandoned()
        self.work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}."))
        self.root = self.work / "root"
        self.root.mkdir()
        subprocess.run(["tar", "-C", str(self.root), "--numeric-owner", "-xf", str(tarball)], check=True,
                       timeout=600)

    def __enter__(self) -> Chroot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path(self, inside: str) -> Path:
        """The host's path of `inside` (an absolute path in the chroot)."""
        return self.root / inside.lstrip("/")

    def resolve(self, inside: str) -> str:
        """`inside` with every symlink on its way followed as the chroot sees them
        (/lib/systemd/system/x -> /usr/lib/systemd/system/x, /usr/bin/python3 -> /usr/bin/python3.11)."""
        todo, done, hops = [p for p in inside.split("/") if p], "", 0
        while todo:
            part = todo.pop(0)
            if part in (".", ".."):
                done = os.path.dirname(done) if part == ".." else done
                continue
            host = self.path(f"{done}/{part}")
            if not host.is_symlink():
                done = f"{done}/{part}"
                continue
            hops += 1
            if hops > 40:
                raise RuntimeError(f"{inside}: too many symlinks")
            target = os.readlink(host)
            todo = [p for p in target.split("/") if p] + todo
            done = "" if target.startswith("/") else done
        return done or "/"

    # -- mounts ---------------------------------------------------------------------------------

    def mount(self, binds: Mapping[Path, str] = {}, cpuinfo: str | None = None) -> None:
        """/proc, /sys (read-only), a private /dev with the usual nodes and its own devpts, the host's
        resolv.conf, `binds` (host folder -> path inside), and `cpuinfo` over /proc/cpuinfo if given."""
        self._mount(["-t", "proc", "proc"], "/proc")
        self._mount(["-t", "sysfs", "-o", "ro", "sysfs"], "/sys")
        self._mount(["-t", "tmpfs", "-o", "mode=755,nosuid", "dev"], "/dev")
        for name, (major, minor) in DEVICES.items():
            os.mknod(self.path(f"/dev/{name}"), 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(self.path(f"/dev/{name}"), 0o666)
        self._mount(["-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "shm"], "/dev/shm")
        self._mount(["-t", "devpts", "-o", "newinstance,gid=5,mode=620,ptmxmode=666", "devpts"], "/dev/pts")
        os.symlink("pts/ptmx", self.path("/dev/ptmx"))
        os.symlink("/proc/self/fd", self.path("/dev/fd"))
        shutil.copy("/etc/resolv.conf", self.path("/etc/resolv.conf"))
        for source, inside in binds.items():
            self._mount(["--bind", str(source)], inside)
        if cpuinfo is not None:
            fake = self.work / "cpuinfo"
            fake.write_text(cpuinfo)
            self._mount(["--bind", str(fake)], "/proc/cpuinfo")

    def _mount(self, args: list[str], inside: str) -> None:
        target = self.path(inside)
        if not target.exists():
            target.mkdir(parents=True)
        subprocess.run(["mount", *args, str(target)], check=True, capture_output=True, timeout=30)

    def unmount(self) -> None:
        """Every mount in the chroot, newest first (lazily where something still holds one)."""
        unmount_all(self.work)

    # -- commands -------------------------------------------------------------------------------

    def command(self, *cmd: str, userspec: str = "", groups: Iterable[int] = ()) -> list[str]:
        """`cmd` run in the chroot by chroot(8): as root, or as `userspec` (uid:gid) with `groups`."""
        ids = [f"--userspec={userspec}"] if userspec else []
        ids += [f"--groups={','.join(map(str, groups))}"] if groups else []
        return ["chroot", *ids, str(self.root), *cmd]

    def run(self, *cmd: str, timeout: float = 300, env: Mapping[str, str] = {}, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run `cmd` as root in the chroot; with `check`, a failure fails the test with the output's tail."""
        r = subprocess.run(self.command(*cmd), env={**BASE_ENV, **env}, capture_output=True, text=True,
                           timeout=timeout, input=input)
        if check and r.returncode != 0:
            pytest.fail(f"in the chroot: {' '.join(cmd)} exited {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
        return r

    def close(self) -> None:
        """End what still runs inside, unmount, delete; a mount that will not go keeps the folder (said why)."""
        dismantle(self.work)

    # -- what is in it --------------------------------------------------------------------------

    def files(self, skip: Iterable[str]) -> set[str]:
        """Every path in the chroot (as seen inside) except those under the folders `skip`."""
        skipped = {self.path(s) for s in skip}
        found: set[str] = set()
        for folder, dirs, names in os.walk(self.root):
            here = Path(folder)
            dirs[:] = [d for d in dirs if here / d not in skipped]
            found.update("/" + str((here / n).relative_to(self.root)) for n in [*dirs, *names])
        return found

