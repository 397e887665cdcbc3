"""Configuration (docs/architecture.md#configuration): TOML in, typed and validated dataclasses out.

Every error names the file, the field path (`models[name="a"].contexts`:
a model entry by its name, and its version where the name is shared) and
the reason; a misspelled field gets the nearest known one. The daemon
refuses to start on it and keeps the old configuration on reload.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from infermux import signing, sinkconfig
from infermux.plugins import backends, processors
from infermux.plugins.requirements import MissingDependency
from infermux.sinkconfig import LifecycleConfig, SinkConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

STRATEGIES = ("least_queue", "weighted", "hash")
HOT, COLD = "hot", "cold"
PLACEMENTS = (HOT, COLD)  # where a version runs: in the daemon, or in a worker process of its own
# `mode`, the key's old name, and its values: still read, so that older files keep working.
OLD_PLACEMENT_NAMES = {"inproc": HOT, "multiproc": COLD}
VERSION_POLICIES = ("latest", "all", "specific")
MAX_FALLBACK_DEPTH = 4
MAX_CONTEXTS = 1024  # the most [daemon] max_contexts may allow
MAX_WEIGHT = 1_000_000  # a weighted split's largest weight: ratios, not amounts
MPS_MODES = ("off", "auto", "on")
# How a queue treats a request's `key` (docs/protocol.md#streams): "fifo" serves keys in turn and keeps
# what it accepted; "newest_per_key" treats a key as a camera's stream, whose newer frame replaces its
# oldest queued one (answered 409).
QUEUE_POLICIES = ("fifo", "newest_per_key")
STREAM_KEYS = ("open", "bound")  # [daemon] stream_keys: anyone may send a key, or its first client only


class ConfigError(Exception):
    """A configuration problem: `file: path: reason`."""

    def __init__(self, file: Path | str, path: str, reason: str) -> None:
        self.file, self.path, self.reason = str(file), path, reason
        super().__init__(f"{file}: {path}: {reason}" if path else f"{file}: {reason}")


class LibraryMissing(ConfigError):
    """The file is valid, but a library one of its steps needs is not installed here: `requirement`
    says what to install (plugins/requirements.py). Not the file's fault, so not reported as such."""

    def __init__(self, file: Path | str, path: str, missing: MissingDependency) -> None:
        super().__init__(file, path, str(missing))
        self.requirement = missing.requirement


@dataclass(frozen=True)
class DaemonConfig:
    """The `[daemon]` table."""

    listen: tuple[str, ...] = ("ipc://infer.sock",)
    admin: str = "ipc://admin.sock"
    stats: str = "ipc://stats.sock"
    runtime_dir: str = ""
    engine_dir: Path = Path("/var/lib/infermux/engines")
    memory_budget: str = "80%"
    max_message_bytes: int = 64 * 1024 * 1024
    max_reply_bytes: int = 64 * 1024 * 1024  # a reply's header and output frames; default: max_message_bytes
    # After a reply over it, the same connection's requests of the same shapes are refused uncomputed this long
    # (frontend/oversize.py); 0: never.
    oversize_memory_s: float = 1.0
    max_header_bytes: int = 64 * 1024     # request limits: docs/security.md
    max_tensors: int = 64
    max_rank: int = 8
    max_elements: int = 1 << 28
    max_shared_input_bytes: int = 256 << 20  # inputs read from shared-memory regions, per request
    curve_secret_key: Path | None = None  # CURVE for tcp:// listeners (docs/security.md)
    curve_authorized_dir: Path | None = None
    allow_insecure_tcp: bool = False
    drain_timeout_s: float = 10.0
    log_level: str = "info"
    traceback_interval_s: float = 10.0  # a repeated traceback: logged once, then a count per interval (events.py)
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 for a pod's probes and scrapes (docs/deployment.md)
    inline_max_us: int = 500        # compute on the frontend thread when idle and this short (inline.py)
    inline_busy_max_us: int = 250   # ... and when other requests wait, only this short
    watch: bool = True              # discover and hot-swap engines under engine_dir (docs/hot-swap.md)
    watch_settle_s: float = 1.0     # a file written in place is taken once unchanged this long
    watch_debounce_s: float = 0.05  # events closer than this are handled as one
    watch_rescan_s: float = 5.0     # full rescan even without events (lost events, NFS); 0 = never
    spare_worker: bool = True  # keep one worker started ahead for the next cold model
    worker_hang_s: float = 10.0  # a worker silent this long is killed and replaced
    shared_memory: str = "regions.sock"  # where local clients register tensor regions (regions.py); "" = off
    max_connections: int = 4096  # live connections to the inference socket; past it, silent ones make room (peers.py)
    reserved_fds: int = 512  # descriptors kept free of connections: engines, workers, regions (peers.py)
    # Cold workers as CUDA MPS clients (workers/mps.py): "auto" joins a running control daemon.
    mps: str = "off"
    mps_pipe_dir: Path = Path("/tmp/nvidia-mps")  # CUDA's default CUDA_MPS_PIPE_DIRECTORY
    mps_thread_percentage: int = 0  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of each worker; 0 = MPS's own (100)
    admin_group: str = "infermux-admin"  # admin.sock's group, apart from the clients' (docs/security.md)
    max_contexts: int = 32  # contexts one version may have: the file, a model.toml or `set contexts`
    follow_symlinks: bool = True  # serve engine_dir folders that link outside it (logged; docs/hot-swap.md)
    state_dir: str = ""  # operators' live changes, kept across restarts (models/statefile.py); "" = systemd's
    # Per-stream accounting (execution/streams.py, docs/protocol.md#streams): a stream that sent two
    # requests then nothing for this long is `stream_silent` (0: never); Prometheus shows the busiest
    # `stream_metrics_keys` keys of each model by name and sums the rest as key="other"; at most
    # `stream_max_keys` streams are tracked (the least recently seen is forgotten past it).
    stream_silent_s: float = 5.0
    stream_metrics_keys: int = 32
    stream_max_keys: int = 1024
    # STREAM_KEYS: "bound" gives a stream's key to the first client that sends it (its connection, or
    # its CURVE key over tcp://) until it has sent nothing for stream_silent_s; others' requests are 403.
    stream_keys: str = "open"
    # Ed25519 public keys (PEM) of trusted publishers: with any, only engines one of them signed load
    # (docs/security.md#signed-engines).
    engine_signing_keys: tuple[Path, ...] = ()
    record_max_bytes: int = 1 << 30  # the tensors one `infermux record` may hold, inputs and outputs (recorder.py)


@dataclass(frozen=True)
class RoutingConfig:
    """The `[routing]` table."""

    strategy: str = "least_queue"
    unknown_model: str = "reject"
    version_mismatch: str = "fallback"


