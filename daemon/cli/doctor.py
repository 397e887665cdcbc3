"""`infermux doctor`: what this device lacks to serve, one line per check, with the fix.

Run it after `apt install infermux` (or a pip install): Python and the
libraries, the backends (onnxruntime and its providers, TensorRT,
cuda-python and whether it releases the GIL), the GPU (Jetson model, or
name and driver through NVML), the configuration and its engines, the
sockets' folder and the caller's group, the limits; each configured camera
opened once, one frame decoded within CAMERA_PROBE_S, and the decoder it
uses; each sink reached once (a broker connected to, an endpoint's
connection opened, a file's folder writable; no event is sent). Each line is OK, WARN
(works, but something is missing or unusual) or FAIL (the daemon will not
serve as configured). Exit status: 0 no FAIL, 1 at least one FAIL,
2 usage. `--json` prints the same checks as a JSON list.
"""

from __future__ import annotations

import argparse
import grp
import importlib
import importlib.metadata as md
import itertools
import json
import os
import platform
import re
import resource
import stat
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Iterable, Iterator

from infermux import config as cfg
from infermux import format as fmt
from infermux.cli.serve import DEFAULT_CONFIG
from infermux.plugins.base import BackendError

if TYPE_CHECKING:
    from infermux.config import SinkConfig
    from infermux.cameras.config import CameraConfig
    from infermux.cameras.source import Probe

