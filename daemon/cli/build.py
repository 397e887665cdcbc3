"""Build a TensorRT engine from an ONNX model on this device.

    infermux build model.onnx -o model.plan [--fp16 | --int8 --calib-cache FILE]
                   [--min-batch 1] [--opt-batch N] [--max-batch N] [--workspace MiB]
                   [--profile MIN:OPT:MAX ...] [--timing-cache FILE]
                   [--dla-core N [--gpu-fallback]]

An engine only runs on the GPU model and TensorRT version that built it, so
build on the device that serves it, and again after a JetPack or TensorRT
upgrade. Every input whose first dimension is dynamic gets one optimization
profile over the batch range, or one per `--profile` batch range; the output is written under a temporary name
and renamed, so the engine watcher never loads half a file. Beside it go the
settings it was built with (`model.plan.build.json`), which the TensorRT
backend reuses to rebuild a plan that an upgrade made unloadable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TextIO

from infermux.plugins.base import BackendError

Shape = tuple[int, ...]

log = logging.getLogger("infermux.build")

SETTINGS_SUFFIX = ".build.json"  # model.plan -> model.plan.build.json


class BuildError(Exception):
    """The engine could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class BuildOptions:
    """What `infermux build` was asked to do."""

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
        known = {k: v for k, v in settings.items() if k in cls.__dataclass_fields__}
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


def parse_profile(text: str) -> tuple[int, int, int]:
    """`--profile MIN:OPT:MAX` (argparse type)."""
    parts = text.split(":")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected MIN:OPT:MAX batch sizes, e.g. 1:4:8, got {text!r}")
    low, opt, high = (int(p) for p in parts)
    return low, opt, high


@dataclass(frozen=True)
class BuildReport:
    """What was built."""

    output: Path
    bytes: int
    seconds: float
    tensorrt_version: str
    profiles: dict[str, tuple[Shape, Shape, Shape]]  # the first optimization profile
    all_profiles: list[dict[str, tuple[Shape, Shape, Shape]]]


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


class _Status:
    """An elapsed-time status line on stderr: redrawn in place on a terminal,
    a plain line every 10 s otherwise (logs, CI)."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._start = time.monotonic()
        self._last_line = 0.0
        self._lock = threading.Lock()
        self.phase = "building"

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def tick(self) -> None:
        with self._lock:
            line = f"[{self.elapsed():6.1f} s] {self.phase}"
            if self._tty:
                self._stream.write("\r" + line[:100].ljust(100))
                self._stream.flush()
            elif self.elapsed() - self._last_line >= 10:
                self._last_line = self.elapsed()
                self._stream.write(line + "\n")

    def finish(self) -> None:
        if self._tty:
            self._stream.write("\n")


class _Ticker:
    """Redraws the status line twice a second while the builder runs
    (TensorRT releases the GIL while it builds)."""

    def __init__(self, status: _Status) -> None:
        self._status = status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="build-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._status.tick()

    def __enter__(self) -> "_Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._status.finish()


def _progress_monitor(trt: Any, status: _Status) -> Any | None:
    """An IProgressMonitor that names the builder's current phase, where this
    TensorRT's Python API has one (else the status shows elapsed time only)."""
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
                status.phase = " > ".join(self._phases.values())

        def step_complete(self, phase_name: str, step: int) -> bool:
            with self._lock:
                total = self._phases.get(phase_name, "/?").rsplit("/", 1)[1]
                self._phases[phase_name] = f"{phase_name} {step + 1}/{total}"
                status.phase = " > ".join(self._phases.values())
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            with self._lock:
                self._phases.pop(phase_name, None)
                status.phase = " > ".join(self._phases.values()) or "finishing"

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


def build_engine(opts: BuildOptions, status: _Status | None = None) -> BuildReport:
    """Build and write the engine; BuildError (or BackendError without TensorRT) on failure."""
    from infermux.plugins.backends import trtlib

    ranges = opts.batch_ranges()
    if not opts.onnx.is_file():
        raise BuildError(f"no ONNX model at {opts.onnx}")
    shared = trtlib.shared()
    trt, status = shared.trt, status or _Status()
    builder, network, _parser = _parse(trt, shared.logger, opts.onnx)
    inputs = [(t.name, tuple(t.shape)) for t in (network.get_input(i) for i in range(network.num_inputs))]
    shapes = [batch_profile(inputs, batch) for batch in ranges]
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_mib << 20)
    first = None
    for profiles in shapes if shapes[0] else []:  # static shapes: no profile at all
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profiles.items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
        if first is None:  # no truthiness test on a binding object
            first = profile
    _set_precision(trt, config, opts, first)  # INT8 calibrates with the first profile
    if opts.dla_core is not None:
        from infermux.plugins.backends import tensorrt_dla

        tensorrt_dla.configure_build(trt, builder, config, opts.dla_core, opts.gpu_fallback)
    if opts.timing_cache is not None:
        _use_timing_cache(config, opts.timing_cache)
    monitor = _progress_monitor(trt, status)
    if monitor is not None:
        config.progress_monitor = monitor
    with _Ticker(status):
        plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BuildError(f"TensorRT could not build {opts.onnx}: {shared.last_error() or 'no reason logged'}")
    if opts.timing_cache is not None:
        _write_atomically(opts.timing_cache, config.get_timing_cache().serialize())
    size = _write_atomically(opts.output, plan)
    _write_atomically(settings_path(opts.output), json.dumps(opts.settings(), indent=1).encode())
    return BuildReport(opts.output, size, status.elapsed(), trt.__version__, shapes[0], shapes)


