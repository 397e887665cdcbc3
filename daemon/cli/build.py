"""Build a TensorRT engine from an ONNX model on this device.

    infermux build model.onnx -o model.plan [--fp16 | --int8 --calib-cache FILE]
                   [--min-batch 1] [--opt-batch N] [--max-batch N] [--workspace MiB]
                   [--profile MIN:OPT:MAX ...] [--timing-cache FILE]
                   [--dla-core N [--gpu-fallback]] [--device N]

An engine only runs on the GPU model and TensorRT version that built it, so
build on the device that serves it, and again after a JetPack or TensorRT
upgrade. Every input whose first dimension is dynamic gets one optimization
profile over the batch range, or one per `--profile` batch range; the output is written under a temporary name
and renamed, so the engine watcher never loads half a file. Beside it go the
settings it was built with (`model.plan.build.json`), which the TensorRT
backend reuses to rebuild a plan that an upgrade made unloadable.

This module is the command: its arguments, the status line, the summary.
The builder itself is the TensorRT backend's (plugins/backends/tensorrt_build.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from infermux.plugins.backends.tensorrt_build import BuildError, BuildOptions, build_engine
from infermux.plugins.base import BackendError


def parse_profile(text: str) -> tuple[int, int, int]:
    """`--profile MIN:OPT:MAX` (argparse type)."""
    parts = text.split(":")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected MIN:OPT:MAX batch sizes, e.g. 1:4:8, got {text!r}")
    low, opt, high = (int(p) for p in parts)
    return low, opt, high


class _Status:
    """An elapsed-time status line on stderr: redrawn in place on a terminal,
    a plain line every 10 s otherwise (logs, CI)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr  # looked up now: a test (or caller) may have replaced it
        self._tty = self._stream.isatty()
        self._start = time.monotonic()
        self._last_line = 0.0
        self._lock = threading.Lock()
        self.phase = "building"

    def set_phase(self, phase: str) -> None:
        """The builder's OnPhase callback: shown on the next redraw."""
        self.phase = phase

    def note(self, line: str) -> None:
        """A line of its own (a warning), above the status line."""
        with self._lock:
            self._stream.write(("\r" + " " * 100 + "\r" if self._tty else "") + line + "\n")
            self._stream.flush()

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


class _Notes(logging.Handler):
    """The builder's warnings (logger infermux.build), one line each, above the status line."""

    def __init__(self, status: _Status) -> None:
        super().__init__(logging.WARNING)
        self._status = status

    def emit(self, record: logging.LogRecord) -> None:
        self._status.note(f"infermux build: warning: {record.getMessage()}")


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
    parser.add_argument("--device", type=int, default=0, metavar="N",
                        help="the CUDA device to build on, the one that will serve the engine (default 0)")


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
    if args.device < 0:
        raise BuildError("--device must be a CUDA device number, 0 or more")
    opts = BuildOptions(args.onnx, args.output, args.fp16, args.int8, args.calib_cache,
                        args.min_batch, args.opt_batch, args.max_batch, args.workspace, args.timing_cache,
                        tuple(args.profile), args.dla_core, args.gpu_fallback, args.device)
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
    status = _Status()
    notes, builder_log = _Notes(status), logging.getLogger("infermux.build")
    builder_log.addHandler(notes)
    try:
        with _Ticker(status):
            report = build_engine(opts, status.set_phase)
    except (BuildError, BackendError) as exc:
        print(f"infermux build: {exc}", file=sys.stderr)
        return 1
    finally:
        builder_log.removeHandler(notes)
    batch = "; ".join(", ".join(f"{n} {list(lo)}..{list(hi)}" for n, (lo, _, hi) in profile.items())
                      for profile in report.all_profiles if profile) or "static shapes"
    print(f"wrote {report.output} ({report.bytes / 2**20:.1f} MiB) in {report.seconds:.1f} s with "
          f"TensorRT {report.tensorrt_version}; {batch}. It runs only on this GPU model with this "
          f"TensorRT version.")
    if report.dla_layers:
        print(f"{report.dla_layers} of {report.layers} layers run on DLA core {opts.dla_core}, the rest on the GPU.")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m infermux.cli.build`: the same command without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="infermux build", description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