# cuda-bindings releases the GIL around its C calls from these versions on
# (docs/tensorrt.md): with older ones every stream synchronize stalls the daemon.
GIL_RELEASED_FROM = {12: (12, 9, 1), 13: (13, 0, 0)}
CUDA_PYTHON_PIN = "cuda-python>=12.9.1,<13"
MIN_NOFILE = 4096
CAMERA_PROBE_S = 10.0  # a camera's open and first frame, at most (they are probed side by side)
SINK_PROBE_S = 5.0  # a sink's connection, at most (they are probed side by side)
GROUP = "infermux"


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, its status, what was found and what to do."""

    name: str
    status: str  # "OK", "WARN" or "FAIL"
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail}" + (f" -> {self.fix}" if self.fix else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help=f"configuration file (default: $INFERMUX_CONFIG or {DEFAULT_CONFIG}, "
                        "else the one the daemon on the default sockets in the runtime directory serves, as "
                        "`status` and `infer` find it)")
    parser.add_argument("--runtime-dir", help="where the daemon's sockets are (as for `infermux serve`)")
    parser.add_argument("--json", action="store_true", help="print the checks as a JSON list")


def run(args: argparse.Namespace) -> int:
    path, found = configuration_path(args.config, args.runtime_dir)
    checks = diagnose(Path(path), args.runtime_dir)
    at = next((i for i, c in enumerate(checks) if c.name == "configuration"), len(checks))
    if found:  # say where the file came from, beside its own line
        checks.insert(at, Check("daemon", "OK", found))
    elif at < len(checks) and checks[at].status == "FAIL" and not args.config and not os.path.exists(path):
        checks[at] = replace(checks[at], fix="give --config FILE, or start the daemon with it (`infermux serve "
                             "--config FILE`) and run doctor again: it asks the daemon on the default sockets")
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        print("\n".join(c.line() for c in checks))
    return 1 if any(c.status == "FAIL" for c in checks) else 0


def configuration_path(given: str | None, runtime_dir: str | None) -> tuple[str, str]:
    """The configuration to check, and how it was found ("" when named): --config, else
    $INFERMUX_CONFIG, else the installed one, else, in a checkout, the file of the daemon listening on
    the default sockets of the runtime directory (as the other client commands find that daemon);
    else the installed path, whose check says it is missing."""
    named = given or os.environ.get("INFERMUX_CONFIG")
    if named or os.path.exists(DEFAULT_CONFIG):
        return named or DEFAULT_CONFIG, ""
    served = served_configuration(runtime_dir)
    if served is None:
        return DEFAULT_CONFIG, ""
    endpoint, path = served
    return path, f"{endpoint} answers, serving {path} (no {DEFAULT_CONFIG}: not installed)"


ASK_S = 2.0  # how long doctor waits for a daemon it looks for on the default sockets


def served_configuration(runtime_dir: str | None) -> tuple[str, str] | None:
    """(admin endpoint, configuration file) of the daemon on the default admin socket in the runtime
    directory; None where none answers (no socket, no reply within ASK_S, an unsafe folder, ...)."""
    from infermux.cli.common import present
    from infermux.client import AdminClient
    from infermux.transport import ipc

    defaults = cfg.DaemonConfig()
    endpoint = cfg.resolve_endpoint(defaults.admin, cfg.runtime_dir(defaults, runtime_dir))
    try:
        ipc.check_directory(endpoint)
        present(endpoint)
        with AdminClient(endpoint, timeout_s=ASK_S) as admin:
            admin.ping(ASK_S)
            path = admin.call("status")["daemon"]["config"]
    except Exception:  # whatever the reason (absent, refused, not a daemon), there is no daemon to ask
        return None
    return (endpoint, path) if isinstance(path, str) and path else None


def diagnose(config_path: Path, runtime_dir: str | None = None) -> list[Check]:
    """Every check, in the order an operator would fix things."""
    checks = [_python(), *_libraries()]
    backends = _backends()
    checks += backends
    checks += _device()
    checks += _configuration(config_path, runtime_dir, tensorrt_ok=_passed(backends, "TensorRT"))
    checks += [_group(), _nofile()]
    return checks


def _passed(checks: Iterable[Check], name: str) -> bool:
    return any(c.name == name and c.status == "OK" for c in checks)


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # a broken install raises anything (ImportError, OSError from a missing .so, ...)
        return None


def _python() -> Check:
    v = sys.version_info
    # The machine too: a report pasted from a Jetson (aarch64) must not be mistaken for an x86-64 one's.
    detail = (f"{platform.python_implementation()} {v.major}.{v.minor}.{v.micro} on {platform.machine()} "
              f"({sys.executable})")
    if v < (3, 10):
        return Check("Python", "FAIL", detail, "infermux needs Python 3.10 or newer")
    return Check("Python", "OK", detail)


def _libraries() -> list[Check]:
    checks = []
    numpy = _import("numpy")
    checks.append(Check("numpy", "OK", numpy.__version__) if numpy else
                  Check("numpy", "FAIL", "not importable", "apt install python3-numpy (or pip install numpy)"))
    zmq = _import("zmq")
    checks.append(Check("pyzmq", "OK", f"pyzmq {zmq.pyzmq_version()}, libzmq {zmq.zmq_version()}") if zmq else
                  Check("pyzmq", "FAIL", "not importable", "apt install python3-zmq (or pip install pyzmq)"))
    if zmq:
        checks.append(_wire())
    return checks


def _wire() -> Check:
    """The frontend's socket calls (transport/wire.py): compiled, or pyzmq's (it serves either way)."""
    from infermux.transport.wire import choose

    choice = choose()
    if choice.compiled or choice.chosen:  # compiled, or pyzmq's on purpose
        return Check("wire", "OK", choice.describe())
    return Check("wire", "WARN", f"{choice.describe()} (it serves, at more CPU a request)")


def _backends() -> list[Check]:
    checks = [_onnxruntime(), _tensorrt()]
    checks.append(_cuda_python(tensorrt_ok=checks[1].status == "OK"))
    if not any(c.status == "OK" for c in checks[:2]):
        checks.append(Check("backend", "FAIL", "neither onnxruntime nor TensorRT is importable",
                            "install one (README.Debian, docs/tensorrt.md)"))
    return checks


def _onnxruntime() -> Check:
    ort = _import("onnxruntime")
    if ort is None:
        return Check("onnxruntime", "WARN", "not installed (needed for .onnx engines)",
                     "pip install onnxruntime (onnxruntime-gpu for CUDA; NVIDIA's wheel on Jetson)")
    providers = ", ".join(ort.get_available_providers())
    return Check("onnxruntime", "OK", f"{ort.__version__}, providers: {providers}")


def _tensorrt() -> Check:
    from infermux.plugins.backends import trtlib

    if _import("tensorrt") is None:
        return Check("TensorRT", "WARN", "not installed (needed for .plan engines)",
                     "Jetson: apt install python3-libnvinfer (JetPack); dGPU: NVIDIA's CUDA repository "
                     "or pip install 'tensorrt-cu12>=10.3,<11' (README.Debian)")
    try:
        trt = trtlib.import_tensorrt()  # the backend's own version rules
    except BackendError as exc:
        return Check("TensorRT", "FAIL", str(exc).split(";")[0], "install TensorRT 10.1 or newer (README.Debian)")
    return Check("TensorRT", "OK", str(trt.__version__))


def _cuda_python(tensorrt_ok: bool) -> Check:
    version = _version("cuda-bindings") or _version("cuda-python")
    if version is None or (_import("cuda.bindings.runtime") is None and _import("cuda.cudart") is None):
        status = "FAIL" if tensorrt_ok else "WARN"
        return Check("cuda-python", status, "not installed (the TensorRT backend's CUDA binding)",
                     f"pip install '{CUDA_PYTHON_PIN}' for this Python ({sys.executable})")
    release = _release(version)
    needed = GIL_RELEASED_FROM.get(release[0], (999,))
    if release < needed:
        return Check("cuda-python", "FAIL" if tensorrt_ok else "WARN",
                     f"{version} holds the GIL in every CUDA call (frontend and executors stall)",
                     f"pip install '{CUDA_PYTHON_PIN}'")
    return Check("cuda-python", "OK", f"{version}, releases the GIL around CUDA calls")


def _release(version: str) -> tuple[int, ...]:
    """(12, 9, 1) from "12.9.1.post2" or "12.9.1rc1": the leading dotted numbers."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in match.group(0).split(".")) if match else ()


