"""A service started as its installed systemd unit says, in a chroot where no systemd runs.

The launcher reads the unit's [Service] section and does what systemd
would do for each setting it knows: User=, Group= and SupplementaryGroups=
(plus the user's groups in /etc/group, as initgroups), RuntimeDirectory= and
StateDirectory= (made, owned by the user, with their modes), UMask=,
LimitNOFILE=, Environment=, the variables systemd gives every service
(USER, HOME, RUNTIME_DIRECTORY, INVOCATION_ID, ...), Type=notify (a
NOTIFY_SOCKET on which "started" means READY=1, within TimeoutStartSec=),
WatchdogSec= (WATCHDOG_USEC), a session of its own; stopping sends SIGTERM
to every process of the service (KillMode=control-group), SIGKILL after
TimeoutStopSec=, and removes the runtime directory.

The sandbox (ProtectSystem=, DeviceAllow=, NoNewPrivileges=, ...) and what
needs a running systemd (Restart=, ExecReload=) are not reproduced; any
other setting fails the start, so a unit that grows one is not silently
started differently.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from support.chroots import Chroot

SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # systemd 252's default
NOT_REPRODUCED = {
    "NotifyAccess", "ExecReload", "Restart", "RestartSec", "ProtectSystem", "ProtectHome", "PrivateTmp",
    "NoNewPrivileges", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
    "RestrictSUIDSGID", "LockPersonality", "RestrictRealtime", "DevicePolicy", "DeviceAllow",
}
SINGLE = {"Type", "ExecStart", "TimeoutStartSec", "TimeoutStopSec", "WatchdogSec", "LimitNOFILE", "User",
          "Group", "RuntimeDirectory", "RuntimeDirectoryMode", "StateDirectory", "StateDirectoryMode", "UMask"}
LISTS = {"SupplementaryGroups", "Environment"}


class UnitError(Exception):
    """A unit setting this launcher cannot honour."""


@dataclass(frozen=True)
class ServiceUnit:
    """The [Service] settings of a unit file that decide how its process starts."""

    exec_start: tuple[str, ...]
    type: str = "simple"
    user: str = "root"
    group: str = ""
    supplementary_groups: tuple[str, ...] = ()
    runtime_directory: str = ""
    runtime_directory_mode: int = 0o755
    state_directory: str = ""
    state_directory_mode: int = 0o755
    umask: int = 0o022
    limit_nofile: int | None = None
    environment: tuple[tuple[str, str], ...] = ()
    timeout_start_s: float = 90.0
    timeout_stop_s: float = 90.0
    watchdog_s: float = 0.0

    @classmethod
    def read(cls, path: Path) -> ServiceUnit:
        """Parse `path`'s [Service] section; UnitError on a setting the launcher does not know."""
        single: dict[str, str] = {}
        lists: dict[str, list[str]] = {key: [] for key in LISTS}
        section = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line
                continue
            if section != "[Service]":
                continue
            key, _, value = (part.strip() for part in line.partition("="))
            if key in SINGLE:
                single[key] = value
            elif key in LISTS:
                lists[key] += shlex.split(value)
            elif key not in NOT_REPRODUCED:
                raise UnitError(f"{path}: {key}= is not reproduced by tests/support/systemd_unit.py; teach it")
        env = tuple((name, value) for name, _, value in (item.partition("=") for item in lists["Environment"]))
        return cls(
            exec_start=tuple(shlex.split(single["ExecStart"])), type=single.get("Type", "simple"),
            user=single.get("User", "root"), group=single.get("Group", ""),
            supplementary_groups=tuple(lists["SupplementaryGroups"]),
            runtime_directory=single.get("RuntimeDirectory", ""),
            runtime_directory_mode=int(single.get("RuntimeDirectoryMode", "0755"), 8),
            state_directory=single.get("StateDirectory", ""),
            state_directory_mode=int(single.get("StateDirectoryMode", "0755"), 8),
            umask=int(single.get("UMask", "0022"), 8),
            limit_nofile=int(single["LimitNOFILE"]) if "LimitNOFILE" in single else None,
            environment=env,
            timeout_start_s=_seconds(single.get("TimeoutStartSec", "90")),
            timeout_stop_s=_seconds(single.get("TimeoutStopSec", "90")),
            watchdog_s=_seconds(single.get("WatchdogSec", "0")))


def _seconds(value: str) -> float:
    """A plain or s-suffixed systemd time span ("30", "30s"), the only forms the unit uses."""
    if not value.rstrip("s").isdigit():
        raise UnitError(f"time span {value!r}: only seconds are understood here")
    return float(value.rstrip("s"))


@dataclass(frozen=True)
class Account:
    """The user a unit runs as, read from the chroot's /etc/passwd and /etc/group."""

    uid: int
    gid: int
    home: str
    shell: str
    groups: tuple[int, ...]

    @classmethod
    def of(cls, chroot: Chroot, unit: ServiceUnit) -> Account:
        passwd = {f[0]: f for f in _table(chroot, "/etc/passwd")}
        groups = {f[0]: f for f in _table(chroot, "/etc/group")}
        if unit.user not in passwd:
            raise UnitError(f"User={unit.user}: no such user in the chroot")
        _, _, uid, gid, _, home, shell = passwd[unit.user][:7]
        primary = int(groups[unit.group][2]) if unit.group else int(gid)
        member_of = {int(f[2]) for f in groups.values() if unit.user in f[3].split(",")}
        missing = [g for g in unit.supplementary_groups if g not in groups]
        if missing:  # systemd fails the start with status 216/GROUP
            raise UnitError(f"SupplementaryGroups={' '.join(missing)}: no such group in the chroot")
        extra = {int(groups[g][2]) for g in unit.supplementary_groups}
        return cls(int(uid), primary, home, shell, tuple(sorted({primary} | member_of | extra)))