def _use_timing_cache(config: Any, path: Path) -> None:
    """Start from the kernel timings an earlier build saved (`--timing-cache`): a rebuild after an
    upgrade, or of a similar model, skips timing the tactics it already timed. A cache from another
    GPU or TensorRT version is refused by TensorRT (ignore_mismatch=False), then a new one starts."""
    try:
        saved = path.read_bytes()
    except FileNotFoundError:
        saved = b""
    except OSError as exc:
        raise BuildError(f"cannot read the timing cache {path}: {exc.strerror or exc}") from exc
    cache = config.create_timing_cache(saved)
    if not config.set_timing_cache(cache, False):
        log.warning("timing cache %s was made on another GPU or TensorRT version: starting a new one", path)
        config.set_timing_cache(config.create_timing_cache(b""), False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `infermux build`'s options."""
    parser.add_argument("onnx", type=Path, metavar="MODEL.onnx", help="the ONNX model")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="PLAN",
                        help="engine file to write (e.g. ENGINE_DIR/NAME/VERSION/model.plan)")
    parser.add_argument("--fp16", action="store_true", help="allow FP16 kernels (TensorRT 10)")
    parser.add_argument("--int8", action="store_true", help="allow INT8 kernels; needs --calib-cache")
    parser.add_argument("--calib-cache", type=Path, metavar="FILE", help="INT8 calibration cache to use")
    parser.add_argument("--min-batch", type=int, default=1, help="smallest batch served (default 1)")
    parser.add_argument("--opt-batch", type=int, help="batch TensorRT tunes for (default: --max-batch)")
    parser.add_argument("--max-batch", type=int, default=8, help="largest batch served (default 8)")
    parser.add_argument("--workspace", type=int, default=1024, metavar="MiB",
                        help="builder scratch memory limit in MiB (default 1024)")
    parser.add_argument("--profile", type=parse_profile, action="append", default=[], metavar="MIN:OPT:MAX",
                        help="one optimization profile per batch range (repeat; replaces --min/--opt/--max-batch)")
    parser.add_argument("--dla-core", type=int, metavar="N", help="run on DLA core N (Jetson Orin); needs "
                        "--fp16 or --int8")
    parser.add_argument("--gpu-fallback", action="store_true",
                        help="with --dla-core: layers the DLA cannot run go to the GPU")
    parser.add_argument("--timing-cache", type=Path, metavar="FILE",
                        help="kernel timings to start from, and to save the build's timings to")


def options_from_args(args: argparse.Namespace) -> BuildOptions:
    """BuildOptions from parsed arguments, checked."""
    if args.int8 and args.calib_cache is None:
        raise BuildError("--int8 needs --calib-cache FILE: infermux build does not calibrate")
    if args.calib_cache is not None and not args.calib_cache.is_file():
        raise BuildError(f"no calibration cache at {args.calib_cache}")
    if args.workspace < 1:
        raise BuildError("--workspace must be at least 1 MiB")
    if args.gpu_fallback and args.dla_core is None:
        raise BuildError("--gpu-fallback needs --dla-core N: it lets DLA layers fall back to the GPU")
    if args.dla_core is not None and (args.dla_core < 0 or not (args.fp16 or args.int8)):
        raise BuildError("--dla-core needs a core number >= 0 and --fp16 or --int8: the DLA runs FP16 and "
                         "INT8 only")
    opts = BuildOptions(args.onnx, args.output, args.fp16, args.int8, args.calib_cache,
                        args.min_batch, args.opt_batch, args.max_batch, args.workspace, args.timing_cache,
                        tuple(args.profile), args.dla_core, args.gpu_fallback)
    opts.batch_ranges()
    return opts


def run(args: argparse.Namespace) -> int:
    """`infermux build`: 0 on success, 1 if the build failed, 2 for bad arguments."""
    try:
        opts = options_from_args(args)
    except BuildError as exc:
        print(f"infermux build: {exc}", file=sys.stderr)
        return 2
    print(f"building {opts.output} from {opts.onnx} on this device (a large model takes minutes)",
          file=sys.stderr)
    try:
        report = build_engine(opts)
    except (BuildError, BackendError) as exc:
        print(f"infermux build: {exc}", file=sys.stderr)
        return 1
    batch = "; ".join(", ".join(f"{n} {list(lo)}..{list(hi)}" for n, (lo, _, hi) in profile.items())
                      for profile in report.all_profiles if profile) or "static shapes"
    print(f"wrote {report.output} ({report.bytes / 2**20:.1f} MiB) in {report.seconds:.1f} s with "
          f"TensorRT {report.tensorrt_version}; {batch}. It runs only on this GPU model with this "
          f"TensorRT version.")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m infermux.cli.build`: the same command without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="infermux build", description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