def _device() -> list[Check]:
    from infermux.models import budget

    model = _read("/proc/device-tree/model").strip("\0 \n")
    if budget.is_jetson():
        return [Check("GPU", "OK", f"Jetson: {model or 'model unknown'} ({_read('/etc/nv_tegra_release')[:60].strip()})")]
    nvml = budget.Nvml.open()
    if nvml is None:
        return [Check("GPU", "WARN", "no NVIDIA GPU found (no NVML driver library, not a Jetson): "
                      "onnxruntime runs on the CPU", "on a GPU machine: install the NVIDIA driver")]
    total, _ = nvml.memory()
    return [Check("GPU", "OK", f"{nvml_name()}, driver {nvml_driver()}, {total >> 20} MiB")]


def nvml_name() -> str:
    """The first visible GPU's name (NVML is initialised by budget.Nvml.open)."""
    return _nvml_string("nvmlDeviceGetName", device=True)


def nvml_driver() -> str:
    return _nvml_string("nvmlSystemGetDriverVersion", device=False)


def _nvml_string(call: str, device: bool) -> str:
    import ctypes

    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        buf = ctypes.create_string_buffer(96)
        if device:
            handle = ctypes.c_void_p()
            lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
            rc = getattr(lib, call)(handle, buf, 96)
        else:
            rc = getattr(lib, call)(buf, 96)
        return buf.value.decode() if rc == 0 else "?"
    except (OSError, AttributeError):
        return "?"


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _configuration(path: Path, runtime_dir: str | None, tensorrt_ok: bool) -> list[Check]:
    try:
        config = cfg.load(path)
    except cfg.LibraryMissing as exc:
        return [Check("libraries", "FAIL", f"{exc.path}: {exc.reason}", f"install: {exc.requirement.how()}")]
    except cfg.ConfigError as exc:
        return [Check("configuration", "FAIL", str(exc), "fix the file (infermux(1) lists every setting)")]
    checks = [Check("configuration", "OK", f"{path}: {len(config.models)} model(s)")]
    checks += [_engine(m.name, m.version, m.engine, tensorrt_ok) for m in config.models]
    checks += _signatures(config)
    checks += _cameras(config)
    checks += _sinks(config)
    checks.append(_engine_dir(config.daemon.engine_dir, config.daemon.admin_group))
    if config.daemon.watch:
        checks += _discovered(config, tensorrt_ok)
    checks.append(_sockets(config, cfg.runtime_dir(config.daemon, runtime_dir)))
    checks.append(_budget(config))
    checks.append(_mps(config))
    return checks


def _cameras(config: cfg.Config) -> list[Check]:
    """Each camera opened and one frame decoded, side by side, each within CAMERA_PROBE_S."""
    if not config.cameras:
        return []
    from concurrent.futures import ThreadPoolExecutor

    from infermux.cameras.source import probe

    with ThreadPoolExecutor(max_workers=min(8, len(config.cameras))) as pool:
        probes = list(pool.map(lambda camera: probe(camera, CAMERA_PROBE_S), config.cameras))
    return [_camera(camera, found) for camera, found in zip(config.cameras, probes)]