ROLLOUT_COMPARES = ("allclose", "argmax", "iou")


@dataclass(frozen=True)
class RolloutConfig:
    """A model's `[models.rollout]` table (docs/hot-swap.md#shadow-rollout): a version published for
    it is a candidate, shadowing live requests, until `shadow_requests` comparisons decide."""

    shadow_requests: int = 200
    compare: str = "allclose"  # or "argmax" (top-1 of the first output), "iou" (boxes of the first output)
    rtol: float = 1e-3
    atol: float = 1e-4
    iou: float = 0.5  # compare = "iou": a box matches one that overlaps it this much
    min_agreement: float = 0.99
    min_idle_cpu: float = 0.25  # mirroring waits while less of the CPUs' time is idle: it takes only spare CPU
    max_latency_ratio: float = 1.5  # candidate p99 / serving p99 on the same mirrored requests; 0 = not judged
    max_memory_mb: float = 0.0  # the most the candidate may be measured to hold; 0 = not judged (unknown fails)


@dataclass(frozen=True)
class ModelConfig:
    """One `[[models]]` entry: one version of one model."""

    name: str
    engine: Path
    version: str = "1"
    placement: str = HOT  # hot: in the daemon; cold: in a worker process (docs/architecture.md#placements-hot-and-cold)
    backend: str = ""
    contexts: int = 1
    max_queue: int = 64
    timeout_ms: int = 1000
    fallback: str = ""
    max_batch: int = 1
    batch_delay_us: int = 0
    preferred_batch: tuple[int, ...] = ()
    idle_unload_s: float = 300.0
    preload: bool = False
    weight: int = 0
    canary_weight: int = 0  # under `weighted`: a new version's weight when published (0: the one it supersedes)
    default: bool = False
    strategy: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    # Which versions found in engine_dir are served (Triton's version_policy).
    version_policy: str = "latest"
    latest_n: int = 1
    versions: tuple[str, ...] = ()
    mps_thread_percentage: int = 0  # a cold worker's share of the GPU's SMs under MPS; 0 = [daemon]'s
    queue_policy: str = "fifo"  # QUEUE_POLICIES; newest_per_key keeps at most per_key_depth queued per key
    per_key_depth: int = 1
    rollout: "RolloutConfig | None" = None  # [models.rollout]: a published version earns its traffic first
    nice: int = 0  # 0-19 added to its contexts' threads' nice value: the CPU goes to the rest first

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)


FOR_EACH = ("", "regions")
REINFER = ("reinfer_every", "reinfer_growth", "max_calls_per_s")  # a fan-out model step's, per track
PATH_OPTIONS = ("dictionary", "labels")  # processor options that name a file: relative to engine_dir


@dataclass(frozen=True)
class StepConfig:
    """One step of a `[[pipelines]]` entry: a processor (with its options) or a model.

    `for_each = "regions"` runs the step once per region found so far, on its
    crop; a model step there gets all of a frame's crops as one batched
    request, each padded with `pad_value` to the largest, and the last axis
    to a multiple of `pad_multiple` so that other frames' crops merge with
    them in the model's batcher.

    Such a model step may be re-inferred per track (after a `track` step):
    computed for a tracked region every `reinfer_every` frames of its track,
    or when its box area changed by `reinfer_growth`, its last answer reused
    between; `max_calls_per_s` bounds the regions it computes per second,
    split evenly across the streams sending (daemon/pipelines/reinfer.py).
    0 leaves an option off."""

    name: str
    processor: str = ""
    model: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    for_each: str = ""
    input: str = ""  # the model input the step's tensor goes to (default: the model's only input)
    pad_value: float = 0.0
    pad_multiple: int = 1
    reinfer_every: int = 0
    reinfer_growth: float = 0.0
    max_calls_per_s: float = 0.0


@dataclass(frozen=True)
class PipelineConfig:
    """One `[[pipelines]]` entry: steps run in order on a frame sent as input `input`
    (docs/pipelines.md); `workers` threads run them, `max_queue` frames wait (429 beyond).

    The `max_*` bounds are checked before the work they bound, each refused with 413 naming
    it: regions a frame may have (before the steps that run per region), the width of a
    crop's tensor at a per-region model step, and the bytes of a model step's batch."""

    name: str
    steps: tuple[StepConfig, ...]
    input: str = "image"
    workers: int = 2
    max_queue: int = 16
    timeout_ms: int = 5000
    queue_policy: str = "fifo"  # as a model's: newest_per_key keeps at most per_key_depth frames per key
    per_key_depth: int = 1
    max_regions: int = 1000
    max_crop_width: int = 4096
    max_batch_bytes: int = 256 << 20
    nice: int = 0  # as a model's: 0-19 added to the nice value of the threads that run the steps
    # Frame sizes [width, height] its cameras send: its models are warmed at the shapes the resize steps
    # make of them (daemon/pipelines/warmshapes.py), so the first frame costs what later ones do.
    warm_frames: tuple[tuple[int, int], ...] = ()
    # Tracked objects' new / update / end events, sent to the sinks (docs/events.md); needs a `track` step.
    events: LifecycleConfig | None = None


MAX_WARM_FRAMES = 8  # warm_frames entries a pipeline may list: each is one more inference per model at load
MAX_WARM_SIDE = 16384  # a warm frame's side, at most


@dataclass(frozen=True)
class Config:
    """A whole, validated configuration file."""

    path: Path
    daemon: DaemonConfig
    routing: RoutingConfig
    models: tuple[ModelConfig, ...]
    pipelines: tuple[PipelineConfig, ...] = ()
    sinks: tuple[SinkConfig, ...] = ()  # where events go (docs/events.md#sinks)

    def versions(self, name: str) -> list[ModelConfig]:
        return [m for m in self.models if m.name == name]


def _check_type(file: Path, where: str, value: Any, want: type | tuple[type, ...]) -> None:
    wants = want if isinstance(want, tuple) else (want,)
    if isinstance(value, bool) and bool not in wants:
        ok = False
    else:
        ok = isinstance(value, wants)
    if not ok:
        names = " or ".join("number" if w is float else w.__name__ for w in wants)
        raise ConfigError(file, where, f"must be {names}, got {type(value).__name__} {value!r}")


