"""Building a TensorRT engine in a child process, for the daemon's rebuilds (tensorrt_rebuild.py).

`build_isolated(opts, on_phase)` runs `python -m infermux.plugins.backends.tensorrt_build_process`,
which runs tensorrt_build.build_engine and reports back on its stdout, one JSON object a line:
`{"phase": ...}` for each builder phase (passed to `on_phase`), `{"log": [level, logger, message]}`
for each log record (re-logged here, so TensorRT's warnings reach the daemon log), then
`{"report": ...}` or `{"error": ...}`. Building in a child keeps three things out of the daemon:

- the GIL traffic of TensorRT's logger: the binding takes the GIL for every message the builder
  logs, VERBOSE included, from its own threads, before our severity filter runs;
- the builder's memory (the network, tactic workspaces), freed when the child exits;
- a crash in the builder's native code, which here ends the child, not the daemon: the build fails
  with the signal and what the child printed last.

The thread that calls `build_isolated` waits on a pipe, without the GIL, so the daemon serves on
meanwhile. The child exits when its stdin closes, so it does not outlive a daemon that died.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from infermux.plugins.backends.tensorrt_build import BuildError, BuildOptions, BuildReport, OnPhase, Shape, build_engine
from infermux.plugins.base import BackendError

log = logging.getLogger("infermux.build")


def build_isolated(opts: BuildOptions, on_phase: OnPhase) -> BuildReport:
    """Build `opts` in a child process, telling `on_phase` its phases; BuildError if it fails or crashes."""
    level = min(logging.getLogger(name).getEffectiveLevel() for name in ("infermux", "infermux.tensorrt"))
    request = {"onnx": os.fspath(opts.onnx), "output": os.fspath(opts.output), "device": opts.device,
               "settings": opts.settings(), "level": level}
    cmd = [sys.executable, "-m", __name__, json.dumps(request)]
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        assert child.stdout is not None and child.stdin is not None
        try:
            outcome = _follow(child.stdout, on_phase)
        finally:
            code = child.wait()
            child.stdin.close()
        stderr.seek(0)
        tail = stderr.read().decode(errors="replace").strip().splitlines()[-3:]
    if "report" in outcome:
        return _report(outcome["report"])
    if "error" in outcome:
        raise BuildError(str(outcome["error"]))
    raise BuildError(f"the TensorRT builder process {_ended(code)} while building {opts.onnx}"
                     + (f": {' | '.join(tail)}" if tail else ""))


def _follow(lines: IO[bytes], on_phase: OnPhase) -> dict[str, Any]:
    """Read the child's messages until it closes its stdout; the last report or error."""
    outcome: dict[str, Any] = {}
    for raw in lines:
        try:
            message = json.loads(raw)
        except ValueError:
            log.debug("TensorRT builder process: %s", raw.decode(errors="replace").rstrip())
            continue
        if "phase" in message:
            on_phase(str(message["phase"]))
        elif "log" in message:
            level, name, text = message["log"]
            logging.getLogger(str(name)).log(int(level), "%s", text)
        else:
            outcome = message
    return outcome


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"crashed ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without a result"


def _report(data: dict[str, Any]) -> BuildReport:
    """The child's BuildReport, from its JSON (lists back to tuples)."""
    def profile(shapes: dict[str, Any]) -> dict[str, tuple[Shape, Shape, Shape]]:
        out = {}
        for name, (low, opt, high) in shapes.items():
            out[name] = (tuple(map(int, low)), tuple(map(int, opt)), tuple(map(int, high)))
        return out

    return BuildReport(Path(data["output"]), int(data["bytes"]), float(data["seconds"]), str(data["tensorrt_version"]),
                       profile(data["profiles"]), [profile(p) for p in data["all_profiles"]], int(data["layers"]),
                       None if data["dla_layers"] is None else int(data["dla_layers"]))


class _Channel:
    """The child's end: JSON lines on the stdout it was started with, whichever thread writes."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            self._stream.write(json.dumps(message) + "\n")
            self._stream.flush()


class _Forward(logging.Handler):
    """Log records, to be re-logged by the parent."""

    def __init__(self, channel: _Channel) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        self._channel.send({"log": [record.levelno, record.name, record.getMessage()]})


def _exit_with_parent() -> None:
    """End this process when the parent's end of stdin closes (the parent exited, or died)."""
    def watch() -> None:
        sys.stdin.buffer.read()
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    """The child: build what argv[0] (JSON) asks, reporting on stdout."""
    channel = _Channel(os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)  # anything else printed (native code, plugins) goes to stderr, not into the messages
    _exit_with_parent()
    request = json.loads(argv[0])
    root = logging.getLogger("infermux")
    root.setLevel(int(request["level"]))
    root.addHandler(_Forward(channel))
    root.propagate = False
    try:
        opts = dataclasses.replace(BuildOptions.from_settings(Path(request["onnx"]), Path(request["output"]),
                                                              request["settings"]), device=int(request["device"]))
        report = build_engine(opts, lambda phase: channel.send({"phase": phase}))
    except (BuildError, BackendError) as exc:
        channel.send({"error": str(exc)})
        return 1
    except Exception as exc:  # TensorRT's own: reported as the build's failure, not a traceback
        channel.send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    fields = dataclasses.asdict(report)
    fields["output"] = os.fspath(report.output)
    channel.send({"report": fields})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