# What to do when a camera gives no frame, by the kind of its url.
CAMERA_FIXES = {
    "rtsp": "check that the camera is on and reachable from this box, its url (path, user, password), and try "
            "the other transport (transport = \"tcp\" or \"udp\")",
    "http": "check that the url gives an MJPEG stream (open it in a browser) from this box",
    "device": "check that the device exists and that the daemon's user is in group video",
    "file": "check the file's path, that the daemon's user can read it and that it plays (ffprobe FILE)",
}


def _camera(camera: CameraConfig, found: Probe) -> Check:
    """One camera's line: the decoder and its first frame, or why none came and what to do."""
    name = f"camera {fmt.printable(camera.name)}"
    if not found.error:
        width, height = found.size or (0, 0)
        return Check(name, "OK", f"{found.decoder}: a {width}x{height} frame in {found.ms:.0f} ms")
    status = "WARN" if not camera.enabled else "FAIL"  # a disabled camera does not stop the daemon serving
    fix = "raise or drop the setting the reason names" if found.refused else CAMERA_FIXES.get(camera.kind, "")
    where = "" if found.decoder == "none" else f"{found.decoder}: "
    return Check(name, status, where + fmt.printable(found.error, 300) + ("" if camera.enabled else " (disabled)"), fix)


def _sinks(config: cfg.Config) -> list[Check]:
    """Each sink reached once, side by side, each within SINK_PROBE_S: a broker, an endpoint, a file."""
    if not config.sinks:
        return []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, len(config.sinks))) as pool:
        return list(pool.map(_sink, config.sinks))


def _sink(sink: SinkConfig) -> Check:
    """One sink's line: what its probe reached, or what is wrong (a held address only warns)."""
    from infermux.plugins import sinks  # the sinks and their libraries load only where a sink is configured

    name = f"sink {fmt.printable(sink.name)} ({fmt.printable(sink.kind)})"
    try:
        reached = sinks.probe(sink.kind, sink.options, SINK_PROBE_S)
    except sinks.SinkInUse as exc:
        return Check(name, "WARN", fmt.printable(str(exc), 300), "stop the program holding it, if not the daemon")
    except (sinks.SinkDown, sinks.SinkConfigError) as exc:
        return Check(name, "FAIL", fmt.printable(str(exc), 300), SINK_FIXES.get(sink.kind, "see docs/events.md#sinks"))
    except Exception as exc:  # noqa: BLE001 - a plugin's own bug: one line, as for any other failure
        return Check(name, "FAIL", fmt.printable(f"{type(exc).__name__}: {exc}", 300), "report it to the plugin")
    if reached is None:
        return Check(name, "WARN", "the kind has no probe: not checked", "")
    return Check(name, "OK", fmt.printable(reached, 300))


# What to do when a sink cannot be reached, by its kind; events wait in its spool meanwhile.
SINK_FIXES = {
    "mqtt": "check that the broker runs and is reachable from this box, and the sink's port, TLS and "
            "credentials_file (events wait in the spool meanwhile)",
    "webhook": "check that the endpoint runs and is reachable from this box, and its url and ca_file "
               "(events wait in the spool meanwhile)",
    "zmq": "choose a bind address free on this box",
    "jsonl": "give the daemon's user a folder it may write, or change the sink's path",
}


def _mps(config: cfg.Config) -> Check:
    """`[daemon] mps`: whether cold workers would run as MPS clients, asked of the control daemon now."""
    from infermux.workers import mps

    daemon = config.daemon
    shares = [m for m in config.models if m.mps_thread_percentage] or daemon.mps_thread_percentage
    if daemon.mps == "off":
        if shares:
            return Check("MPS", "WARN", "mps_thread_percentage is set but [daemon] mps = \"off\": it has no effect",
                         'set [daemon] mps = "auto" or "on"')
        return Check("MPS", "OK", "off ([daemon] mps): cold workers are plain CUDA processes")
    found = mps.probe(daemon.mps, daemon.mps_pipe_dir)
    if found.active:
        return Check("MPS", "OK", f"{daemon.mps}: cold workers join the control daemon in {daemon.mps_pipe_dir}")
    if daemon.mps == "auto":
        return Check("MPS", "OK", f"auto: {found.detail}, so cold workers run without MPS")
    if mps.control_binary() is None:
        return Check("MPS", "FAIL", f"on: {found.detail}; cold workers will not start",
                     'install the NVIDIA driver\'s utilities (nvidia-cuda-mps-control), or set mps = "auto"')
    return Check("MPS", "OK", f"on: {found.detail}; the daemon starts `{mps.CONTROL} -d` at the first cold worker")


