"""Building a TensorRT engine from an ONNX model on this device.

`build_engine(BuildOptions(...))` is what `infermux build` (cli/build.py)
runs, and what the backend runs to rebuild a plan an upgrade made
unloadable (tensorrt_rebuild.py). An engine only runs on the GPU model and
TensorRT version that built it, so it is built on the device that serves
it, and again after a JetPack or TensorRT upgrade. Every input whose first
dimension is dynamic gets one optimization profile over the batch range, or
one per batch range in `profiles`; the plan is written under a temporary
name and renamed, so the engine watcher never loads half a file. Beside it
go the settings it was built with (`model.plan.build.json`), which a
rebuild reuses. While it builds, the builder reports each phase it enters
to an `OnPhase` callback: the command prints it, a rebuild reports it as
the version's progress. A build is tied to the CUDA device current when it
starts, so it builds on `device`. A DLA build needs static shapes (the DLA
runs no dynamic dimensions) and reports how many layers landed on the DLA.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from infermux.plugins.backends import cuda, trtlib

Shape = tuple[int, ...]

log = logging.getLogger("infermux.build")

SETTINGS_SUFFIX = ".build.json"  # model.plan -> model.plan.build.json


#: Told each phase the builder enters: "building" first, then TensorRT's own phases as they
#: nest ("Building engine 3/40 > Tactic timing 1/9"), "finishing" once they end. It is called
#: on TensorRT's threads while the build runs: keep it short.
OnPhase = Callable[[str], None]


class BuildError(Exception):
    """The engine could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class BuildOptions:
    """What to build, and how (`infermux build`'s options; a rebuild's stored settings)."""

    onnx: Path
    output: Path
    fp16: bool = False
    int8: bool = False
    calib_cache: Path | None = None
    min_batch: int = 1
    opt_batch: int | None = None   # None: max_batch
    max_batch: int = 8
    workspace_mib: int = 1024
    timing_cache: Path | None = None  # read before the build if it exists, written after
    profiles: tuple[tuple[int, int, int], ...] = ()  # several batch ranges (--profile); () = the one above
    dla_core: int | None = None  # Jetson's DLA (plugins/backends/tensorrt_dla.py)
    gpu_fallback: bool = False
    device: int = 0  # the CUDA device to build on (the model's); not a stored setting

    def settings(self) -> dict[str, Any]:
        """What a rebuild needs besides the two paths (settings_path), as JSON."""
        return {"fp16": self.fp16, "int8": self.int8, "calib_cache": _text(self.calib_cache),
                "min_batch": self.min_batch, "opt_batch": self.opt_batch, "max_batch": self.max_batch,
                "workspace_mib": self.workspace_mib, "timing_cache": _text(self.timing_cache),
                "profiles": [list(r) for r in self.profiles], "dla_core": self.dla_core,
                "gpu_fallback": self.gpu_fallback}

    @classmethod
    def from_settings(cls, onnx: Path, output: Path, settings: dict[str, Any]) -> "BuildOptions":
        """The options a stored `settings()` describes, for `onnx` -> `output`; BuildError if bad."""
        known = {k: v for k, v in settings.items() if k in cls.__dataclass_fields__ and k != "device"}
        for key in ("calib_cache", "timing_cache"):
            known[key] = Path(known[key]) if known.get(key) else None
        known["profiles"] = tuple(tuple(r) for r in known.get("profiles") or ())
        try:
            opts = cls(onnx, output, **known)
        except TypeError as exc:
            raise BuildError(f"stored build settings {settings} are not usable: {exc}") from exc
        opts.batch_range()
        return opts

    def batch_range(self) -> tuple[int, int, int]:
        """(min, opt, max) batch over every profile, each checked to be 1 <= min <= opt <= max."""
        ranges = self.batch_ranges()
        return min(r[0] for r in ranges), ranges[0][1], max(r[2] for r in ranges)

    def batch_ranges(self) -> list[tuple[int, int, int]]:
        """One (min, opt, max) batch per optimization profile, checked; several must leave no gap."""
        if self.profiles:
            for low, opt, high in self.profiles:
                if not 1 <= low <= opt <= high:
                    raise BuildError(f"--profile needs 1 <= MIN <= OPT <= MAX, got {low}:{opt}:{high}")
            _no_gaps(self.profiles)
            return list(self.profiles)
        opt = self.max_batch if self.opt_batch is None else self.opt_batch
        if not 1 <= self.min_batch <= opt <= self.max_batch:
            raise BuildError(f"need 1 <= --min-batch <= --opt-batch <= --max-batch, "
                             f"got {self.min_batch}, {opt}, {self.max_batch}")
        return [(self.min_batch, opt, self.max_batch)]


