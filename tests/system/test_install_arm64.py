"""The Debian package on arm64 (the Jetson's architecture), in an emulated Debian 12 arm64 userland.

The .deb is the install test's build of infermux_0.1.0_all.deb (packaging/test-install.sh
with BUILD_ONLY: the same clean build chroot, and the very .deb when that test
already built this source tree). infermux-wire, the compiled socket calls, is
Architecture: any and built there for x86-64 only: the main test's chroot gets
infermux alone, as on an arm64 machine without infermux-wire, and `doctor`
must say the daemon runs pyzmq's socket calls. A second test builds the
extension's C source with the arm64 compiler in a layer that adds one (cached
beside the other) and checks that the daemon serves on it. A Debian bookworm arm64 minbase chroot,
made by debootstrap and run through qemu-user-static (binfmt_misc), gets
the package's declared Depends with apt and onnxruntime's aarch64 wheel the
way README.Debian tells a user; both are cached as a tarball keyed by the
Depends and the pip command (and remade after LAYER_DAYS), since apt and
pip under emulation take minutes (CACHE/arm64, under a lock of its own). Each run then `apt install`s the .deb,
starts the daemon as the installed unit says (tests/support/systemd_unit.py: its
user, groups, directories, environment, READY=1; no systemd runs in a
chroot) with a cold model added to the conffile, and checks `status`,
`infer` (the outputs equal onnxruntime's on this x86-64 host), that the
daemon and the cold model's worker run the aarch64 Python, the console in
a pseudo-terminal, `doctor`, and that `apt purge` leaves no file behind.

onnxruntime's cpuinfo library reads /proc/cpuinfo, which qemu-user 7.2
passes through from the x86 host (qemu emulates it only from 8.2 on):
finding no ARM core there it crashes the process on the first session
(SIGSEGV) with /sys mounted, and prints errors without it. The chroot
therefore mounts /sys read-only, as on a device, and gets the /proc/cpuinfo
of a Jetson Orin's cores (jetson_cpuinfo) bind-mounted over the host's.

A few minutes, more the first time: it runs under CI (CI=true) or with
INFERMUX_ARM64_TEST=1, as root. In CI the host tools are installed
(tests/support/system_packages.py); elsewhere it skips and says what is missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from support import chroots, system_packages, systemd_unit
from support.chroots import Chroot
from support.harness import REPO

ARCH, MACHINE = "arm64", "aarch64"
EM_AARCH64 = 183  # ELF e_machine
# README.Debian's command for the backend, run as root in the chroot (so without sudo).
ORT_INSTALL = ("pip", "install", "--break-system-packages", "onnxruntime")
LAYER_DAYS = 7
UNIT = "/lib/systemd/system/infermux.service"
CONFIG = "/etc/infermux/infermux.toml"
ENGINE = "/usr/share/infermux/engines/classifier/1/model.onnx"
# As an operator would add it: the sample engine again, served by a worker process started on demand.
COLD_MODEL = f"""
[[models]]
name = "cold"
version = "1"
mode = "multiproc"
engine = "{ENGINE}"
"""
# Where `apt purge` may leave new paths: kernel and runtime file systems, apt's download lock, and root's
# ~/.cache, where onnxruntime keeps a device id for the CLI commands the test runs as root.
NOT_THE_PACKAGES = ("/proc", "/sys", "/dev", "/run", "/tmp", "/root/.cache", "/var/cache/apt")
ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78DEHM]")


# -- what the test needs on the host -------------------------------------------------------------

@pytest.fixture(scope="module")
def emulator() -> system_packages.Emulator:
    if not (os.environ.get("CI") or os.environ.get("INFERMUX_ARM64_TEST")):
        pytest.skip("set INFERMUX_ARM64_TEST=1 (or run under CI) to install and run the .deb in an arm64 "
                    "chroot under qemu-user-static (a few minutes, more the first time)")
    if os.geteuid() != 0:
        pytest.skip("needs root (debootstrap, chroot, binfmt_misc): sudo INFERMUX_ARM64_TEST=1 pytest "
                    "tests/system/test_install_arm64.py")
    system_packages.require({**system_packages.DEB_TEST_TOOLS, "dpkg-deb": "dpkg"})
    return system_packages.require_emulation(MACHINE)


# The arm64 chroots have caches of their own (CACHE/arm64: the tarballs, apt's .debs, pip's wheels) and this
# lock: making them never holds up the other chroot tests. Only the build shares theirs (BUILD_LOCK).
LOCK = Path("/tmp/infermux-test-arm64.lock")


def arm64_cache(*parts: str) -> Path:
    return system_packages.cache_dir(ARCH, *parts)


@pytest.fixture(scope="module")
def base(emulator: system_packages.Emulator) -> Path:
    """Debian bookworm arm64 minbase (debootstrap under qemu), as a tarball."""
    tarball = arm64_cache() / "bookworm-minbase.tar"
    with system_packages.exclusive(LOCK):
        chroots.debootstrap(tarball, ARCH, arm64_cache("apt-archives"))
    return tarball


@pytest.fixture(scope="module")
def deb(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """infermux_0.1.0_all.deb, built by the install test's script (or kept from its build of this tree).

    After `base`: debootstrap runs first, while another chroot test may hold the build lock."""
    out = tmp_path_factory.mktemp("deb")
    with system_packages.exclusive(system_packages.BUILD_LOCK):  # shares the caches of the other chroot tests
        r = subprocess.run(["bash", str(REPO / "packaging/test-install.sh")], capture_output=True, text=True,
                           env={**os.environ, "BUILD_ONLY": str(out)}, timeout=1200)
    summary = r.stdout[r.stdout.rfind("== summary"):]
    print(summary)
    assert r.returncode == 0, summary or r.stdout[-3000:] + r.stderr[-3000:]
    return out / "infermux_0.1.0_all.deb"


@pytest.fixture(scope="module")
def layer(base: Path, deb: Path) -> Path:
    """The arm64 chroot with the package's Depends and onnxruntime installed, as a tarball."""
    with system_packages.exclusive(LOCK):
        return arm64_layer(base, depends_of(deb))