def _engine(name: str, version: str, engine: Path, tensorrt_ok: bool) -> Check:
    what = f"engine {name} {version}"
    if not engine.is_file():
        return Check(what, "FAIL", f"{engine} does not exist", "put the engine there, or fix `engine =`")
    if not os.access(engine, os.R_OK):
        return Check(what, "FAIL", f"{engine} is not readable by uid {os.getuid()}",
                     f"chmod g+r {engine} (the daemon runs as user {GROUP})")
    if engine.suffix in (".plan", ".engine"):
        return _plan(what, engine, tensorrt_ok)
    return Check(what, "OK", str(engine))


def _signatures(config: cfg.Config) -> list[Check]:
    """Under engine_signing_keys, each configured engine's signature, checked as the daemon will."""
    import tempfile

    from infermux.models.verified import EngineSigning

    if not config.daemon.engine_signing_keys:
        return []
    checks = []
    with tempfile.TemporaryDirectory() as scratch:
        signing = EngineSigning.from_files(config.daemon.engine_signing_keys, Path(scratch))
        for m in config.models:
            why = signing.problem(m) if m.engine.is_file() else None
            checks.append(Check(f"signature {m.name} {m.version}", "FAIL", why,
                                f"sign it where it is published: infermux sign --key PUBLISHER.key {m.engine}")
                          if why else Check(f"signature {m.name} {m.version}", "OK", "signed by a trusted key"))
    return checks


def _plan(what: str, engine: Path, tensorrt_ok: bool) -> Check:
    """A TensorRT plan is only good on the TensorRT version (and GPU) that built it: try it."""
    from infermux.plugins.backends import trtlib

    if not tensorrt_ok:
        return Check(what, "FAIL", f"{engine} is a TensorRT plan and TensorRT is missing", "see the TensorRT line")
    shared = trtlib.shared()
    try:
        plan = shared.runtime.deserialize_cuda_engine(engine.read_bytes())
        error = shared.last_error() or "TensorRT returned no engine"
    except Exception as exc:  # the bindings raise their own types (and RuntimeError on CUDA errors)
        plan, error = None, str(exc)
    version = shared.trt.__version__
    if plan is None:
        return Check(what, "FAIL", f"{engine} does not deserialize on TensorRT {version}: {error}",
                     f"rebuild it on this device: infermux build MODEL.onnx -o {engine}")
    return Check(what, "OK", f"{engine} deserializes on TensorRT {version}")


def _discovered(config: cfg.Config, tensorrt_ok: bool) -> list[Check]:
    """The engines the daemon would find in engine_dir beyond [[models]] (an upgrade invalidates plans there)."""
    from infermux.swap import watcher

    configured = {m.engine.resolve() for m in config.models}
    try:
        found = watcher.scan(config.daemon.engine_dir, watcher.Settler(0.0)).engines.values()
    except OSError:
        return []  # the engine_dir line says why
    return [_engine(e.model, e.version, e.path, tensorrt_ok) for e in sorted(found, key=lambda e: str(e.path))
            if e.path.resolve() not in configured]


def _engine_dir(path: Path, admin_group: str) -> Check:
    admin = admin_group or GROUP
    if not path.is_dir():
        return Check("engine_dir", "WARN", f"{path} does not exist (nothing to discover)",
                     f"sudo install -d -o {GROUP} -g {admin} -m 2775 {path}")
    if not os.access(path, os.R_OK | os.X_OK):
        return Check("engine_dir", "FAIL", f"{path} is not readable by uid {os.getuid()}", f"chmod 2775 {path}")
    found = open_to_others(path, admin_group)
    if found:
        return Check("engine_dir", "FAIL", f"{found}: whoever can write there publishes, replaces or removes models "
                     f"and sets their backend and contexts (docs/security.md)",
                     f"sudo chgrp -R {admin} {path} && sudo chmod -R o-w {path}")
    return Check("engine_dir", "OK", str(path))