def _no_gaps(ranges: Sequence[tuple[int, int, int]]) -> None:
    """Dynamic batching merges requests into any row count up to the largest max: a count no
    profile admits would refuse valid requests, so the ranges must join up."""
    covered = 0
    for low, _, high in sorted(ranges):
        if covered and low > covered + 1:
            raise BuildError(f"--profile ranges leave batches {covered + 1}..{low - 1} to no profile; "
                             f"merged requests of that size would be refused: close the gap")
        covered = max(covered, high)


@dataclass(frozen=True)
class BuildReport:
    """What was built."""

    output: Path
    bytes: int
    seconds: float
    tensorrt_version: str
    profiles: dict[str, tuple[Shape, Shape, Shape]]  # the first optimization profile
    all_profiles: list[dict[str, tuple[Shape, Shape, Shape]]]
    layers: int = 0  # in the network TensorRT parsed
    dla_layers: int | None = None  # of those, how many run on the DLA (None: not a DLA build)


def _text(path: Path | None) -> str | None:
    return None if path is None else os.fspath(path)


def settings_path(plan: Path) -> Path:
    """Where the settings a plan was built with are kept: beside it."""
    return plan.with_name(plan.name + SETTINGS_SUFFIX)


def stored_settings(plan: Path) -> dict[str, Any]:
    """The settings `plan` was built with ({} if none were stored or they cannot be read)."""
    try:
        settings = json.loads(settings_path(plan).read_text())
    except (OSError, ValueError):
        return {}
    return settings if isinstance(settings, dict) else {}


def batch_profile(inputs: Sequence[tuple[str, Shape]],
                  batch: tuple[int, int, int]) -> dict[str, tuple[Shape, Shape, Shape]]:
    """(min, opt, max) shapes for every input whose dim 0 is dynamic (-1).

    Other dynamic dimensions are refused: a batch range cannot size them.
    """
    profiles: dict[str, tuple[Shape, Shape, Shape]] = {}
    for name, shape in inputs:
        if any(d < 0 for d in shape[1:]):
            raise BuildError(f"input {name!r} {list(shape)} has dynamic dimensions besides the batch; "
                             f"export the ONNX model with fixed sizes for them")
        if shape and shape[0] < 0:
            low, opt, high = ((b, *shape[1:]) for b in batch)
            profiles[name] = (low, opt, high)
    return profiles