def _known_fields(file: Path, where: str, table: Mapping[str, Any], cls: type) -> dict[str, Any]:
    names = {f.name for f in fields(cls)} - {"path", "key"}
    if cls is ModelConfig:
        names.add("mode")  # the old name of `placement` (_placement)
    unknown = sorted(set(table) - names)
    if unknown:
        prefix = f"{where}." if where else ""
        # 0.75, not difflib's 0.6: a typo is suggested its field, an unrelated word (colour) no field at all.
        near = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.75)
        hint = f"did you mean `{near[0]}`? " if near else ""
        raise ConfigError(file, f"{prefix}{unknown[0]}",
                          f"unknown field; {hint}known fields: {', '.join(sorted(names))}")
    return dict(table)


def _positive(file: Path, where: str, value: Any, minimum: int = 1) -> None:
    _check_type(file, where, value, int)
    if value < minimum:
        raise ConfigError(file, where, f"must be >= {minimum}, got {value}")


def _parse_daemon(file: Path, table: Any) -> DaemonConfig:
    _check_type(file, "daemon", table, dict)
    raw = _known_fields(file, "daemon", table, DaemonConfig)
    if "listen" in raw:
        listen = raw["listen"]
        if isinstance(listen, str):
            listen = [listen]
        _check_type(file, "daemon.listen", listen, list)
        if not listen:
            raise ConfigError(file, "daemon.listen", "needs at least one endpoint")
        for i, ep in enumerate(listen):
            _check_endpoint(file, f"daemon.listen[{i}]", ep)
        raw["listen"] = tuple(listen)
    for key in ("admin", "stats"):
        if key in raw and raw[key] != "":
            _check_endpoint(file, f"daemon.{key}", raw[key])
    if str(raw.get("admin", "")).startswith("tcp://"):
        raise ConfigError(file, "daemon.admin", "the admin socket changes the daemon, so it listens on ipc:// "
                          "only (guarded by file permissions); reach it over SSH")
    if str(raw.get("admin", "")).startswith("ipc://@"):
        raise ConfigError(file, "daemon.admin", "an abstract ipc://@ socket has no file permissions, so any "
                          "local user could drain the daemon; use a path (ipc://admin.sock)")
    if "engine_dir" in raw:
        _check_type(file, "daemon.engine_dir", raw["engine_dir"], str)
        raw["engine_dir"] = _resolve(file, raw["engine_dir"])
    else:
        raw["engine_dir"] = DaemonConfig.engine_dir
    for key in ("max_message_bytes", "max_reply_bytes", "record_max_bytes"):
        if key in raw:
            _positive(file, f"daemon.{key}", raw[key], 1024)
    raw.setdefault("max_reply_bytes", raw.get("max_message_bytes", DaemonConfig.max_message_bytes))
    _check_limits(file, raw)
    _check_curve(file, raw)
    if "memory_budget" in raw:
        parse_budget(file, raw["memory_budget"], total=1)
    for key in ("drain_timeout_s", "worker_hang_s"):
        if key in raw:
            _check_type(file, f"daemon.{key}", raw[key], (int, float))
            raw[key] = float(raw[key])
            if key == "worker_hang_s" and raw[key] <= 0:
                raise ConfigError(file, f"daemon.{key}", f"must be > 0, got {raw[key]}")
    for key in ("spare_worker", "follow_symlinks"):
        if key in raw:
            _check_type(file, f"daemon.{key}", raw[key], bool)
    if "admin_group" in raw:
        _check_type(file, "daemon.admin_group", raw["admin_group"], str)
    for key in ("shared_memory", "state_dir"):
        if key in raw:
            _check_type(file, f"daemon.{key}", raw[key], str)
    if raw.get("state_dir"):
        raw["state_dir"] = str(_resolve(file, raw["state_dir"]))
    for key in ("max_connections", "reserved_fds"):
        if key in raw:
            _positive(file, f"daemon.{key}", raw[key], 1 if key == "max_connections" else 64)
    if "max_contexts" in raw:
        _positive(file, "daemon.max_contexts", raw["max_contexts"])
        if raw["max_contexts"] > MAX_CONTEXTS:
            raise ConfigError(file, "daemon.max_contexts", f"must be <= {MAX_CONTEXTS}, got {raw['max_contexts']}")
    for key in ("metrics_port", "inline_max_us", "inline_busy_max_us"):
        if key in raw:
            _positive(file, f"daemon.{key}", raw[key], 0)
    if "watch" in raw:
        _check_type(file, "daemon.watch", raw["watch"], bool)
    for key in ("stream_metrics_keys", "stream_max_keys"):
        if key in raw:
            _positive(file, f"daemon.{key}", raw[key], 1)
    for key in ("watch_settle_s", "watch_debounce_s", "watch_rescan_s", "traceback_interval_s", "stream_silent_s",
                "oversize_memory_s"):
        if key in raw:
            _check_type(file, f"daemon.{key}", raw[key], (int, float))
            if raw[key] < 0:
                raise ConfigError(file, f"daemon.{key}", f"must be >= 0, got {raw[key]}")
            raw[key] = float(raw[key])
    _check_mps(file, raw)
    _check_signing_keys(file, raw)
    _check_stream_keys(file, raw)
    if "metrics_host" in raw:
        _check_type(file, "daemon.metrics_host", raw["metrics_host"], str)
    if raw.get("log_level", "info") not in ("debug", "info", "warning", "error"):
        raise ConfigError(file, "daemon.log_level", "must be debug, info, warning or error")
    return DaemonConfig(**raw)


def _check_stream_keys(file: Path, raw: dict[str, Any]) -> None:
    if raw.get("stream_keys", "open") not in STREAM_KEYS:
        raise ConfigError(file, "daemon.stream_keys", f"must be {' or '.join(map(repr, STREAM_KEYS))}, got "
                          f"{str(raw['stream_keys'])[:40]!r}")


def _check_signing_keys(file: Path, raw: dict[str, Any]) -> None:
    """Each trusted publisher's key must be read now: a reload with a broken one changes nothing."""
    if "engine_signing_keys" not in raw:
        return
    where = "daemon.engine_signing_keys"
    keys = raw["engine_signing_keys"]
    _check_type(file, where, keys, list)
    paths = []
    for i, key in enumerate(keys):
        _check_type(file, f"{where}[{i}]", key, str)
        path = _resolve(file, key)
        why = signing.key_problem(path, private=False)
        if why:
            raise ConfigError(file, f"{where}[{i}]", f"will not trust {why}")
        try:
            signing.load_public(path)
        except (ValueError, ImportError) as exc:
            raise ConfigError(file, f"{where}[{i}]", str(exc)) from None
        except OSError as exc:
            raise ConfigError(file, f"{where}[{i}]", f"cannot read {path}: {exc.strerror} (a publisher's "
                              "PREFIX.pub, made by `infermux sign --keygen PREFIX`)") from None
        paths.append(path)
    raw["engine_signing_keys"] = tuple(paths)