def depends_of(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def arm64_layer(base: Path, depends: str) -> Path:
    """`base` + `apt-get satisfy DEPENDS` + python3-pip + README.Debian's pip command, cached per Depends."""
    key = hashlib.sha256(f"{depends}\n{' '.join(ORT_INSTALL)}".encode()).hexdigest()[:16]
    tarball = arm64_cache() / f"bookworm-deps-{key}.tar"
    if tarball.is_file() and time.time() - tarball.stat().st_mtime < LAYER_DAYS * 86400:
        print(f"cached {tarball}")
        return tarball
    apt, pip = arm64_cache("apt-archives"), arm64_cache("pip")
    with Chroot(base) as c:
        c.mount({apt: "/var/cache/apt/archives", pip: "/root/.cache/pip"}, cpuinfo=jetson_cpuinfo())
        c.run("apt-get", "-q", "update")
        c.run("apt-get", "-y", "-q", "--no-install-recommends", "satisfy", depends, timeout=1200)
        c.run("apt-get", "-y", "-q", "--no-install-recommends", "install", "python3-pip", timeout=1200)
        c.run(*ORT_INSTALL, "--root-user-action=ignore", *host_certificates(c), timeout=900)
        c.path("/tmp/host-ca.crt").unlink(missing_ok=True)
        c.unmount()
        for old in arm64_cache().glob("bookworm-deps-*.tar"):
            old.unlink()  # made for other Depends
        chroots.pack(c.root, tarball)
    print(f"made {tarball}")
    return tarball


# What the infermux-wire package's arm64 build needs beyond the layer: a C compiler and Python's headers.
BUILD_TOOLS = ("gcc", "libc6-dev", "python3-dev")


@pytest.fixture(scope="module")
def build_layer(layer: Path) -> Path:
    """`layer` with BUILD_TOOLS installed, as a tarball, remade whenever `layer` is."""
    with system_packages.exclusive(LOCK):
        tarball = layer.with_name(f"{layer.stem}-cc.tar")  # arm64_layer's sweep of old layers takes it too
        if tarball.is_file() and tarball.stat().st_mtime >= layer.stat().st_mtime:
            print(f"cached {tarball}")
            return tarball
        with Chroot(layer) as c:
            c.mount({arm64_cache("apt-archives"): "/var/cache/apt/archives"}, cpuinfo=jetson_cpuinfo())
            c.run("apt-get", "-q", "update")
            c.run("apt-get", "-y", "-q", "--no-install-recommends", "install", *BUILD_TOOLS, timeout=1200)
            c.unmount()
            chroots.pack(c.root, tarball)
        print(f"made {tarball}")
        return tarball


def host_certificates(c: Chroot) -> list[str]:
    """pip's --cert for the host's CA bundle when the host's pip uses one (a TLS-intercepting proxy's CA)."""
    cert = os.environ.get("PIP_CERT", "")
    if not (cert and Path(cert).is_file()):
        return []
    c.path("/tmp/host-ca.crt").write_bytes(Path(cert).read_bytes())
    return ["--cert", "/tmp/host-ca.crt"]


def jetson_cpuinfo() -> str:
    """/proc/cpuinfo as an arm64 kernel writes it for a Jetson Orin's Cortex-A78AE cores, one per possible
    CPU of this host (the count the chroot's /sys reports)."""
    core = ("BogoMIPS\t: 62.50\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
            "asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
            "CPU part\t: 0xd42\nCPU revision\t: 1\n")
    return "".join(f"processor\t: {n}\n{core}\n" for n in possible_cpus())


def possible_cpus() -> list[int]:
    """/sys/devices/system/cpu/possible ("0-3,6") as numbers."""
    found: list[int] = []
    for part in Path("/sys/devices/system/cpu/possible").read_text().strip().split(","):
        low, _, high = part.partition("-")
        found += range(int(low), int(high or low) + 1)
    return found


# -- the steps -----------------------------------------------------------------------------------

class Steps:
    """Each step's name, verdict and seconds, printed at the end (pytest -rP shows it), as the x86 test does."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, name: str, action: Callable[[], object]) -> None:
        start = time.monotonic()
        try:
            action()
        except BaseException:
            self.lines.append(f"FAIL  {time.monotonic() - start:5.1f}s  {name}")
            raise
        self.lines.append(f"PASS  {time.monotonic() - start:5.1f}s  {name}")


@pytest.fixture
def steps() -> Iterator[Steps]:
    done = Steps()
    yield done
    print("== arm64 summary\n" + "\n".join(done.lines))


def install(c: Chroot, deb: Path) -> subprocess.CompletedProcess[str]:
    """`apt install ./infermux_0.1.0_all.deb`, as README.Debian's user would (not checked: callers do)."""
    c.path(f"/tmp/{deb.name}").write_bytes(deb.read_bytes())
    return c.run("apt-get", "-y", "-q", "--no-install-recommends", "install", f"/tmp/{deb.name}", check=False,
                 timeout=900)


@pytest.mark.slow
def test_the_deb_installs_serves_and_purges_on_arm64(emulator: system_packages.Emulator, deb: Path,
                                                    layer: Path, steps: Steps) -> None:
    with Chroot(layer) as c:
        c.mount(cpuinfo=jetson_cpuinfo())
        steps("the chroot runs aarch64 binaries", lambda: _is_aarch64(c))
        before = c.files(skip=NOT_THE_PACKAGES)
        steps("apt install ./infermux_0.1.0_all.deb (Depends met by the arm64 archive)", lambda: _installs(c, deb))
        added = c.files(skip=NOT_THE_PACKAGES) - before
        assert {"/usr/bin/infermux", CONFIG, "/var/lib/infermux/engines", c.resolve(UNIT)} <= added  # purge removes
        c.path(CONFIG).write_text(c.path(CONFIG).read_text() + COLD_MODEL)
        service = systemd_unit.start(c, UNIT, c.work / "journal.log")
        try:
            steps("the daemon starts as the unit says and sends READY=1", lambda: _ready(c, service))
            steps("infermux status", lambda: _status(c))
            sample = np.random.default_rng(2024).random((2, 3, 64, 64), dtype=np.float32)
            np.save(c.path("/tmp/input.npy"), sample)
            steps("infermux infer classifier (hot): onnxruntime's outputs on the host",
                  lambda: _infers_as_host(c, "classifier", sample))
            steps("infermux infer cold (a worker started on demand): the same",
                  lambda: _infers_as_host(c, "cold", sample))
            steps("the daemon and the cold worker run the aarch64 python",
                  lambda: _runs_aarch64(c, emulator, service))
            steps("infermux top draws the models in a pseudo-terminal", lambda: _console(c))
            steps("infermux doctor: exit 0, sees an aarch64 box, pyzmq's socket calls", lambda: _doctor(c))
            steps("systemctl stop: SIGTERM, exit 0, no process left", lambda: _stops(service))
        finally:
            service.close()
        steps("apt purge leaves nothing behind", lambda: _purged(c, before))


def _is_aarch64(c: Chroot) -> None:
    assert c.run("uname", "-m").stdout.strip() == MACHINE


def _installs(c: Chroot, deb: Path) -> None:
    r = install(c, deb)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Setting up infermux (0.1.0)" in r.stdout, r.stdout[-2000:]
    assert c.run("dpkg-query", "-W", "-f=${Status} ${Architecture}", "infermux").stdout == "install ok installed all"


def _ready(c: Chroot, service: systemd_unit.Service) -> None:
    seconds = service.wait_ready()
    print(f"READY=1 after {seconds:.1f} s: {next(m for m in service.messages if m.get('READY') == '1')}")
    log = service.tail()
    if service.nofile != service.unit.limit_nofile:
        print(f"LimitNOFILE={service.unit.limit_nofile} lowered to {service.nofile}: no CAP_SYS_RESOURCE here")
    assert f"limit {service.nofile} " in log, log  # LimitNOFILE= reached the daemon
    assert "Traceback" not in log and "Error in cpuinfo" not in log, log


def _status(c: Chroot) -> None:
    text = c.run("infermux", "status").stdout
    assert re.search(r"^classifier \*\s+1\s+hot\s+ready\s", text, re.M), text
    assert re.search(r"^cold \*\s+1\s+cold\s+unloaded\s", text, re.M), text  # no worker until asked


def _infers_as_host(c: Chroot, model: str, sample: np.ndarray) -> None:
    import onnxruntime

    out = f"/tmp/out-{model}"
    deadline, header = time.monotonic() + 180, {}
    while time.monotonic() < deadline:  # 503 while the worker starts and loads the model
        r = c.run("infermux", "infer", model, "--input", "images=/tmp/input.npy", "--save", out, "--json",
                  "--timeout", "60", check=False)
        header = json.loads(r.stdout) if r.stdout.startswith("{") else {"stderr": r.stderr}
        if header.get("status") != 503:
            break
        time.sleep(1)
    assert header.get("status") == 200, header
    got = np.load(c.path(f"{out}/probs.npy"))
    session = onnxruntime.InferenceSession(str(c.path(ENGINE)), providers=["CPUExecutionProvider"])
    want = session.run(None, {"images": sample})[0]
    # Not bit-equal: arm64's and x86-64's kernels sum in different orders (2e-8 apart when measured).
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


def _runs_aarch64(c: Chroot, emulator: system_packages.Emulator, service: systemd_unit.Service) -> None:
    status = json.loads(c.run("infermux", "status", "--json").stdout)
    (cold,) = [m for m in status["models"] if m["name"] == "cold"]
    worker = cold["worker"]["pid"]
    python = c.path(c.resolve("/usr/bin/python3"))
    for pid, what in ((service.pid, "infermux serve"), (worker, "infermux.workers.child")):
        # binfmt_misc ran qemu-aarch64 for it, and qemu mapped the chroot's aarch64 python.
        assert Path(os.readlink(f"/proc/{pid}/exe")) == emulator.interpreter.resolve(), pid
        assert f" {python}\n" in Path(f"/proc/{pid}/maps").read_text(), f"{python} not mapped in {pid}"
        assert what in Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace("\0", " ")
    assert elf_machine(python) == EM_AARCH64
    assert _ids(worker) == _ids(service.pid), "the worker runs as the daemon's user and groups"


def _ids(pid: int) -> list[str]:
    return [line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith(("Uid:", "Gid:", "Groups:"))]


def elf_machine(path: Path) -> int:
    """e_machine of an ELF file (little-endian, as both x86-64 and aarch64 Linux are)."""
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", path
    return int(struct.unpack_from("<H", header, 18)[0])


def _console(c: Chroot) -> None:
    screen = console_screen(c)
    assert "classifier" in screen and "cold" in screen, screen[-3000:]
    assert "Traceback" not in screen, screen[-3000:]


def console_screen(c: Chroot, timeout: float = 120) -> str:
    """`infermux top` on a 110x30 pseudo-terminal until a screen shows both models, then q; the text drawn."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 110, 0, 0))

    def terminal() -> None:  # the pty becomes the console's controlling terminal, as an SSH session's would
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    top = subprocess.Popen(c.command("infermux", "top"), env={**chroots.BASE_ENV, "TERM": "xterm-256color"},
                           stdin=slave, stdout=slave, stderr=slave, preexec_fn=terminal)
    os.close(slave)
    drawn, text = b"", ""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not ("classifier" in text and "cold" in text):
            if select.select([master], [], [], 0.5)[0]:
                try:
                    drawn += os.read(master, 65536)
                except OSError:  # the console exited and closed the terminal
                    break
                text = ANSI.sub("", drawn.decode(errors="replace"))
        os.write(master, b"q")
        assert top.wait(60) == 0, text[-3000:]
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        os.close(master)
    return text


def _doctor(c: Chroot) -> None:
    r = c.run("infermux", "doctor", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {check["name"]: check for check in json.loads(c.run("infermux", "doctor", "--json").stdout)}
    assert f" on {MACHINE} " in checks["Python"]["detail"], checks["Python"]
    assert "CPUExecutionProvider" in checks["onnxruntime"]["detail"], checks["onnxruntime"]
    assert checks["GPU"]["status"] == "WARN", checks["GPU"]  # no Jetson, no NVML: said, not failed
    # Only infermux is installed (infermux-wire is not built for arm64 here): the daemon served above without
    # the compiled extension, and doctor says so.
    assert "pyzmq's socket calls" in r.stdout, r.stdout


def _stops(service: systemd_unit.Service) -> None:
    status, left = service.stop()
    assert status == 0, service.tail()
    assert not left, f"still running after the daemon exited: {left}"


def _purged(c: Chroot, before: set[str]) -> None:
    r = c.run("apt-get", "-y", "-q", "purge", "infermux")
    assert "Purging configuration files for infermux" in r.stdout, r.stdout[-2000:]
    left = sorted(c.files(skip=NOT_THE_PACKAGES) - before)
    assert not left, f"left behind by apt purge: {left[:40]}"  # what the install added is all gone
    known = c.run("dpkg-query", "-W", "-f=${Status}", "infermux", check=False).stdout
    assert "installed" not in known.replace("not-installed", ""), known


# -- the compiled socket calls on arm64 ------------------------------------------------------------

@pytest.mark.slow
def test_the_compiled_socket_calls_build_and_serve_on_arm64(deb: Path, build_layer: Path, steps: Steps) -> None:
    """infermux-wire's C source, built by the arm64 compiler as its package build does (setuptools'
    flags for the extension: -O2, -ldl; -Wall, as Python's own build gives extensions), into the installed package, where the
    daemon then serves on it: its libzmq lookup, its ABI and its calls on aarch64, as a Jetson runs them.
    The Debian packaging around it (debian/rules moving the .so to infermux-wire) is the x86-64 install
    test's."""
    with Chroot(build_layer) as c:
        c.mount(cpuinfo=jetson_cpuinfo())
        steps("apt install ./infermux_0.1.0_all.deb", lambda: _installs(c, deb))
        steps("the compiled socket calls build for aarch64 without a warning", lambda: _builds_wire(c))
        service = systemd_unit.start(c, UNIT, c.work / "journal.log")
        try:
            steps("the daemon starts and sends READY=1", lambda: _ready(c, service))
            sample = np.random.default_rng(7).random((1, 3, 64, 64), dtype=np.float32)
            np.save(c.path("/tmp/input.npy"), sample)
            steps("infermux infer classifier through the compiled calls: onnxruntime's outputs on the host",
                  lambda: _infers_as_host(c, "classifier", sample))
            steps("status and doctor say the compiled calls run", lambda: _runs_compiled(c))
            steps("systemctl stop: SIGTERM, exit 0, no process left", lambda: _stops(service))
        finally:
            service.close()


def _builds_wire(c: Chroot) -> None:
    c.path("/tmp/_wire.c").write_bytes((REPO / "daemon/transport/_wire.c").read_bytes())
    where = c.run("python3", "-c", "import infermux.transport as t, os, sysconfig; "
                  "print(os.path.dirname(t.__file__)); print(sysconfig.get_paths()['include']); "
                  "print(sysconfig.get_config_var('EXT_SUFFIX'))").stdout.split()
    package, include, suffix = where
    assert suffix == f".cpython-311-{MACHINE}-linux-gnu.so", suffix
    r = c.run("gcc", "-shared", "-fPIC", "-O2", "-Wall", f"-I{include}", "/tmp/_wire.c",
              "-o", f"{package}/_wire{suffix}", "-ldl", timeout=600)
    assert not r.stderr.strip(), r.stderr  # not one warning from the arm64 compiler
    assert elf_machine(c.path(f"{package}/_wire{suffix}")) == EM_AARCH64


def _runs_compiled(c: Chroot) -> None:
    wire = json.loads(c.run("infermux", "status", "--json").stdout)["daemon"]["wire"]
    assert wire["kind"] == "compiled", wire
    checks = {check["name"]: check for check in json.loads(c.run("infermux", "doctor", "--json").stdout)}
    assert checks["wire"]["status"] == "OK" and "compiled socket calls" in checks["wire"]["detail"], checks["wire"]


# -- the same test on a broken package -----------------------------------------------------------

@pytest.mark.slow
def test_a_dependency_that_arm64_lacks_fails_the_install(deb: Path, layer: Path, tmp_path: Path) -> None:
    """What the x86-64 test cannot see: libc6-i386 exists for amd64 only. A scratch build that depends on it
    must fail the arm64 install, though this chroot already holds every other dependency."""
    broken = scratch_build(deb, tmp_path, extra_depends="libc6-i386")
    with Chroot(layer) as c:
        c.mount(cpuinfo=jetson_cpuinfo())
        r = install(c, broken)
    assert r.returncode != 0, r.stdout[-2000:]
    assert re.search(r"Depends: libc6-i386 but it is not installable", r.stdout + r.stderr), r.stdout + r.stderr


def scratch_build(deb: Path, where: Path, extra_depends: str) -> Path:
    """The .deb again with one more Depends (dpkg-deb unpacks and repacks it; nothing else changes)."""
    tree = where / "tree"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True, timeout=120)
    control = tree / "DEBIAN/control"
    control.write_text(re.sub(r"^Depends: (.*)$", rf"Depends: \1, {extra_depends}", control.read_text(),
                              count=1, flags=re.M))
    out = where / deb.name
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(tree), str(out)], check=True, capture_output=True,
                   timeout=300)
    assert extra_depends in depends_of(out)
    return out