ENGINE_DIR_ENTRIES = 2000  # entries looked at below engine_dir: models, versions, their files


def open_to_others(path: Path, admin_group: str) -> str:
    """The first entry of engine_dir (itself, its model and version folders and their files) that a
    user outside the admin group may write: writable by every user, or by a group other than
    `admin_group` (the clients' group, mostly); "" when there is none. Without `admin_group` (set
    off, or no such group on this box) only the first kind is looked for."""
    try:
        admin_gid: int | None = grp.getgrnam(admin_group).gr_gid if admin_group else None
    except KeyError:
        admin_gid = None
    for entry in itertools.islice(_tree(path, depth=3), ENGINE_DIR_ENTRIES):
        try:
            info = entry.lstat()
        except OSError:
            continue
        if stat.S_ISLNK(info.st_mode):
            continue
        if info.st_mode & stat.S_IWOTH:
            return f"{entry} is writable by every user (mode {stat.S_IMODE(info.st_mode):o})"
        if admin_gid is not None and info.st_mode & stat.S_IWGRP and info.st_gid not in (admin_gid, 0):
            return (f"{entry} is writable by group {_group_name(info.st_gid)}, not only by the admin group "
                    f"{admin_group}")
    return ""


def _tree(path: Path, depth: int) -> Iterator[Path]:
    """`path` and what lies below it, `depth` levels down (engine_dir/model/version/file), links not followed."""
    yield path
    if depth and path.is_dir() and not path.is_symlink():
        try:
            children = sorted(path.iterdir())
        except OSError:
            return
        for child in children:
            yield from _tree(child, depth - 1)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _sockets(config: cfg.Config, run_dir: Path) -> Check:
    endpoints = [cfg.resolve_endpoint(e, run_dir) for e in config.daemon.listen]
    sockets = [Path(e[len("ipc://"):]) for e in endpoints if e.startswith("ipc:///")]
    if not sockets:
        return Check("sockets", "OK", f"tcp only: {', '.join(endpoints)}")
    folder = sockets[0].parent
    if not folder.is_dir():
        return Check("sockets", "WARN", f"{folder} does not exist: the daemon is not running",
                     "sudo systemctl enable --now infermux (it makes the folder)")
    if not os.access(folder, os.X_OK) or (sockets[0].exists() and not os.access(sockets[0], os.R_OK | os.W_OK)):
        return Check("sockets", "FAIL", f"{sockets[0]}: no access for uid {os.getuid()}",
                     f"sudo adduser $USER {GROUP}, then log in again")
    state = "listening" if sockets[0].exists() else "no socket yet (daemon not running?)"
    return Check("sockets", "OK", f"{sockets[0]}: {state}")


def _group() -> Check:
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        return Check("group", "WARN", f"no group {GROUP} (the package's sysusers file makes it)",
                     "install the .deb, or sudo groupadd --system infermux")
    if os.geteuid() == 0 or gid in os.getgroups():
        return Check("group", "OK", f"uid {os.getuid()} may use the daemon's sockets")
    return Check("group", "WARN", f"uid {os.getuid()} is not in group {GROUP}: no access to the sockets",
                 f"sudo adduser $USER {GROUP}, then log in again")


def _nofile() -> Check:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < MIN_NOFILE:
        return Check("RLIMIT_NOFILE", "WARN", f"{soft} open files (hard {hard}): many clients run out",
                     f"ulimit -n {MIN_NOFILE} (the unit sets LimitNOFILE=)")
    return Check("RLIMIT_NOFILE", "OK", f"{soft} (hard {hard})")


def _budget(config: cfg.Config) -> Check:
    from infermux.models import budget

    total = budget.meminfo("MemTotal")
    nvml = None if budget.is_jetson() else budget.Nvml.open()
    where = "host memory"
    if nvml is not None:
        total, where = nvml.memory()[0], "GPU memory"
    allowed = cfg.parse_budget(config.path, config.daemon.memory_budget, total)
    detail = f"{config.daemon.memory_budget} = {allowed >> 20} MiB of {total >> 20} MiB {where}"
    if total and allowed > total:
        return Check("memory budget", "FAIL", detail, "lower [daemon] memory_budget")
    return Check("memory budget", "OK", detail)