def _check_mps(file: Path, raw: dict[str, Any]) -> None:
    if raw.get("mps", "off") not in MPS_MODES:
        raise ConfigError(file, "daemon.mps", f"must be one of {', '.join(MPS_MODES)}, got {raw['mps']!r}")
    if "mps_pipe_dir" in raw:
        _check_type(file, "daemon.mps_pipe_dir", raw["mps_pipe_dir"], str)
        raw["mps_pipe_dir"] = _resolve(file, raw["mps_pipe_dir"])
    if "mps_thread_percentage" in raw:
        _percentage(file, "daemon.mps_thread_percentage", raw["mps_thread_percentage"])


def _percentage(file: Path, where: str, value: Any) -> None:
    """An MPS active-thread percentage: 1-100, or 0 for "not set"."""
    _positive(file, where, value, 0)
    if value > 100:
        raise ConfigError(file, where, f"must be a percentage (1-100, 0 = not set), got {value}")


# Request limits: (smallest, largest) allowed. numpy arrays have at most 64
# dimensions (32 before numpy 2), so a larger max_rank would fail in reshape.
_LIMITS = {"max_header_bytes": (256, 1 << 30), "max_tensors": (1, 1 << 16), "max_rank": (1, 32),
           "max_elements": (1, 1 << 40), "max_shared_input_bytes": (1, 1 << 40)}


def _check_limits(file: Path, raw: dict[str, Any]) -> None:
    for key, (low, high) in _LIMITS.items():
        if key in raw:
            _positive(file, f"daemon.{key}", raw[key], low)
            if raw[key] > high:
                raise ConfigError(file, f"daemon.{key}", f"must be <= {high}, got {raw[key]}")
    header = raw.get("max_header_bytes", DaemonConfig.max_header_bytes)
    message = raw.get("max_message_bytes", DaemonConfig.max_message_bytes)
    if header > message:
        raise ConfigError(file, "daemon.max_header_bytes", f"{header} is more than max_message_bytes ({message})")


def _check_curve(file: Path, raw: dict[str, Any]) -> None:
    """Key paths must exist; a tcp:// listener needs both, unless allow_insecure_tcp says otherwise."""
    for key, kind in (("curve_secret_key", "file"), ("curve_authorized_dir", "directory")):
        if key in raw:
            _check_type(file, f"daemon.{key}", raw[key], str)
            path = _resolve(file, raw[key])
            if not (path.is_file() if kind == "file" else path.is_dir()):
                raise ConfigError(file, f"daemon.{key}", f"{path} is not a readable {kind} "
                                  f"(make keys with `infermux keygen`)")
            raw[key] = path
    if "allow_insecure_tcp" in raw:
        _check_type(file, "daemon.allow_insecure_tcp", raw["allow_insecure_tcp"], bool)
    has_key, has_dir = "curve_secret_key" in raw, "curve_authorized_dir" in raw
    if has_key != has_dir:
        missing = "curve_authorized_dir" if has_key else "curve_secret_key"
        raise ConfigError(file, f"daemon.{missing}", "CURVE needs both curve_secret_key and curve_authorized_dir")
    insecure = raw.get("allow_insecure_tcp", False)
    tcp = [ep for ep in raw.get("listen", ()) if ep.startswith("tcp://")]
    if tcp and not has_key and not insecure:
        raise ConfigError(file, "daemon.listen", f"{tcp[0]} is reachable without file permissions: set "
                          f"curve_secret_key and curve_authorized_dir (see docs/security.md), "
                          f"or allow_insecure_tcp = true")
    stats = raw.get("stats", "")
    if isinstance(stats, str) and stats.startswith("tcp://") and not insecure:
        raise ConfigError(file, "daemon.stats", f"{stats}: the stats stream has no CURVE; keep it on ipc:// "
                          f"or set allow_insecure_tcp = true")


def _check_endpoint(file: Path, where: str, value: Any) -> None:
    _check_type(file, where, value, str)
    if not value.startswith(("ipc://", "tcp://")):
        raise ConfigError(file, where, f"endpoint {value!r} must start with ipc:// or tcp://")