def _table(chroot: Chroot, name: str) -> list[list[str]]:
    return [line.split(":") for line in chroot.path(name).read_text().splitlines() if line]


@dataclass
class Service:
    """A started service: its main process, its log (systemd's journal here) and its notify messages."""

    chroot: Chroot
    unit: ServiceUnit
    process: subprocess.Popen[bytes]
    log: Path
    notify: socket.socket
    nofile: int | None  # the RLIMIT_NOFILE it was given (LimitNOFILE=, or less: reachable_nofile)
    messages: list[dict[str, str]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self) -> float:
        """Seconds until READY=1 (Type=notify) or the start; AssertionError on exit or timeout."""
        started = time.monotonic()
        if self.unit.type != "notify":
            return 0.0
        while not any(m.get("READY") == "1" for m in self.messages):
            left = started + self.unit.timeout_start_s - time.monotonic()
            assert left > 0, f"no READY=1 within TimeoutStartSec={self.unit.timeout_start_s:g}:\n{self.tail()}"
            assert self.process.poll() is None, f"exited {self.process.returncode} before READY=1:\n{self.tail()}"
            self.receive(min(left, 0.5))
        return time.monotonic() - started

    def receive(self, timeout: float) -> None:
        """Read the notify messages that arrive within `timeout` seconds."""
        self.notify.settimeout(timeout)
        try:
            while True:
                data = self.notify.recv(4096)
                self.messages.append(dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line))
                self.notify.settimeout(0)
        except (TimeoutError, BlockingIOError):
            return

    def group(self) -> list[int]:
        """The processes of the service: its process group (the session it was started in)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.pid:
                        found.append(int(entry.name))
                except ProcessLookupError:
                    continue
        return found

    def stop(self) -> tuple[int, list[int]]:
        """systemctl stop: SIGTERM to every process, SIGKILL after TimeoutStopSec=; the main process's exit
        status and the processes that outlived it by 10 s (then killed)."""
        with contextlib.suppress(ProcessLookupError):  # the group may have ended
            os.killpg(self.pid, signal.SIGTERM)
        try:
            status = self.process.wait(self.unit.timeout_stop_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the group may have ended
                os.killpg(self.pid, signal.SIGKILL)
            status = self.process.wait(10)
        deadline = time.monotonic() + 10
        while self.group() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.group()
        with contextlib.suppress(ProcessLookupError):  # the group may have ended
            os.killpg(self.pid, signal.SIGKILL)
        self.close()
        return status, left

    def close(self) -> None:
        self.notify.close()
        if self.unit.runtime_directory:
            shutil.rmtree(self.chroot.path(f"/run/{self.unit.runtime_directory}"), ignore_errors=True)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def start(chroot: Chroot, unit_path: str, log: Path) -> Service:
    """Start the unit installed at `unit_path` (a path inside the chroot) as systemd would."""
    unit = ServiceUnit.read(chroot.path(unit_path))
    account = Account.of(chroot, unit)
    env = {"PATH": SYSTEMD_PATH, "USER": unit.user, "LOGNAME": unit.user, "HOME": account.home,
           "SHELL": account.shell, "INVOCATION_ID": uuid.uuid4().hex}
    for kind, name, mode in (("RUNTIME", unit.runtime_directory, unit.runtime_directory_mode),
                             ("STATE", unit.state_directory, unit.state_directory_mode)):
        if name:
            inside = f"/run/{name}" if kind == "RUNTIME" else f"/var/lib/{name}"
            folder = chroot.path(inside)
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, account.uid, account.gid)
            os.chmod(folder, mode)
            env[f"{kind}_DIRECTORY"] = inside
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = chroot.path("/run/systemd/notify")
    notify_path.parent.mkdir(parents=True, exist_ok=True)
    notify_path.unlink(missing_ok=True)
    notify.bind(str(notify_path))
    os.chmod(notify_path, 0o777)  # as systemd's: any service user may write to it
    if unit.type == "notify":
        env["NOTIFY_SOCKET"] = "/run/systemd/notify"
    if unit.watchdog_s:
        env["WATCHDOG_USEC"] = str(int(unit.watchdog_s * 1_000_000))
    env.update(dict(unit.environment))

    nofile = reachable_nofile(unit.limit_nofile)

    def limits() -> None:  # in the child, before chroot(8): inherited by the service
        os.umask(unit.umask)
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log, "ab") as out:
        process = subprocess.Popen(
            chroot.command(*unit.exec_start, userspec=f"{account.uid}:{account.gid}", groups=account.groups),
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=limits)
    return Service(chroot, unit, process, log, notify, nofile)


def reachable_nofile(wanted: int | None) -> int | None:
    """LimitNOFILE= as this process can set it: systemd (PID 1) may raise the hard limit; a root without
    CAP_SYS_RESOURCE (a sandbox, some CI containers) only up to its own hard limit."""
    if wanted is None:
        return None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard >= wanted or _capable(CAP_SYS_RESOURCE):
        return wanted
    return hard


CAP_SYS_RESOURCE = 24


def _capable(bit: int) -> bool:
    effective = next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                     if line.startswith("CapEff:"))
    return bool(int(effective, 16) >> bit & 1)