def _progress_monitor(trt: Any, on_phase: OnPhase) -> Any | None:
    """An IProgressMonitor that tells `on_phase` the builder's current phase, where this
    TensorRT's Python API has one (else only "building" is told)."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()  # the binding's own __init__ must run (pybind11 trampoline)
            self._phases: dict[str, str] = {}
            self._lock = threading.Lock()  # TensorRT calls it from several threads

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            with self._lock:
                self._phases[phase_name] = f"{phase_name} 0/{num_steps}"
                on_phase(" > ".join(self._phases.values()))

        def step_complete(self, phase_name: str, step: int) -> bool:
            with self._lock:
                total = self._phases.get(phase_name, "/?").rsplit("/", 1)[1]
                self._phases[phase_name] = f"{phase_name} {step + 1}/{total}"
                on_phase(" > ".join(self._phases.values()))
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            with self._lock:
                self._phases.pop(phase_name, None)
                on_phase(" > ".join(self._phases.values()) or "finishing")

    return Monitor()


def _parse(trt: Any, logger: Any, onnx: Path) -> tuple[Any, Any, Any]:
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(os.fspath(onnx)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildError(f"TensorRT's ONNX parser rejected {onnx}: {errors or 'no reason given'}")
    return builder, network, parser  # the parser must outlive the build


def _set_precision(trt: Any, config: Any, opts: BuildOptions, profile: Any) -> None:
    # FP16/INT8 builder flags and calibrators are TensorRT 10 only (weak typing);
    # TensorRT 11 removed them in favour of precision set in the ONNX model.
    for wanted, flag in ((opts.fp16, "FP16"), (opts.int8, "INT8")):
        if wanted:
            member = getattr(trt.BuilderFlag, flag, None)
            if member is None:
                raise BuildError(f"TensorRT {trt.__version__} has no {flag} builder flag (removed in 11): "
                                 f"set the precision in the ONNX model (Q/DQ nodes, mixed-precision export)")
            config.set_flag(member)
    if opts.int8:
        assert opts.calib_cache is not None
        config.int8_calibrator = _cache_calibrator(trt, opts.calib_cache.read_bytes())
        if profile is not None:
            config.set_calibration_profile(profile)


def _cache_calibrator(trt: Any, cache: bytes) -> Any:
    """A calibrator that only replays an existing calibration cache (no data needed)."""

    class CacheCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: list[str]) -> None:
            return None  # no data: TensorRT must use the cache

        def read_calibration_cache(self) -> bytes:
            return cache

        def write_calibration_cache(self, data: bytes) -> None:
            pass

    return CacheCalibrator()


def _write_atomically(path: Path, data: Any) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as f:
        f.write(memoryview(data))
    os.replace(tmp, path)
    return path.stat().st_size


def build_engine(opts: BuildOptions, on_phase: OnPhase | None = None) -> BuildReport:
    """Build and write the engine, telling `on_phase` how far it got; BuildError (or
    BackendError without TensorRT or CUDA) on failure."""
    start = time.monotonic()
    on_phase = on_phase or _unheard
    on_phase("building")
    ranges = opts.batch_ranges()
    if not opts.onnx.is_file():
        raise BuildError(f"no ONNX model at {opts.onnx}")
    trtlib.import_tensorrt()  # a missing TensorRT says so before CUDA is asked anything
    if opts.device:  # a fresh process starts on device 0
        cuda.set_device(opts.device)  # before the builder: it builds for the current device
    shared = trtlib.shared()
    trt = shared.trt
    builder, network, _parser = _parse(trt, shared.logger, opts.onnx)
    inputs = [(t.name, tuple(t.shape)) for t in (network.get_input(i) for i in range(network.num_inputs))]
    shapes = [batch_profile(inputs, batch) for batch in ranges]
    if opts.dla_core is not None:
        _static_for_dla(shapes)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_mib << 20)
    first = _add_profiles(builder, config, shapes)
    _configure(shared, builder, config, opts, first, on_phase)
    plan = builder.build_serialized_network(network, config)  # releases the GIL while it builds
    if plan is None:
        raise BuildError(f"TensorRT could not build {opts.onnx}: {shared.last_error() or 'no reason logged'}")
    if opts.timing_cache is not None:
        _write_atomically(opts.timing_cache, config.get_timing_cache().serialize())
    size = _write_atomically(opts.output, plan)
    _write_atomically(settings_path(opts.output), json.dumps(opts.settings(), indent=1).encode())
    dla = None if opts.dla_core is None else _on_dla(trt, network, config, opts)
    return BuildReport(opts.output, size, time.monotonic() - start, trt.__version__, shapes[0], shapes,
                       int(network.num_layers), dla)


def _add_profiles(builder: Any, config: Any, shapes: Sequence[dict[str, tuple[Shape, Shape, Shape]]]) -> Any:
    """One optimization profile per batch range (none for static shapes); the first, or None."""
    first = None
    for profiles in shapes if shapes[0] else []:  # static shapes: no profile at all
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profiles.items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
        if first is None:  # no truthiness test on a binding object
            first = profile
    return first


def _configure(shared: trtlib.Shared, builder: Any, config: Any, opts: BuildOptions, first: Any,
               on_phase: OnPhase) -> None:
    """The build's precision, DLA core, timing cache and progress monitor."""
    trt = shared.trt
    _set_precision(trt, config, opts, first)  # INT8 calibrates with the first profile
    if opts.dla_core is not None:
        _use_dla(trt, builder, config, opts.dla_core, opts.gpu_fallback)
    if opts.timing_cache is not None:
        _use_timing_cache(shared, config, opts.timing_cache)
    monitor = _progress_monitor(trt, on_phase)
    if monitor is not None:
        config.progress_monitor = monitor