def _resolve(file: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (file.parent / path).resolve()


def parse_budget(file: Path | str, value: Any, total: int) -> int:
    """Bytes allowed by a `memory_budget` of "80%", "6GiB", "512MB" or a byte count."""
    where = "daemon.memory_budget"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if not isinstance(value, str):
        raise ConfigError(file, where, f"must be a percentage or a size like '6GiB', got {value!r}")
    text = value.strip()
    units = {"%": None, "gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "gb": 10**9, "mb": 10**6, "kb": 10**3}
    for suffix, scale in units.items():
        if text.lower().endswith(suffix):
            number = text[: -len(suffix)].strip()
            try:
                amount = float(number)
            except ValueError:
                break
            if amount <= 0 or (scale is None and amount > 100):
                break
            return int(total * amount / 100) if scale is None else int(amount * scale)
    raise ConfigError(file, where, f"{value!r} is not a percentage (1-100%) or a size like '6GiB'")


def _parse_routing(file: Path, table: Any) -> RoutingConfig:
    _check_type(file, "routing", table, dict)
    raw = _known_fields(file, "routing", table, RoutingConfig)
    choices = {"strategy": STRATEGIES, "unknown_model": ("reject",), "version_mismatch": ("fallback", "reject")}
    for key, allowed in choices.items():
        if key in raw and raw[key] not in allowed:
            raise ConfigError(file, f"routing.{key}", f"must be one of {', '.join(allowed)}, got {raw[key]!r}")
    return RoutingConfig(**raw)


_INT_FIELDS = {"contexts": 1, "max_queue": 1, "timeout_ms": 1, "max_batch": 1, "batch_delay_us": 0, "weight": 0,
               "canary_weight": 0,
               "latest_n": 1, "per_key_depth": 1, "nice": 0}
MAX_NICE = 19  # Linux's lowest priority
_INT_MAXIMA = {"weight": MAX_WEIGHT, "contexts": MAX_CONTEXTS, "nice": MAX_NICE}


def _bounded_int(file: Path, where: str, raw: dict[str, Any], key: str, minimum: int) -> None:
    """`raw[key]`, where given, is an int from `minimum` to its `_INT_MAXIMA` bound (if it has one)."""
    if key in raw:
        _positive(file, f"{where}.{key}", raw[key], minimum)
        if raw[key] > _INT_MAXIMA.get(key, raw[key]):
            raise ConfigError(file, f"{where}.{key}", f"must be <= {_INT_MAXIMA[key]}, got {raw[key]}")


def model_labels(entries: list[tuple[Any, Any]]) -> list[str]:
    """How errors name each `[[models]]` entry, from its (name, version): `models[name="a"]`, with
    the version where entries share the name, the index where that is not enough (or no name)."""
    def text(value: Any) -> str | None:
        return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "" else None

    keys = [(n if isinstance(n, str) and n else None, text(v) or "1") for n, v in entries]  # a name is a string
    labels = []
    for i, (name, version) in enumerate(keys):
        if name is None:
            labels.append(f"models[{i}]")
        elif sum(1 for n, _ in keys if n == name) == 1:
            labels.append(f"models[name={json.dumps(name)}]")
        elif keys.count((name, version)) == 1:
            labels.append(f"models[name={json.dumps(name)}, version={json.dumps(version)}]")
        else:
            labels.append(f"models[{i}, name={json.dumps(name)}]")
    return labels


def _parse_model(file: Path, where: str, table: Any, engine_dir: Path) -> ModelConfig:
    _check_type(file, where, table, dict)
    raw = _known_fields(file, where, table, ModelConfig)
    for key in ("name", "engine"):
        if key not in raw:
            raise ConfigError(file, f"{where}.{key}", "is required")
        _check_type(file, f"{where}.{key}", raw[key], str)
        if not raw[key]:
            raise ConfigError(file, f"{where}.{key}", "must not be empty")
    if "version" in raw:
        _check_type(file, f"{where}.version", raw["version"], (str, int))
        raw["version"] = str(raw["version"])
    for key in ("name", "version"):  # logged and exposed as metric labels: no newline, no ESC
        if key in raw and not raw[key].isprintable():
            raise ConfigError(file, f"{where}.{key}", f"{ascii(raw[key])} holds control characters")
    for key, minimum in _INT_FIELDS.items():
        _bounded_int(file, where, raw, key, minimum)
    _placement(file, where, raw)
    if raw.get("strategy", "") not in ("", *STRATEGIES):
        raise ConfigError(file, f"{where}.strategy", f"must be one of {', '.join(STRATEGIES)}")
    for key in ("fallback", "backend"):
        if key in raw:
            _check_type(file, f"{where}.{key}", raw[key], str)
    for key in ("preload", "default"):
        if key in raw:
            _check_type(file, f"{where}.{key}", raw[key], bool)
    if "idle_unload_s" in raw:
        _check_type(file, f"{where}.idle_unload_s", raw["idle_unload_s"], (int, float))
    if "preferred_batch" in raw:
        _check_type(file, f"{where}.preferred_batch", raw["preferred_batch"], list)
        for i, size in enumerate(raw["preferred_batch"]):
            _positive(file, f"{where}.preferred_batch[{i}]", size)
        raw["preferred_batch"] = tuple(sorted(raw["preferred_batch"]))
    if "options" in raw:
        _check_type(file, f"{where}.options", raw["options"], dict)
    if "mps_thread_percentage" in raw:
        _percentage(file, f"{where}.mps_thread_percentage", raw["mps_thread_percentage"])
    _parse_version_policy(file, where, raw)
    _check_queue_policy(file, where, raw)
    if "rollout" in raw:
        raw["rollout"] = _parse_rollout(file, f"{where}.rollout", raw["rollout"])
    engine = Path(raw["engine"]).expanduser()
    raw["engine"] = engine if engine.is_absolute() else engine_dir / engine
    return ModelConfig(**raw)


def _placement(file: Path, where: str, raw: dict[str, Any]) -> None:
    """`placement = "hot" | "cold"`, or its old spelling `mode = "inproc" | "multiproc"`; both
    may be given only where they agree."""
    placement = raw.get("placement")
    if placement is not None and placement not in PLACEMENTS:
        raise ConfigError(file, f"{where}.placement", f"must be hot (in the daemon) or cold (in a worker "
                          f"process), got {placement!r}")
    if "mode" not in raw:
        return
    mode = raw.pop("mode")
    if mode not in OLD_PLACEMENT_NAMES:
        raise ConfigError(file, f"{where}.mode", f"must be inproc or multiproc (the old names of placement = "
                          f"\"hot\" and \"cold\"), got {mode!r}")
    if placement is not None and OLD_PLACEMENT_NAMES[mode] != placement:
        raise ConfigError(file, f"{where}.mode", f"mode = {json.dumps(mode)} is the old name of placement = "
                          f"{json.dumps(OLD_PLACEMENT_NAMES[mode])}, but placement = {json.dumps(placement)}; "
                          f"keep one of the two")
    raw["placement"] = OLD_PLACEMENT_NAMES[mode]


def _parse_rollout(file: Path, where: str, table: Any) -> RolloutConfig:
    _check_type(file, where, table, dict)
    raw = _known_fields(file, where, table, RolloutConfig)
    if "shadow_requests" in raw:
        _positive(file, f"{where}.shadow_requests", raw["shadow_requests"])
    if raw.get("compare", "allclose") not in ROLLOUT_COMPARES:
        raise ConfigError(file, f"{where}.compare", f"must be one of {', '.join(ROLLOUT_COMPARES)}, "
                          f"got {raw['compare']!r}")
    shares = ("iou", "min_agreement", "min_idle_cpu")
    for key in ("rtol", "atol", *shares):
        if key in raw:
            _check_type(file, f"{where}.{key}", raw[key], (int, float))
            raw[key] = float(raw[key])
            if raw[key] < 0 or (key in shares and raw[key] > 1):
                bound = "between 0 and 1" if key in shares else ">= 0"
                raise ConfigError(file, f"{where}.{key}", f"must be {bound}, got {raw[key]}")
    for key in ("max_latency_ratio", "max_memory_mb"):
        if key in raw:
            _check_type(file, f"{where}.{key}", raw[key], (int, float))
            raw[key] = float(raw[key])
            if not 0 <= raw[key] < float("inf") or (key == "max_latency_ratio" and 0 < raw[key] < 1):
                bound = ">= 1" if key == "max_latency_ratio" else "a size in MiB"
                raise ConfigError(file, f"{where}.{key}", f"must be 0 (not judged) or {bound}, got {raw[key]}")
    if raw.get("compare", "allclose") != "allclose" and ({"rtol", "atol"} & set(raw)):
        raise ConfigError(file, where, "rtol and atol belong to compare = \"allclose\"")
    return RolloutConfig(**raw)


def _parse_version_policy(file: Path, where: str, raw: dict[str, Any]) -> None:
    policy = raw.get("version_policy", "latest")
    if policy not in VERSION_POLICIES:
        raise ConfigError(file, f"{where}.version_policy", f"must be one of {', '.join(VERSION_POLICIES)}, "
                          f"got {policy!r}")
    if "latest_n" in raw and policy != "latest":
        raise ConfigError(file, f"{where}.latest_n", f"only applies to version_policy = \"latest\", "
                          f"not {policy!r}")
    if "versions" in raw:
        if policy != "specific":
            raise ConfigError(file, f"{where}.versions", f"only applies to version_policy = \"specific\", "
                              f"not {policy!r}")
        _check_type(file, f"{where}.versions", raw["versions"], list)
        for i, version in enumerate(raw["versions"]):
            _check_type(file, f"{where}.versions[{i}]", version, (str, int))
        raw["versions"] = tuple(str(v) for v in raw["versions"])
    if policy == "specific" and not raw.get("versions"):
        raise ConfigError(file, f"{where}.versions", "version_policy = \"specific\" needs a non-empty "
                          "list of versions, e.g. versions = [\"2\", \"3\"]")


def _check_queue_policy(file: Path, where: str, raw: dict[str, Any]) -> None:
    """`queue_policy` is one of QUEUE_POLICIES; `per_key_depth` only goes with newest_per_key."""
    prefix = f"{where}." if where else ""
    policy = raw.get("queue_policy", "fifo")
    if policy not in QUEUE_POLICIES:
        raise ConfigError(file, f"{prefix}queue_policy", f"must be one of {', '.join(QUEUE_POLICIES)}, got {policy!r}")
    if "per_key_depth" in raw:
        _positive(file, f"{prefix}per_key_depth", raw["per_key_depth"])
        if policy != "newest_per_key":
            raise ConfigError(file, f"{prefix}per_key_depth", "only applies to queue_policy = \"newest_per_key\" "
                              f"(how many requests of one key may wait), not {policy!r}")


def policy_key(m: ModelConfig) -> tuple[str, int, tuple[str, ...]]:
    """A model's version policy as one comparable value."""
    return (m.version_policy, m.latest_n, m.versions)


def parse_model_settings(text: str, file: Path, name: str, engine_dir: Path) -> ModelConfig:
    """`<engine_dir>/<name>/model.toml`: the `[[models]]` fields minus those the path gives.

    Returns a template (version "", engine = the model's folder) to copy per version.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, "", f"not valid TOML: {exc}") from None
    for key in ("name", "version", "engine"):
        if key in data:
            raise ConfigError(file, key, "comes from the path <engine_dir>/<model>/<version>/model.<ext>; "
                              "remove it")
    if "default" in data:
        raise ConfigError(file, "default", "the default of a discovered model is its newest ready version; "
                          "use pin to hold one")
    if data.get("fallback") == name:
        raise ConfigError(file, "fallback", f"model {name!r} cannot fall back to itself")
    backend = data.get("backend")
    why = backends.refusal(backend) if isinstance(backend, str) and backend else None
    if why:  # engine_dir is written by publishers, not by whoever writes this file's configuration
        raise ConfigError(file, "backend", why)
    try:
        mc = _parse_model(file, "", {**data, "name": name, "engine": name}, engine_dir)
    except ConfigError as exc:  # the path inside model.toml has no models[...] prefix
        raise ConfigError(file, exc.path.lstrip("."), exc.reason) from None
    return replace(mc, version="")


def contexts_problem(contexts: int, daemon: DaemonConfig) -> str | None:
    """Why a version may not have `contexts` contexts (over `[daemon] max_contexts`), or None."""
    if contexts > daemon.max_contexts:
        return (f"{contexts} contexts is over [daemon] max_contexts ({daemon.max_contexts}): each one is an "
                "engine session with its own memory and thread")
    return None


def _check_models(file: Path, models: list[ModelConfig], routing: RoutingConfig, daemon: DaemonConfig) -> None:
    labels = model_labels([(m.name, m.version) for m in models])
    for i, m in enumerate(models):
        why = contexts_problem(m.contexts, daemon)
        if why:
            raise ConfigError(file, f"{labels[i]}.contexts", why)
    seen: dict[tuple[str, str], int] = {}
    for i, m in enumerate(models):
        if m.key in seen:
            raise ConfigError(file, labels[i], f"model {m.name!r} version {m.version!r} "
                              f"is already defined by models[{seen[m.key]}]")
        seen[m.key] = i
    names = {m.name for m in models}
    for name in names:
        defaults = [i for i, m in enumerate(models) if m.name == name and m.default]
        if len(defaults) > 1:
            raise ConfigError(file, f"{labels[defaults[1]]}.default",
                              f"model {name!r} already has a default version ({labels[defaults[0]]})")
    for i, m in enumerate(models):
        if m.fallback and m.fallback not in names:
            raise ConfigError(file, f"{labels[i]}.fallback", f"unknown model {m.fallback!r}; "
                              f"known models: {', '.join(sorted(names))}")
        if m.fallback == m.name:
            raise ConfigError(file, f"{labels[i]}.fallback", f"model {m.name!r} cannot fall back to itself")
    _check_policies(file, models, labels)
    _check_fallback_cycles(file, models, labels)


def _check_policies(file: Path, models: list[ModelConfig], labels: list[str]) -> None:
    """A version policy belongs to the model: entries that set one must agree."""
    default = policy_key(ModelConfig(name="", engine=Path()))
    first: dict[str, int] = {}
    for i, m in enumerate(models):
        if policy_key(m) == default:
            continue
        j = first.setdefault(m.name, i)
        if policy_key(models[j]) != policy_key(m):
            raise ConfigError(file, f"{labels[i]}.version_policy", f"model {m.name!r} already has another "
                              f"version policy ({labels[j]}); set it once, or the same on every entry")


def fallback_of(models: list[ModelConfig] | tuple[ModelConfig, ...]) -> dict[str, str]:
    """Model name -> fallback model name (the default version's setting wins)."""
    chain: dict[str, str] = {}
    for m in models:
        if m.fallback and (m.name not in chain or m.default):
            chain[m.name] = m.fallback
    return chain


def fallback_problem(chain: Mapping[str, str]) -> tuple[str, str] | None:
    """(model, why) if a model -> fallback mapping has a cycle or a chain too long, else None."""
    for start in chain:
        path, node = [start], chain[start]
        while node in chain and node not in path:
            path.append(node)
            node = chain[node]
        if node in path:
            return start, f"fallback cycle: {' -> '.join([*path[path.index(node):], node])}"
        if len(path) > MAX_FALLBACK_DEPTH:
            return start, f"fallback chain {' -> '.join(path)} is longer than {MAX_FALLBACK_DEPTH}"
    return None


def _check_fallback_cycles(file: Path, models: list[ModelConfig], labels: list[str]) -> None:
    problem = fallback_problem(fallback_of(models))
    if problem:
        start, why = problem
        index = next(i for i, m in enumerate(models) if m.name == start and m.fallback)
        raise ConfigError(file, f"{labels[index]}.fallback", why)


def parse(text: str, file: Path) -> Config:
    """Validate TOML `text` as if read from `file` (relative paths resolve against its folder)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, "", f"not valid TOML: {exc}") from None
    top = {"daemon", "routing", "models", "pipelines", "sinks"}
    for key in data:
        if key not in top:
            raise ConfigError(file, key, f"unknown table; expected {', '.join(sorted(top))}")
    daemon = _parse_daemon(file, data.get("daemon", {}))
    routing = _parse_routing(file, data.get("routing", {}))
    raw_models = data.get("models", [])
    _check_type(file, "models", raw_models, list)
    labels = model_labels([(m.get("name"), m.get("version")) if isinstance(m, dict) else (None, None)
                           for m in raw_models])
    models = [_parse_model(file, label, m, daemon.engine_dir) for label, m in zip(labels, raw_models)]
    _check_models(file, models, routing, daemon)
    pipelines = _parse_pipelines(file, data.get("pipelines", []), models, daemon.engine_dir)
    sinks = _settings(file, sinkconfig.parse_sinks, data.get("sinks", []), {p.name for p in pipelines})
    return Config(path=file, daemon=daemon, routing=routing, models=tuple(models), pipelines=pipelines, sinks=sinks)


def _settings(file: Path, parse: Callable[..., Any], *args: Any) -> Any:
    """`parse(*args)` of sinkconfig.py, its Problem as this file's ConfigError."""
    try:
        return parse(*args)
    except sinkconfig.Problem as exc:
        raise ConfigError(file, exc.where, exc.reason) from None


def _parse_pipelines(file: Path, raw: Any, models: list[ModelConfig],
                     engine_dir: Path) -> tuple[PipelineConfig, ...]:
    """Every `[[pipelines]]` entry; a name may not be a model's (both are addressed as "model")."""
    _check_type(file, "pipelines", raw, list)
    out: list[PipelineConfig] = []
    names = {m.name for m in models}
    for i, table in enumerate(raw):
        pipeline = _parse_pipeline(file, f"pipelines[{i}]", table, names, engine_dir)
        if pipeline.name in names:
            raise ConfigError(file, f"pipelines[{i}].name", f"{pipeline.name!r} is already a model's or "
                              "another pipeline's name; pipelines and models share the request's \"model\" field")
        names.add(pipeline.name)
        out.append(pipeline)
    return tuple(out)


def _parse_pipeline(file: Path, where: str, table: Any, models: set[str], engine_dir: Path) -> PipelineConfig:
    _check_type(file, where, table, dict)
    raw = _known_fields(file, where, table, PipelineConfig)
    if "name" not in raw:
        raise ConfigError(file, f"{where}.name", "is required")
    for key in ("name", "input"):
        if key in raw:
            _check_type(file, f"{where}.{key}", raw[key], str)
            if not raw[key]:
                raise ConfigError(file, f"{where}.{key}", "must not be empty")
    for key in ("workers", "max_queue", "timeout_ms", "max_regions", "max_crop_width", "max_batch_bytes"):
        if key in raw:
            _positive(file, f"{where}.{key}", raw[key])
    _bounded_int(file, where, raw, "nice", 0)
    _check_queue_policy(file, where, raw)
    if "warm_frames" in raw:
        raw["warm_frames"] = _warm_frames(file, f"{where}.warm_frames", raw["warm_frames"])
    steps = raw.get("steps")
    _check_type(file, f"{where}.steps", steps, list)
    if not steps:
        raise ConfigError(file, f"{where}.steps", f"pipeline {raw['name']!r} needs at least one step")
    parsed = [_parse_step(file, f"{where}.steps[{j}]", raw["name"], step, models, engine_dir)
              for j, step in enumerate(steps)]
    seen: set[str] = set()
    for j, step in enumerate(parsed):
        if step.name in seen:
            raise ConfigError(file, f"{where}.steps[{j}].name", f"pipeline {raw['name']!r} already has a step "
                              f"named {step.name!r}; give one a `name`")
        seen.add(step.name)
    _check_tracked(file, where, raw["name"], parsed)
    raw["steps"] = tuple(parsed)
    if "events" in raw:
        raw["events"] = _settings(file, sinkconfig.parse_lifecycle, f"{where}.events", raw["events"])
        if not any(step.processor == "track" for step in parsed):
            raise ConfigError(file, f"{where}.events", f"pipeline {raw['name']!r} makes events of tracked objects: "
                              "it needs a 'track' step (docs/events.md)")
    return PipelineConfig(**raw)


def _warm_frames(file: Path, where: str, value: Any) -> tuple[tuple[int, int], ...]:
    """`warm_frames = [[1280, 720], ...]`: up to MAX_WARM_FRAMES sizes, each side 1..MAX_WARM_SIDE."""
    _check_type(file, where, value, list)
    if len(value) > MAX_WARM_FRAMES:
        raise ConfigError(file, where, f"lists {len(value)} frame sizes; at most {MAX_WARM_FRAMES} (each is one "
                          "more inference per model while it loads)")
    sizes = []
    for i, size in enumerate(value):
        if not (isinstance(size, list) and len(size) == 2 and all(type(v) is int and 1 <= v <= MAX_WARM_SIDE
                                                                  for v in size)):
            raise ConfigError(file, f"{where}[{i}]", f"must be [width, height], two integers from 1 to "
                              f"{MAX_WARM_SIDE}, got {size!r}")
        sizes.append((size[0], size[1]))
    return tuple(sizes)


def _parse_step(file: Path, where: str, pipeline: str, table: Any, models: set[str],
                engine_dir: Path) -> StepConfig:
    _check_type(file, where, table, dict)
    raw = _known_fields(file, where, table, StepConfig)
    for key in ("name", "processor", "model", "for_each", "input"):
        if key in raw:
            _check_type(file, f"{where}.{key}", raw[key], str)
    if bool(raw.get("processor")) == bool(raw.get("model")):
        raise ConfigError(file, where, f"pipeline {pipeline!r}: a step names either a `processor` or a `model`")
    raw.setdefault("name", raw.get("processor") or raw.get("model"))
    step = f"pipeline {pipeline!r} step {raw['name']!r}"
    if raw.get("for_each", "") not in FOR_EACH:
        raise ConfigError(file, f"{where}.for_each", f"{step}: must be \"regions\" (or left out)")
    if raw.get("model") and raw["model"] not in models:
        raise ConfigError(file, f"{where}.model", f"{step}: unknown model {raw['model']!r}; "
                          f"models: {', '.join(sorted(models)) or 'none'}")
    if raw.get("processor") and ({"input", "pad_value", "pad_multiple"} & set(raw)):
        raise ConfigError(file, where, f"{step}: input, pad_value and pad_multiple belong to model steps")
    if raw.get("model") and "options" in raw:
        raise ConfigError(file, f"{where}.options", f"{step}: options belong to processor steps")
    if "pad_value" in raw:
        _check_type(file, f"{where}.pad_value", raw["pad_value"], (int, float))
    if "pad_multiple" in raw:
        _positive(file, f"{where}.pad_multiple", raw["pad_multiple"])
    _check_reinfer(file, where, step, raw)
    if "options" in raw:
        _check_type(file, f"{where}.options", raw["options"], dict)
    raw["options"] = _step_paths(raw.get("options", {}), engine_dir)
    if raw.get("processor"):
        _check_processor(file, f"{where}.options", step, raw["processor"], raw["name"], raw["options"])
    return StepConfig(**raw)


def _check_reinfer(file: Path, where: str, step: str, raw: Mapping[str, Any]) -> None:
    """The re-inference options: on a fan-out model step only, each a positive number."""
    given = [key for key in REINFER if key in raw]
    if given and not (raw.get("model") and raw.get("for_each") == "regions"):
        raise ConfigError(file, f"{where}.{given[0]}", f"{step}: {', '.join(REINFER)} belong to model "
                          "steps with for_each = \"regions\" (a second stage run on each region)")
    if "reinfer_every" in raw:
        _positive(file, f"{where}.reinfer_every", raw["reinfer_every"])
    for key in ("reinfer_growth", "max_calls_per_s"):
        if key in raw:
            _check_type(file, f"{where}.{key}", raw[key], (int, float))
            if raw[key] <= 0:
                raise ConfigError(file, f"{where}.{key}", f"{step}: must be positive, got {raw[key]}")
    if raw.get("processor") == "track" and raw.get("for_each"):
        raise ConfigError(file, f"{where}.for_each", f"{step}: a track step follows the frame's regions; "
                          "leave for_each out")


def _check_tracked(file: Path, where: str, pipeline: str, steps: list[StepConfig]) -> None:
    """A step that reuses answers per track needs a `track` step before it to give the tracks."""
    tracked = False
    for j, step in enumerate(steps):
        tracked = tracked or step.processor == "track"
        for key in ("reinfer_every", "reinfer_growth"):
            if getattr(step, key) and not tracked:
                raise ConfigError(file, f"{where}.steps[{j}].{key}", f"pipeline {pipeline!r} step {step.name!r}: "
                                  f"{key} needs a 'track' step before it: an answer is reused for the same "
                                  "track on a later frame (docs/pipelines.md#tracking)")


def _step_paths(options: Mapping[str, Any], engine_dir: Path) -> dict[str, Any]:
    """File options (a dictionary, a label file) relative to engine_dir, like a model's engine."""
    out = dict(options)
    for key in PATH_OPTIONS:
        value = out.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            out[key] = str(engine_dir / value)
    return out


def _check_processor(file: Path, where: str, step: str, kind: str, name: str, options: Mapping[str, Any]) -> None:
    """Build the step's processor once, so that a bad option stops the file here, named."""
    try:
        processors.create(kind, options, name)
    except MissingDependency as exc:
        raise LibraryMissing(file, where, exc) from None
    except processors.ProcessorError as exc:
        raise ConfigError(file, where, f"{step}: {exc.reason}") from None


def load(path: str | os.PathLike[str]) -> Config:
    """Read and validate a configuration file."""
    file = Path(path).expanduser().resolve()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(file, "", "is not UTF-8 text") from None
    return parse(text, file)


def runtime_dir(config: DaemonConfig, override: str | None = None) -> Path:
    """Where relative ipc endpoints live.

    The flag wins, then `[daemon] runtime_dir`, then systemd's
    $RUNTIME_DIRECTORY, then /run/infermux when writable, then
    $XDG_RUNTIME_DIR/infermux, then /tmp/infermux-$UID (a developer's box).
    """
    for candidate in (override, config.runtime_dir, os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]):
        if candidate:
            return Path(candidate)
    system = Path("/run/infermux")
    if os.access(system if system.exists() else system.parent, os.W_OK):
        return system
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "infermux"
    return Path(f"/tmp/infermux-{os.getuid()}")


def regions_path(daemon: DaemonConfig, run_dir: Path) -> Path | None:
    """Where the shared-memory registration socket goes; None when it is off.

    A relative `shared_memory` lies beside the first ipc:// listener, where
    clients look for it (client.shared_memory.regions_path), whether that
    listener is relative or absolute; without one (tcp only) it goes in the
    runtime directory. An absolute name is used as written.
    """
    name = daemon.shared_memory
    if not name:
        return None
    if os.path.isabs(name):
        return Path(name)
    for endpoint in daemon.listen:
        resolved = resolve_endpoint(endpoint, run_dir)
        if resolved.startswith("ipc://") and not resolved.startswith("ipc://@"):
            return Path(resolved[len("ipc://"):]).parent / name
    return run_dir / name


def resolve_endpoint(endpoint: str, run_dir: Path) -> str:
    """`ipc://name.sock` (relative) -> `ipc://<run_dir>/name.sock`; others unchanged."""
    if endpoint.startswith("ipc://") and not endpoint[len("ipc://"):].startswith(("/", "@")):
        return f"ipc://{run_dir / endpoint[len('ipc://'):]}"
    return endpoint


# What a client command needs from the [daemon] table: where the sockets are.
SOCKET_FIELDS = ("listen", "admin", "stats", "runtime_dir", "shared_memory")


def load_sockets(path: str | os.PathLike[str]) -> DaemonConfig:
    """Only the socket settings of a configuration file, for `status`, `ctl`, `infer`, `bench` and `tune`.

    Nothing else is validated: an operator who has just broken a model's
    settings must still reach the daemon to see `status` and to `ctl reload`
    (which the daemon then refuses with the reason). A socket field of the
    wrong type keeps its default. Raises ConfigError when the file cannot be
    read or is not TOML.
    """
    file = Path(path).expanduser().resolve()
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read: {exc.strerror}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(file, "", f"not valid TOML: {exc}") from None
    table = data.get("daemon")
    table = table if isinstance(table, dict) else {}
    raw: dict[str, Any] = {k: table[k] for k in SOCKET_FIELDS if isinstance(table.get(k), str)}
    listen = table.get("listen")
    if isinstance(listen, list) and listen and all(isinstance(ep, str) for ep in listen):
        raw["listen"] = tuple(listen)
    elif isinstance(listen, str):
        raw["listen"] = (listen,)
    return DaemonConfig(**raw)