# -- what the test relies on, checked everywhere (no root, no emulation) ----------------------------

def test_readme_debian_gives_the_onnxruntime_command_the_test_runs() -> None:
    assert f"sudo {' '.join(ORT_INSTALL)}" in (REPO / "debian/README.Debian").read_text()


def test_the_launcher_knows_every_setting_of_the_unit() -> None:
    unit = systemd_unit.ServiceUnit.read(REPO / "packaging/infermux.service")
    assert unit.type == "notify" and unit.user == "infermux" and unit.runtime_directory == "infermux"
    assert unit.exec_start[0] == "/usr/bin/infermux" and unit.limit_nofile == 65536


def test_the_fake_cpuinfo_describes_every_possible_cpu() -> None:
    text = jetson_cpuinfo()
    assert text.count("processor\t:") == len(possible_cpus()) >= 1
    assert "CPU implementer\t: 0x41" in text  # Arm Ltd.: what onnxruntime's cpuinfo library looks for


def test_paths_resolve_as_the_chroot_sees_them(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "usr/lib/systemd/system").mkdir(parents=True)
    (tree / "usr/bin").mkdir()
    (tree / "lib").symlink_to("usr/lib")  # merged /usr, as debootstrap makes bookworm
    (tree / "usr/bin/python3").symlink_to("python3.11")
    (tree / "usr/bin/py").symlink_to("/lib/../bin/python3")
    chroots.pack(tree, tmp_path / "tree.tar")
    with Chroot(tmp_path / "tree.tar") as c:
        assert c.resolve(UNIT) == "/usr/lib/systemd/system/infermux.service"
        assert c.resolve("/usr/bin/python3") == c.resolve("/usr/bin/py") == "/usr/bin/python3.11"
        assert c.resolve("/etc/passwd") == "/etc/passwd"  # absent or plain: as given


def test_a_chroot_left_mounted_by_a_killed_run_is_swept_by_the_next(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount")
    ended = subprocess.Popen(["true"])
    ended.wait()
    abandoned = tmp_path / f"{chroots.WORK_PREFIX}{ended.pid}.x1"
    (abandoned / "root/proc").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "abandoned", str(abandoned / "root/proc")], check=True)
    (abandoned / "root/proc/held").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "nested", str(abandoned / "root/proc/held")], check=True)
    in_use = tmp_path / f"{chroots.WORK_PREFIX}{os.getpid()}.x2"
    in_use.mkdir()
    unnamed = tmp_path / f"{chroots.WORK_PREFIX}x3"  # made before the maker's pid was in the name
    unnamed.mkdir()
    try:
        assert chroots.sweep_abandoned(tmp_path) == [abandoned]
        assert not abandoned.exists() and in_use.is_dir() and unnamed.is_dir()
        assert str(abandoned) not in Path("/proc/mounts").read_text()
    finally:
        for target in (abandoned / "root/proc/held", abandoned / "root/proc"):
            subprocess.run(["umount", "-l", str(target)], capture_output=True)