def _unheard(phase: str) -> None:
    """The phase callback of a build nobody watches."""


def _use_dla(trt: Any, builder: Any, config: Any, core: int, gpu_fallback: bool) -> None:
    """Make DLA core `core` the default device of every layer (tensorrt_dla.py; BuildError if
    absent); with `gpu_fallback`, layers the DLA cannot run go to the GPU (without it such a
    network fails to build)."""
    available = int(getattr(builder, "num_DLA_cores", 0))
    if core >= available:
        raise BuildError(f"--dla-core {core}: this device has {available} DLA core(s) (Jetson Orin "
                         f"AGX and NX have 2, Orin Nano and discrete GPUs none)")
    config.default_device_type = trt.DeviceType.DLA
    config.DLA_core = core
    if gpu_fallback:
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)


def _static_for_dla(shapes: Sequence[dict[str, tuple[Shape, Shape, Shape]]]) -> None:
    """BuildError unless every optimization profile is static (min = opt = max): the DLA runs no
    dynamic dimensions, and TensorRT would otherwise put every layer on the GPU (--gpu-fallback) or
    fail the build."""
    for profile in shapes:
        for name, (low, opt, high) in profile.items():
            if not low == opt == high:
                raise BuildError(f"--dla-core needs a static batch: the DLA runs no dynamic dimensions, so an "
                                 f"optimization profile's min, opt and max must be equal, and input {name!r} "
                                 f"would take batches {low[0]}..{high[0]} (opt {opt[0]}): give the one batch the "
                                 f"engine is to run with --profile N:N:N, for example --profile 1:1:1")


def _on_dla(trt: Any, network: Any, config: Any, opts: BuildOptions) -> int:
    """How many of the network's layers run on the DLA: those whose device is the DLA and that the
    builder says it can run there (IBuilderConfig.can_run_on_DLA); a warning when none do."""
    layers = [network.get_layer(i) for i in range(int(network.num_layers))]
    count = sum(1 for layer in layers
                if config.get_device_type(layer) == trt.DeviceType.DLA and config.can_run_on_DLA(layer))
    if not count:
        log.warning("no layer of %s runs on DLA core %d: %s, so %s is a GPU engine; check the model's layers "
                    "against TensorRT's DLA support", opts.onnx, opts.dla_core,
                    "all fall back to the GPU" if opts.gpu_fallback else "none can run there", opts.output)
    return count


def _use_timing_cache(shared: trtlib.Shared, config: Any, path: Path) -> None:
    """Start from the kernel timings an earlier build saved (`--timing-cache`): a rebuild after an
    upgrade, or of a similar model, skips timing the tactics it already timed. A cache TensorRT cannot
    read (another version's format, or a damaged file: create_timing_cache gives None) or refuses
    (another GPU: set_timing_cache is False with ignore_mismatch=False) is replaced by a new one, said
    in one line; the build writes the new one in its place."""
    try:
        saved = path.read_bytes()
    except FileNotFoundError:
        saved = b""
    except OSError as exc:
        raise BuildError(f"cannot read the timing cache {path}: {exc.strerror or exc}") from exc
    if saved:
        with shared.errors_held():  # a refusal is reported here, once
            try:
                cache = config.create_timing_cache(saved)
            except Exception as exc:  # not documented to raise; handled like None, as Polygraphy does
                log.debug("create_timing_cache raised", exc_info=exc)
                cache = None
            reason = shared.last_error()
        if cache is None:
            log.warning("timing cache %s cannot be read by TensorRT %s (%s): starting a new one, saved in its "
                        "place", path, shared.trt.__version__, reason or "another version's, or damaged")
        elif config.set_timing_cache(cache, False):
            return
        else:
            log.warning("timing cache %s was made on another GPU or TensorRT version: starting a new one, "
                        "saved in its place", path)
    fresh = config.create_timing_cache(b"")
    if fresh is None:  # only without memory: create_timing_cache gives None instead of raising
        raise BuildError(f"TensorRT could not create a timing cache: {shared.last_error() or 'no reason logged'}")
    config.set_timing_cache(fresh, False)
