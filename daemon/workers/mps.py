"""CUDA MPS for cold workers: find, join or start `nvidia-cuda-mps-control`, and each worker's environment.

Under MPS (the Multi-Process Service of discrete NVIDIA GPUs) the CUDA
contexts of several processes share one GPU context on the MPS server, so
kernels of different workers run side by side instead of time-sliced. A
worker becomes an MPS client by the environment it starts with:
`CUDA_MPS_PIPE_DIRECTORY` (where the control daemon listens),
`CUDA_MPS_LOG_DIRECTORY` and, to cap its share of the SMs,
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`. All three are read by CUDA when the
worker creates its first context, which is after it started, so they are
set when the process is started (workers/process.py).

`[daemon] mps`:
- "off": nothing is set; workers inherit the daemon's environment.
- "auto": workers join a control daemon that already answers in
  `mps_pipe_dir`; none there (or no `nvidia-cuda-mps-control`), and they run
  without MPS.
- "on": as "auto", but infermux starts the control daemon (`-d`) when none
  answers, quits it again when infermux stops, and a worker cannot start
  when MPS cannot be had (the version's reason says why).

Whether a control daemon answers is asked with `get_server_list`, which
succeeds only when one is running for that pipe directory. A model's
`mps_thread_percentage` (else `[daemon] mps_thread_percentage`) becomes its
worker's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; a worker with another
percentage than the spare's is started for it (workers/pool.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTROL = "nvidia-cuda-mps-control"
NOT_RUNNING = "Cannot find MPS control daemon"
ASK_TIMEOUT_S = 5.0
RETRY_S = 30.0  # MPS not found: asked again on a worker start after this (a control daemon started later)


class MpsUnavailable(RuntimeError):
    """`mps = "on"` and no MPS control daemon could be joined or started."""


@dataclass(frozen=True)
class MpsState:
    """What the daemon found: whether workers run as MPS clients, and why (or why not)."""

    mode: str            # the configured "off" | "auto" | "on"
    active: bool         # workers started now get the MPS environment
    pipe_dir: str
    started: bool        # infermux started the control daemon (and quits it at the end)
    detail: str          # one line for `infermux status` and `doctor`

    def info(self) -> dict[str, Any]:
        return {"mode": self.mode, "active": self.active, "pipe_dir": self.pipe_dir, "started": self.started,
                "detail": self.detail}


def control_binary() -> str | None:
    """The path of nvidia-cuda-mps-control on PATH, or None."""
    return shutil.which(CONTROL)


def _env(pipe_dir: Path) -> dict[str, str]:
    return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(log_dir(pipe_dir))}


def log_dir(pipe_dir: Path) -> Path:
    """Where the control daemon infermux starts writes its log (beside its pipes)."""
    return pipe_dir.parent / (pipe_dir.name + "-log")


def ask(binary: str, pipe_dir: Path, command: str) -> str | None:
    """Send one command to the control daemon of `pipe_dir`; its answer, or None if none answers."""
    try:
        r = subprocess.run([binary], input=command + "\n", capture_output=True, text=True, env=_env(pipe_dir),
                           timeout=ASK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    answer = (r.stdout + r.stderr).strip()
    # Without a control daemon the tool says so; not every driver release exits non-zero then.
    return None if r.returncode != 0 or NOT_RUNNING in answer else r.stdout.strip()


def probe(mode: str, pipe_dir: Path) -> MpsState:
    """What `mode` would give now, starting nothing (`infermux doctor`, and "auto")."""
    if mode == "off":
        return MpsState(mode, False, str(pipe_dir), False, "off ([daemon] mps)")
    binary = control_binary()
    if binary is None:
        return MpsState(mode, False, str(pipe_dir), False, f"{CONTROL} not found on PATH (MPS needs a discrete "
                        f"GPU and the NVIDIA driver's utilities)")
    if ask(binary, pipe_dir, "get_server_list") is None:
        return MpsState(mode, False, str(pipe_dir), False, f"no MPS control daemon answers in {pipe_dir}")
    return MpsState(mode, True, str(pipe_dir), False, f"joined the control daemon in {pipe_dir}")


def start(pipe_dir: Path) -> MpsState:
    """`nvidia-cuda-mps-control -d` for `pipe_dir`, then check that it answers; raises MpsUnavailable."""
    binary = control_binary()
    if binary is None:
        raise MpsUnavailable(f'[daemon] mps = "on" but {CONTROL} is not on PATH: install the NVIDIA driver\'s '
                             f'utilities, or set mps = "auto"')
    for folder in (pipe_dir, log_dir(pipe_dir)):
        folder.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run([binary, "-d"], capture_output=True, text=True, env=_env(pipe_dir),
                           timeout=ASK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpsUnavailable(f"{CONTROL} -d failed: {exc}") from None
    if r.returncode != 0 or ask(binary, pipe_dir, "get_server_list") is None:
        why = (r.stderr or r.stdout).strip() or f"exit code {r.returncode}"
        raise MpsUnavailable(f"{CONTROL} -d started no control daemon in {pipe_dir}: {why} "
                             f"(see {log_dir(pipe_dir)}/control.log)")
    return MpsState("on", True, str(pipe_dir), True, f"started the control daemon in {pipe_dir}")


class Mps:
    """The daemon's MPS: decided on the first worker start, redone when the configuration changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: MpsState | None = None
        self._key: tuple[str, Path] | None = None
        self._decided = 0.0
        self._started: list[Path] = []  # control daemons infermux started: quit at close, not before

    def state(self, mode: str, pipe_dir: Path) -> MpsState:
        """The state for these settings (joining or starting the control daemon the first time)."""
        with self._lock:
            stale = self._state is not None and not self._state.active and mode != "off" \
                and time.monotonic() - self._decided > RETRY_S
            if self._state is None or self._key != (mode, pipe_dir) or stale:
                # A control daemon started before a reload stays: workers started then still use it.
                self._state, self._key = self._decide(mode, pipe_dir), (mode, pipe_dir)
                self._decided = time.monotonic()
                if self._state.started:
                    self._started.append(pipe_dir)
            return self._state

    def refused(self, mode: str) -> bool:
        """`mode` is "on" and MPS could not be had within the last RETRY_S: start no spare meanwhile
        (it would fail again at once, and again on every turn of the workers' watcher)."""
        state = self._state
        return mode == "on" and state is not None and not state.active and time.monotonic() - self._decided <= RETRY_S

    def view(self, mode: str) -> dict[str, Any]:
        """For the admin `status` reply: what the last worker start found under the configured `mode`."""
        state = self._state
        if state is None or state.mode != mode:
            detail = "off ([daemon] mps)" if mode == "off" else "decided when the first cold worker starts"
            return {"mode": mode, "active": False, "pipe_dir": "", "started": False, "detail": detail}
        return state.info()

    def environment(self, mode: str, pipe_dir: Path, percentage: int) -> dict[str, str]:
        """The variables a worker starts with: none when MPS is not active; raises MpsUnavailable for "on"."""
        state = self.state(mode, pipe_dir)
        if not state.active:
            if mode == "on":
                raise MpsUnavailable(state.detail)
            return {}
        env = {"CUDA_MPS_PIPE_DIRECTORY": state.pipe_dir}  # a client needs only the pipes
        if percentage:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percentage)
        return env

    def close(self) -> None:
        """Quit the control daemons infermux started (the workers are gone by now)."""
        binary = control_binary()
        with self._lock:
            started, self._started = self._started, []
        for pipe_dir in started:
            if binary is not None:
                ask(binary, pipe_dir, "quit")

    def _decide(self, mode: str, pipe_dir: Path) -> MpsState:
        found = probe(mode, pipe_dir)
        if found.active or mode != "on":
            return found
        try:
            return start(pipe_dir)
        except MpsUnavailable as exc:
            return MpsState(mode, False, str(pipe_dir), False, str(exc))
