"""Every configuration key, declared once: the sections' dataclasses, each field a `setting(...)`.

A field's name is the key, its dataclass the section; `setting` (config/declare.py) records its kind,
default, bounds or choices, when a change applies and one line of documentation. The parsers
(config/daemon.py, models.py, pipelines.py), the reload planner (swap/reload.py), `ctl set` and the
state file (models/overrides.py) and the reference in docs/configuration.md all read these.

To add a setting: add a field to its section's dataclass below,

    queue_depth: int = setting(8, INT, "requests one stream may have waiting", applies=LIVE, low=1, high=1024)

with the kind of value it takes (config/kinds.py; a new kind there if none fits), and whatever bounds
(`low`, `high`, `low_open`), `choices` or `rule` hold for it; `settable=True` if `ctl set` may change
it. Read it where it is used (`config.daemon.queue_depth`). Then regenerate the reference:
`.venv/bin/python -m infermux.config.reference > docs/configuration.md` (tests/unit/config/test_config_reference.py
checks it). A rule between keys (one only with another) goes in its section's parser.

A new section declares its keys the same way in a dataclass of its own (as `[[cameras]]` does below),
is listed in SECTIONS (a `[[list]]` one with `many=True`; the reference shows it from there), gets a
field in `Config`, and a parser that calls `read_table` for each entry (config/__init__.py `parse`
calls it; config/cameras.py is a small one). A table inside an entry (`[models.rollout]`,
`[[pipelines.steps]]`, `[cameras.gate]`) is a field of kind TABLE or TABLES whose `section=` names the
nested dataclass: `read_table` checks the nested keys too (unknown ones, types, bounds), and hands them
to the section's parser as a dict (a list of dicts) to build the nested dataclass from. A setting that
a part applies by itself says so with its own `applies` value (`CAMERA`: the camera's process is
restarted; `SINK`: the sink is restarted on its spool), which that part and the reload planner read.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from infermux.config.declare import CAMERA, LIVE, RELOAD, RESTART, SINK, Rule, required, setting
from infermux.config.kinds import (BOOL, BUDGET, ENDPOINT, ENDPOINTS, FRAMES, INT, KEY_DIR, KEY_FILE, MASKS, NAME,
                                   NAMES, NUMBER, PATH, POLYGON, PUBLIC_KEYS, SEGMENT, SIZE, SIZES, STR, TABLE,
                                   TABLES, VERSION, VERSIONS)

STRATEGIES = ("least_queue", "weighted", "hash")
HOT, COLD = "hot", "cold"
PLACEMENTS = (HOT, COLD)  # where a version runs: in the daemon, or in a worker process of its own
# `mode`, the key's old name, and its values: still read, so that older files keep working.
OLD_PLACEMENT_NAMES = {"inproc": HOT, "multiproc": COLD}
VERSION_POLICIES = ("latest", "all", "specific")
MAX_FALLBACK_DEPTH = 4
MAX_CONTEXTS = 1024  # the most [daemon] max_contexts may allow
MAX_WEIGHT = 1_000_000  # a weighted split's largest weight: ratios, not amounts
MAX_NICE = 19  # Linux's lowest priority
MPS_MODES = ("off", "auto", "on")
# How a queue treats a request's `key` (docs/protocol.md#streams): "fifo" serves keys in turn and keeps
# what it accepted; "newest_per_key" treats a key as a camera's stream, whose newer frame replaces its
# oldest queued one (answered 409).
QUEUE_POLICIES = ("fifo", "newest_per_key")
STREAM_KEYS = ("open", "bound")  # [daemon] stream_keys: anyone may send a key, or its first client only
LOG_LEVELS = ("debug", "info", "warning", "error")
ROLLOUT_COMPARES = ("allclose", "argmax", "iou")
FOR_EACH = ("", "regions")
REINFER = ("reinfer_every", "reinfer_growth", "max_calls_per_s")  # a fan-out model step's, per track
PATH_OPTIONS = ("dictionary", "labels")  # processor options that name a file: relative to engine_dir
POSITIVE = Rule("positive", lambda v: v > 0)
PERCENTAGE = Rule("a percentage (1-100, 0 = not set)", lambda v: 0 <= v <= 100)


@dataclass(frozen=True)
class DaemonConfig:
    """The `[daemon]` table."""

    listen: tuple[str, ...] = setting(("ipc://infer.sock",), ENDPOINTS, "where clients send inference requests; "
                                      "a tcp:// one needs CURVE or allow_insecure_tcp", applies=RESTART)
    admin: str = setting("ipc://admin.sock", ENDPOINT, "the admin socket (`infermux ctl`); ipc:// only, a path",
                         applies=RESTART)
    stats: str = setting("ipc://stats.sock", ENDPOINT, "the stats stream (`infermux top`); \"\": none",
                         applies=RESTART)
    runtime_dir: str = setting("", STR, "where relative ipc:// endpoints go; \"\": $RUNTIME_DIRECTORY, /run/infermux, "
                               "... ([operating.md](operating.md#runtime-directory))", applies=RESTART)
    engine_dir: Path = setting(Path("/var/lib/infermux/engines"), PATH, "engines, relative to which a model's "
                               "`engine` is found, and where models are discovered (hot-swap.md)", applies=RESTART)
    memory_budget: str = setting("80%", BUDGET, "what loaded engines may hold: of GPU memory (host memory on "
                                 "CPU-only boxes and Jetson)", applies=LIVE)
    max_message_bytes: int = setting(64 * 1024 * 1024, INT, "a request's bytes, header and tensors",
                                     applies=LIVE, low=1024)
    max_reply_bytes: int = setting(64 * 1024 * 1024, INT, "a reply's header and output frames; past it 413 "
                                   "(default: max_message_bytes)", applies=LIVE, low=1024)
    # After a reply over it, the same connection's requests of the same shapes are refused uncomputed this long
    # (frontend/oversize.py); 0: never.
    oversize_memory_s: float = setting(1.0, NUMBER, "after a reply over max_reply_bytes, the connection's requests "
                                       "of its shapes are refused uncomputed this long; 0: never", applies=LIVE, low=0)
    max_header_bytes: int = setting(64 * 1024, INT, "a request's JSON header (security.md)", applies=LIVE,
                                    low=256, high=1 << 30)
    max_tensors: int = setting(64, INT, "tensors in one request", applies=LIVE, low=1, high=1 << 16)
    # numpy arrays have at most 64 dimensions (32 before numpy 2), so a larger max_rank would fail in reshape.
    max_rank: int = setting(8, INT, "dimensions of one tensor", applies=LIVE, low=1, high=32)
    max_elements: int = setting(1 << 28, INT, "elements of one tensor", applies=LIVE, low=1, high=1 << 40)
    max_shared_input_bytes: int = setting(256 << 20, INT, "inputs one request reads from shared-memory regions",
                                          applies=LIVE, low=1, high=1 << 40)
    curve_secret_key: Path | None = setting(None, KEY_FILE, "the daemon's CURVE secret key, for tcp:// listeners "
                                            "(security.md; `infermux keygen`)", applies=RESTART)
    curve_authorized_dir: Path | None = setting(None, KEY_DIR, "the clients' CURVE public keys allowed in; "
                                                "re-read at each reload", applies=RESTART)
    allow_insecure_tcp: bool = setting(False, BOOL, "let tcp:// listeners and stats go without CURVE",
                                       applies=RESTART)
    drain_timeout_s: float = setting(10.0, NUMBER, "how long a drain (stop, unload, swap) waits for accepted "
                                     "requests", applies=LIVE)
    log_level: str = setting("info", STR, "the daemon's log level (its workers started later take a new one)",
                             applies=RESTART, choices=LOG_LEVELS)
    traceback_interval_s: float = setting(10.0, NUMBER, "a repeated traceback is logged once, then a count per "
                                          "interval (events.py)", applies=RESTART, low=0)
    metrics_port: int = setting(0, INT, "Prometheus /metrics and the health probes on this port; 0: off",
                                applies=RESTART, low=0)
    metrics_host: str = setting("127.0.0.1", STR, "the metrics port's address; 0.0.0.0 for a pod's probes "
                                "(deployment.md)", applies=RESTART)
    inline_max_us: int = setting(500, INT, "compute on the frontend thread when idle and this short (inline.py)",
                                 applies=RESTART, low=0)
    inline_busy_max_us: int = setting(250, INT, "... and when other requests wait, only this short",
                                      applies=RESTART, low=0)
    watch: bool = setting(True, BOOL, "discover and hot-swap engines under engine_dir (hot-swap.md)",
                          applies=RESTART)
    watch_settle_s: float = setting(1.0, NUMBER, "a file written in place is taken once unchanged this long",
                                    applies=RESTART, low=0)
    watch_debounce_s: float = setting(0.05, NUMBER, "events closer than this are handled as one", applies=RESTART,
                                      low=0)
    watch_rescan_s: float = setting(5.0, NUMBER, "a full rescan even without events (lost events, NFS); 0: never",
                                    applies=RESTART, low=0)
    spare_worker: bool = setting(True, BOOL, "keep one worker started ahead for the next cold model",
                                 applies=LIVE)
    worker_hang_s: float = setting(10.0, NUMBER, "a worker silent this long is killed and replaced", applies=LIVE,
                                   low=0, low_open=True)
    shared_memory: str = setting("regions.sock", STR, "where local clients register tensor regions (regions.py); "
                                 "\"\": off", applies=RESTART)
    max_connections: int = setting(4096, INT, "live connections to the inference socket; past it, silent ones "
                                   "make room (peers.py)", applies=RESTART, low=1)
    reserved_fds: int = setting(512, INT, "descriptors kept free of connections: engines, workers, regions",
                                applies=RESTART, low=64)
    mps: str = setting("off", STR, "cold workers as CUDA MPS clients (workers/mps.py); \"auto\" joins a running "
                       "control daemon", applies=LIVE, choices=MPS_MODES)
    mps_pipe_dir: Path = setting(Path("/tmp/nvidia-mps"), PATH, "CUDA_MPS_PIPE_DIRECTORY of the control daemon",
                                 applies=LIVE)
    mps_thread_percentage: int = setting(0, INT, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of each worker; 0: MPS's own "
                                         "(100)", applies=LIVE, rule=PERCENTAGE)
    admin_group: str = setting("infermux-admin", STR, "admin.sock's group, apart from the clients' (security.md)",
                               applies=RESTART)
    max_contexts: int = setting(32, INT, "contexts one version may have: the file, a model.toml or `ctl set`",
                                applies=LIVE, low=1, high=MAX_CONTEXTS)
    follow_symlinks: bool = setting(True, BOOL, "serve engine_dir folders that link outside it (logged); false "
                                    "refuses them", applies=LIVE)
    state_dir: str = setting("", STR, "operators' live changes, kept across restarts (models/statefile.py); \"\": "
                             "$STATE_DIRECTORY, else /var/lib/infermux or ~/.local/state/infermux", applies=RESTART)
    # Per-stream accounting (execution/streams.py, docs/protocol.md#streams).
    stream_silent_s: float = setting(5.0, NUMBER, "a stream that sent two requests then nothing this long is "
                                     "`stream_silent`; 0: never", applies=LIVE, low=0)
    stream_metrics_keys: int = setting(32, INT, "Prometheus shows the busiest this many keys of each model by "
                                       "name, the rest summed as key=\"other\"", applies=LIVE, low=1)
    stream_max_keys: int = setting(1024, INT, "streams tracked; past it the least recently seen is forgotten",
                                   applies=LIVE, low=1)
    stream_keys: str = setting("open", STR, "\"bound\" gives a stream's key to the first client that sends it "
                               "until it goes silent; others' requests are 403", applies=LIVE, choices=STREAM_KEYS,
                               choice_text="'open' or 'bound'")
    engine_signing_keys: tuple[Path, ...] = setting((), PUBLIC_KEYS, "trusted publishers' keys: with any, only "
                                                    "engines one of them signed load (security.md)", applies=LIVE)
    record_max_bytes: int = setting(1 << 30, INT, "the tensors one `infermux record` may hold, inputs and outputs",
                                    applies=LIVE, low=1024)


@dataclass(frozen=True)
class RoutingConfig:
    """The `[routing]` table."""

    strategy: str = setting("least_queue", STR, "how a request that names no version picks one: the shortest "
                            "queue, by `weight`, or by a hash of its key", applies=LIVE, choices=STRATEGIES)
    unknown_model: str = setting("reject", STR, "a request for a model nobody serves is refused (404)",
                                 applies=LIVE, choices=("reject",))
    version_mismatch: str = setting("fallback", STR, "a request for a version that does not serve goes to the "
                                    "model's fallback, or is refused", applies=LIVE, choices=("fallback", "reject"))


RATIO = Rule("0 (not judged) or >= 1", lambda v: v == 0 or 1 <= v < math.inf)
MEBIBYTES = Rule("0 (not judged) or a size in MiB", lambda v: 0 <= v < math.inf)


@dataclass(frozen=True)
class RolloutConfig:
    """A model's `[models.rollout]` table (docs/hot-swap.md#shadow-rollout): a version published for
    it is a candidate, shadowing live requests, until `shadow_requests` comparisons decide."""

    shadow_requests: int = setting(200, INT, "comparisons that decide a candidate", applies=LIVE, low=1)
    compare: str = setting("allclose", STR, "how answers compare: all close, the top-1 of the first output, or "
                           "the boxes of the first output", applies=LIVE, choices=ROLLOUT_COMPARES)
    rtol: float = setting(1e-3, NUMBER, "compare = \"allclose\": relative tolerance", applies=LIVE, low=0)
    atol: float = setting(1e-4, NUMBER, "compare = \"allclose\": absolute tolerance", applies=LIVE, low=0)
    iou: float = setting(0.5, NUMBER, "compare = \"iou\": a box matches one that overlaps it this much",
                         applies=LIVE, low=0, high=1)
    min_agreement: float = setting(0.99, NUMBER, "the share of comparisons that must agree", applies=LIVE,
                                   low=0, high=1)
    min_idle_cpu: float = setting(0.25, NUMBER, "mirroring waits while less of the CPUs' time is idle: it takes "
                                  "only spare CPU", applies=LIVE, low=0, high=1)
    max_latency_ratio: float = setting(1.5, NUMBER, "candidate p99 / serving p99 on the same mirrored requests",
                                       applies=LIVE, rule=RATIO)
    max_memory_mb: float = setting(0.0, NUMBER, "the most the candidate may be measured to hold (unknown fails)",
                                   applies=LIVE, rule=MEBIBYTES)


@dataclass(frozen=True)
class ModelConfig:
    """One `[[models]]` entry: one version of one model."""

    name: str = required(NAME, "the model's name, as requests give it", applies=RELOAD)
    engine: Path = required(NAME, "the engine file, relative to engine_dir", applies=RELOAD)
    version: str = setting("1", VERSION, "the version; entries with one name are versions of one model",
                           applies=RELOAD)
    placement: str = setting(HOT, STR, "hot: in the daemon; cold: in a worker process (workers.md); the old key "
                             "`mode` (\"inproc\", \"multiproc\") is still read", applies=RELOAD, choices=PLACEMENTS,
                             choice_text="hot (in the daemon) or cold (in a worker process)")
    backend: str = setting("", STR, "by the engine's suffix, or a plugin's name or \"module:Class\"", applies=RELOAD)
    contexts: int = setting(1, INT, "contexts (sessions, each with its thread) computing at once; at most [daemon] "
                            "max_contexts", applies=LIVE, low=1, high=MAX_CONTEXTS, settable=True)
    max_queue: int = setting(64, INT, "requests waiting; past it 429", applies=LIVE, low=1, high=1 << 24,
                             settable=True)
    timeout_ms: int = setting(1000, INT, "a request not computed by then is answered 504", applies=LIVE, low=1,
                              high=2**31 - 1, settable=True)
    fallback: str = setting("", STR, "the model that answers when this one cannot; it must take the same inputs",
                            applies=LIVE, settable=True)
    max_batch: int = setting(1, INT, "rows computed in one call (Triton's max_batch_size)", applies=LIVE, low=1,
                             high=1 << 16, settable=True)
    batch_delay_us: int = setting(0, INT, "how long a batch waits to fill once the queue runs dry", applies=LIVE,
                                  low=0, high=60_000_000, settable=True)
    preferred_batch: tuple[int, ...] = setting((), SIZES, "batch sizes the engine runs best; a batch is cut to one",
                                               applies=LIVE, settable=True)
    idle_unload_s: float = setting(300.0, NUMBER, "a cold version unused this long is unloaded", applies=LIVE)
    preload: bool = setting(False, BOOL, "a cold version is loaded at start, not on its first request",
                            applies=LIVE)
    weight: int = setting(0, INT, "under `weighted` routing: its share of the model's requests", applies=LIVE,
                          low=0, high=MAX_WEIGHT, settable=True)
    canary_weight: int = setting(0, INT, "under `weighted`: a new version's weight when published (0: the one it "
                                 "supersedes)", applies=LIVE, low=0)
    default: bool = setting(False, BOOL, "the version a request that names none gets (else the newest ready)",
                            applies=LIVE)
    strategy: str = setting("", STR, "this model's routing strategy (\"\": [routing]'s)", applies=LIVE,
                            choices=("", *STRATEGIES))
    options: Mapping[str, Any] = setting({}, TABLE, "`[models.options]`, given to the backend (operating.md)",
                                         applies=RELOAD)
    version_policy: str = setting("latest", STR, "which versions found in engine_dir are served (Triton's)",
                                  applies=LIVE, choices=VERSION_POLICIES)
    latest_n: int = setting(1, INT, "version_policy = \"latest\": how many of the newest", applies=LIVE, low=1)
    versions: tuple[str, ...] = setting((), VERSIONS, "version_policy = \"specific\": which", applies=LIVE)
    mps_thread_percentage: int = setting(0, INT, "a cold worker's share of the GPU's SMs under MPS; 0: [daemon]'s",
                                         applies=LIVE, rule=PERCENTAGE)
    queue_policy: str = setting("fifo", STR, "newest_per_key: a key's newer request replaces its oldest queued one "
                                "(409) (protocol.md#streams)", applies=LIVE, choices=QUEUE_POLICIES, settable=True)
    per_key_depth: int = setting(1, INT, "queue_policy = \"newest_per_key\": requests of one key that may wait",
                                 applies=LIVE, low=1, high=1 << 16, settable=True)
    rollout: RolloutConfig | None = setting(None, TABLE, "`[models.rollout]`: a published version shadows live "
                                            "requests and earns its traffic first", applies=LIVE,
                                            section=RolloutConfig)
    nice: int = setting(0, INT, "added to its contexts' threads' nice value (cold: to every thread of its worker "
                        "process, from before its engine loads): the CPU goes to the rest first",
                        applies=RELOAD, low=0, high=MAX_NICE)

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)


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

    name: str = setting("", STR, "the step's name in the pipeline (default: its processor or model)",
                        applies=RELOAD)
    processor: str = setting("", STR, "the processor it runs (pipelines.md), or", applies=RELOAD)
    model: str = setting("", STR, "the model it calls", applies=RELOAD)
    options: Mapping[str, Any] = setting({}, TABLE, "a processor step's options", applies=RELOAD)
    for_each: str = setting("", STR, "\"regions\": once per region found so far, on its crop", applies=RELOAD,
                            choices=FOR_EACH, choice_text="\"regions\" (or left out)")
    input: str = setting("", STR, "the model input the step's tensor goes to (default: the model's only input)",
                         applies=RELOAD)
    pad_value: float = setting(0.0, NUMBER, "a per-region model step: crops are padded with it to the largest",
                               applies=RELOAD)
    pad_multiple: int = setting(1, INT, "... and their last axis to a multiple of it", applies=RELOAD, low=1)
    reinfer_every: int = setting(0, INT, "after a track step: a region computed every this many frames of its "
                                 "track", applies=RELOAD, low=1, unset=True)
    reinfer_growth: float = setting(0.0, NUMBER, "... or when its box area changed by this much", applies=RELOAD,
                                    rule=POSITIVE, unset=True)
    max_calls_per_s: float = setting(0.0, NUMBER, "regions it computes per second, split across the streams",
                                     applies=RELOAD, rule=POSITIVE, unset=True)


@dataclass(frozen=True)
class LifecycleConfig:
    """A pipeline's `[pipelines.events]` table: when a tracked object's `new`, `update` and `end` events
    are made (daemon/pipelines/lifecycle.py, docs/events.md). Its pipeline needs a `track` step
    (config/pipelines.py)."""

    min_frames: int = setting(3, INT, "frames an object is seen scoring at least min_score before its `new`",
                              applies=RELOAD, low=1, high=10_000)
    min_score: float = setting(0.5, NUMBER, "a frame scoring less neither counts nor raises the best score",
                               applies=RELOAD, low=0.0, high=1.0)
    end_after_s: float = setting(2.0, NUMBER, "an object unseen this long has ended (`end`)", applies=RELOAD,
                                 low=0.05, high=86_400)
    update_every_s: float = setting(1.0, NUMBER, "at most one `update` per object this often; changes in between "
                                    "wait", applies=RELOAD, low=0.0, high=86_400)
    min_score_gain: float = setting(0.05, NUMBER, "a best score that rose by less is not a change worth an "
                                    "`update`", applies=RELOAD, low=0.0, high=1.0)
    max_objects: int = setting(4096, INT, "objects followed at once over every stream of the pipeline; newcomers "
                               "past it are not followed (`events.not_followed`)", applies=RELOAD, low=1,
                               high=1_000_000)
    snapshots: bool = setting(False, BOOL, "each object's best frame saved as a JPEG with its boxes, and its crop "
                              "([snapshots]); its events name the files", applies=RELOAD)


@dataclass(frozen=True)
class SnapshotConfig:
    """The `[snapshots]` table: the folder of JPEGs under the state directory that tracked objects'
    best frames and `ctl snapshot` are saved in (daemon/pipelines/snapshots.py, docs/events.md#snapshots)."""

    max_mb: float = setting(256.0, NUMBER, "the folder's files at most; past it the oldest go", applies=RESTART,
                            low=0.1, high=1 << 20)
    keep_days: float = setting(7.0, NUMBER, "a file older than this goes", applies=RESTART, low=0.001,
                               high=36_500)
    quality: int = setting(85, INT, "the JPEG quality", applies=RESTART, low=10, high=100)
    queue: int = setting(64, INT, "snapshots waiting to be written; past it a new one is dropped (counted)",
                         applies=RESTART, low=1, high=10_000)


@dataclass(frozen=True)
class PipelineConfig:
    """One `[[pipelines]]` entry: steps run in order on a frame sent as input `input`
    (docs/pipelines.md); `workers` threads run them, `max_queue` frames wait (429 beyond).

    The `max_*` bounds are checked before the work they bound, each refused with 413 naming
    it: regions a frame may have (before the steps that run per region), the width of a
    crop's tensor at a per-region model step, and the bytes of a model step's batch."""

    name: str = required(NAME, "the pipeline's name, as requests give it in \"model\"", applies=RELOAD)
    steps: tuple[StepConfig, ...] = required(TABLES, "`[[pipelines.steps]]`, run in order", applies=RELOAD,
                                             section=StepConfig)
    input: str = setting("image", NAME, "the input a frame is sent as", applies=RELOAD)
    workers: int = setting(2, INT, "threads that run the steps", applies=RELOAD, low=1)
    max_queue: int = setting(16, INT, "frames waiting; past it 429", applies=RELOAD, low=1)
    timeout_ms: int = setting(5000, INT, "a frame not done by then is answered 504", applies=RELOAD, low=1)
    queue_policy: str = setting("fifo", STR, "as a model's", applies=RELOAD, choices=QUEUE_POLICIES)
    per_key_depth: int = setting(1, INT, "as a model's", applies=RELOAD, low=1)
    max_regions: int = setting(1000, INT, "regions a frame may have (413 past it)", applies=RELOAD, low=1)
    max_crop_width: int = setting(4096, INT, "a crop's tensor width at a per-region model step", applies=RELOAD,
                                  low=1)
    max_batch_bytes: int = setting(256 << 20, INT, "the bytes of a model step's batch", applies=RELOAD, low=1)
    nice: int = setting(0, INT, "as a model's: added to the nice value of the threads that run the steps",
                        applies=RELOAD, low=0, high=MAX_NICE)
    warm_frames: tuple[tuple[int, int], ...] = setting((), FRAMES, "frame sizes its cameras send: its models are "
                                                       "warmed at the shapes its resize steps make of them",
                                                       applies=RELOAD)
    events: LifecycleConfig | None = setting(None, TABLE, "`[pipelines.events]`: tracked objects' new / update / "
                                             "end events, sent to the sinks (events.md); needs a `track` step",
                                             applies=RELOAD, section=LifecycleConfig)


Polygon = tuple[tuple[float, float], ...]  # points (x, y), fractions of the frame's width and height


@dataclass(frozen=True)
class GateConfig:
    """A camera's `[cameras.gate]` table: the motion gate (docs/motion-gate.md) that lets only frames
    with motion (and a keep-alive) go on. `absorb_s` may not be below `background_s`
    (config/cameras.py)."""

    threshold: float = setting(0.002, NUMBER, "the share of the unmasked working pixels that must change for "
                               "motion", applies=CAMERA, low=0.0001, high=1)
    delta: int = setting(15, INT, "grey levels (0-255) a working pixel must differ from the background by",
                         applies=CAMERA, low=1, high=255)
    every_s: float = setting(10.0, NUMBER, "a keep-alive frame this often without motion; 0: never",
                             applies=CAMERA, low=0, high=86400)
    width: int = setting(160, INT, "the working grey image's width in pixels (its height keeps the frame's "
                         "aspect); smaller is cheaper and blind to smaller objects", applies=CAMERA, low=16, high=1280)
    background_s: float = setting(1.0, NUMBER, "the time constant the background follows unchanged pixels with",
                                  applies=CAMERA, low=0.01, high=3600)
    absorb_s: float = setting(5.0, NUMBER, "... and changed ones: how long a stopped object keeps frames going; "
                              ">= background_s", applies=CAMERA, low=0.01, high=86400)
    max_boxes: int = setting(16, INT, "motion boxes a frame carries; past it the smallest are merged into one",
                             applies=CAMERA, low=1, high=256)
    masks: tuple[Polygon, ...] = setting((), MASKS, "areas never counted: a clock, trees, a road outside the "
                                         "area watched", applies=CAMERA)


# A zone's or line's name is a Prometheus label value and a part of an MQTT topic: short and plain.
AREA_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
AREA_NAME_RULE = Rule("letters, digits, '_', '.', '-', at most 64, not starting with '.' or '-' (it is a metric "
                      "label and part of an MQTT topic)", lambda v: bool(AREA_NAME.fullmatch(v)))
SIDES = ("left", "right")  # of a line, as seen on the image walking from its first point to its second


@dataclass(frozen=True)
class ZoneConfig:
    """A camera's `[[cameras.zones]]` entry: a polygon of the frame. An object is in it while the bottom
    centre of its box is (daemon/pipelines/zones.py, docs/events.md#zones-and-lines)."""

    name: str = required(NAME, "the zone's name, in events, counts and metrics; unique among the camera's zones "
                         "and lines", applies=LIVE, rule=AREA_NAME_RULE)
    points: tuple[tuple[float, float], ...] = required(POLYGON, "its corners [x, y] in order, fractions of the "
                                                       "frame's width and height (0, 0: top-left)", applies=LIVE)
    inertia: int = setting(3, INT, "frames in a row an object's point must be inside (outside) before it enters "
                           "(exits): a box jittering on the edge makes no events", applies=LIVE, low=1, high=100)


@dataclass(frozen=True)
class LineConfig:
    """A camera's `[[cameras.lines]]` entry: a directed line; an object whose box's bottom centre passes
    it makes a `cross` event, `in` or `out` (daemon/pipelines/zones.py, docs/events.md#zones-and-lines)."""

    name: str = required(NAME, "the line's name, in events, counts and metrics; unique among the camera's zones "
                         "and lines", applies=LIVE, rule=AREA_NAME_RULE)
    points: tuple[tuple[float, float], ...] = required(SEGMENT, "its two ends [x, y], fractions of the frame's "
                                                       "width and height", applies=LIVE)
    in_side: str = setting("left", STR, "the side an object crossing towards is going `in`: left or right as seen "
                           "on the image from the first point towards the second", applies=LIVE, choices=SIDES)
    margin: float = setting(0.02, NUMBER, "how near the line (fractions of the frame) a point keeps the side it "
                            "had: jitter on the line is no crossing", applies=LIVE, low=0.0, high=0.5)


MAX_ZONES = 16  # zones a camera may have, and lines: each is a metric series per label
TRANSPORTS = ("tcp", "udp")
DECODERS = ("auto", "software", "gstreamer")
DEVICE = re.compile(r"/dev/video[0-9]{1,3}")  # a V4L2 camera's `url`
MAX_FPS = 240.0
DEFAULT_MAX_PIXELS = 3840 * 2160  # a 4K stream; larger ones are refused unless max_pixels says otherwise


def url_kind(url: str) -> str:
    """What a camera's `url` names: "rtsp", "http", "device" or "file"."""
    if url.startswith(("rtsp://", "rtsps://")):
        return "rtsp"
    if url.startswith(("http://", "https://")):
        return "http"
    return "device" if DEVICE.fullmatch(url) else "file"


@dataclass(frozen=True)
class CameraConfig:
    """One `[[cameras]]` entry (docs/cameras.md): a stream the daemon reads itself, in a process of its
    own, whose frames go to a pipeline. The rules between keys and entries: config/cameras.py."""

    name: str = required(NAME, "its stream key, in events, metrics and `ctl cameras`: printable, at most 128 "
                         "bytes, unique", applies=CAMERA)
    url: str = required(NAME, "rtsp(s)://, http(s):// (MJPEG), /dev/videoN, or a video file (relative: to this "
                        "file's folder)", applies=CAMERA)
    pipeline: str = required(NAME, "the `[[pipelines]]` entry its frames go to", applies=CAMERA)
    transport: str = setting("tcp", STR, "rtsp: tcp (interleaved, survives loss) or udp (lower latency on a clean "
                             "link)", applies=CAMERA, choices=TRANSPORTS)
    loop: bool = setting(True, BOOL, "a file: start again at its end (false: `camera_ended`)", applies=CAMERA)
    fps: float = setting(15.0, NUMBER, "frames taken per second; the newest decoded frame wins", applies=CAMERA,
                         low=0, low_open=True, high=MAX_FPS)
    size: tuple[int, int] | None = setting(None, SIZE, "frames are scaled to it as they leave the decoder, before "
                                           "the gate and the pipeline (none: as decoded)", applies=CAMERA)
    decoder: str = setting("auto", STR, "software (FFmpeg through PyAV), gstreamer (nvv4l2decoder on a Jetson), "
                           "or auto", applies=CAMERA, choices=DECODERS)
    enabled: bool = setting(True, BOOL, "false: listed but not read; `ctl camera NAME enable|disable` changes it "
                            "live until the file does", applies=LIVE)
    max_pixels: int = setting(DEFAULT_MAX_PIXELS, INT, "a stream advertising more pixels per frame is refused",
                              applies=CAMERA, low=1)
    gate: GateConfig | None = setting(None, TABLE, "`[cameras.gate]`: only frames with motion are sent "
                                      "(motion-gate.md)", applies=CAMERA, section=GateConfig)
    zones: tuple[ZoneConfig, ...] = setting((), TABLES, f"`[[cameras.zones]]`: polygons whose objects' `enter` and "
                                            f"`exit` are events, and counted (events.md); at most {MAX_ZONES}",
                                            applies=LIVE, section=ZoneConfig)
    lines: tuple[LineConfig, ...] = setting((), TABLES, f"`[[cameras.lines]]`: lines whose crossings are `cross` "
                                            f"events, and counted (events.md); at most {MAX_ZONES}", applies=LIVE,
                                            section=LineConfig)

    @property
    def kind(self) -> str:
        """"rtsp", "http", "device" or "file"."""
        return url_kind(self.url)

    def as_json(self) -> dict[str, Any]:
        """For the camera's process (its command line) and `ctl cameras`."""
        out = dataclasses.asdict(self)
        del out["zones"], out["lines"]  # the pipeline applies them to the camera's results, not its process
        out["size"] = list(self.size) if self.size else None
        return out


SPOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # a sink's name is its spool's folder
SINK_NAME = Rule("letters, digits, '_', '.', '-', at most 64, not starting with '.' or '-' (it names the "
                 "spool's folder)", lambda v: bool(SPOOL_NAME.fullmatch(v)))


@dataclass(frozen=True)
class SinkConfig:
    """One `[[sinks]]` entry (docs/events.md#sinks): a sink of kind `kind` with its `options`, and its
    durable spool's bounds (daemon/sinks/spool.py). The rules between keys and entries: config/sinks.py."""

    name: str = required(NAME, "its spool's folder and its name in events and `ctl sinks`: unique",
                         applies=SINK, rule=SINK_NAME)
    kind: str = required(NAME, "jsonl, zmq, mqtt, webhook, or an installed plugin's kind (events.md#sinks)",
                         applies=SINK)
    options: Mapping[str, Any] = setting({}, TABLE, "the kind's own options, checked by the kind "
                                         "(events.md#sinks)", applies=SINK)
    pipelines: tuple[str, ...] = setting((), NAMES, "the pipelines whose events it takes; empty: every one",
                                         applies=SINK)
    max_events: int = setting(100_000, INT, "events waiting in the spool at most; past it the oldest are dropped",
                              applies=SINK, low=1, high=100_000_000)
    max_mb: float = setting(64.0, NUMBER, "... and at most this many MiB of them", applies=SINK, low=0.01,
                            high=1 << 20)
    batch: int = setting(100, INT, "events handed to the sink at once", applies=SINK, low=1, high=10_000)
    retry_s: float = setting(0.5, NUMBER, "the first wait after a failed delivery; it doubles up to max_retry_s",
                             applies=SINK, low=0.01, high=3600)
    max_retry_s: float = setting(30.0, NUMBER, "the longest wait between deliveries that fail", applies=SINK,
                                 low=0.01, high=86_400)


@dataclass(frozen=True)
class Section:
    """A table of the file: its name, its dataclass, whether it is a `[[list]]` of entries, and what it is."""

    name: str
    settings: type
    many: bool
    doc: str


SECTIONS = (
    Section("daemon", DaemonConfig, False, "The daemon: sockets, limits, engine directory, workers."),
    Section("routing", RoutingConfig, False, "How requests pick a version."),
    Section("models", ModelConfig, True, "One entry per version of a model."),
    Section("models.rollout", RolloutConfig, False, "A model's shadow rollout (hot-swap.md#shadow-rollout)."),
    Section("pipelines", PipelineConfig, True, "Steps run on a frame (pipelines.md)."),
    Section("pipelines.steps", StepConfig, True, "One step of a pipeline: a `processor` or a `model`."),
    Section("pipelines.events", LifecycleConfig, False, "A pipeline's object events: when a tracked object's "
            "`new`, `update` and `end` are made (events.md)."),
    Section("cameras", CameraConfig, True, "A camera the daemon reads itself, its frames sent to a pipeline "
            "(cameras.md)."),
    Section("cameras.gate", GateConfig, False, "A camera's motion gate: only frames with motion go on "
            "(motion-gate.md)."),
    Section("snapshots", SnapshotConfig, False, "Where objects' best frames and `ctl snapshot` are saved, "
            "and how much of them is kept (events.md#snapshots)."),
    Section("cameras.zones", ZoneConfig, True, "A camera's zone: a polygon whose objects' entering and leaving "
            "are events (events.md#zones-and-lines)."),
    Section("cameras.lines", LineConfig, True, "A camera's line: crossing it is an event, in or out "
            "(events.md#zones-and-lines)."),
    Section("sinks", SinkConfig, True, "Where object events go, each sink with a durable spool of its own "
            "(events.md#sinks)."),
)


@dataclass(frozen=True)
class Config:
    """A whole, validated configuration file."""

    path: Path
    daemon: DaemonConfig
    routing: RoutingConfig
    models: tuple[ModelConfig, ...]
    pipelines: tuple[PipelineConfig, ...] = ()
    cameras: tuple[CameraConfig, ...] = ()
    sinks: tuple[SinkConfig, ...] = ()
    snapshots: SnapshotConfig = SnapshotConfig()

    def versions(self, name: str) -> list[ModelConfig]:
        return [m for m in self.models if m.name == name]
