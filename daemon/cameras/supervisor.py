"""The daemon's cameras: one process each (cameras/child.py, forked from the cameras' zygote:
cameras/forkserver.py), started, watched and restarted here (docs/architecture.md#cameras, docs/cameras.md).

One thread of the daemon, `cameras`, owns every camera process: it reads their status lines, restarts
a process that ended with capped backoff, kills one that stopped writing them for HANG_S (a decoder
hung, a SIGSTOP) and restarts it, and turns what they report into events (`camera_lost` with the
reason, `camera_back`, `camera_ended`, `camera_refused`). Nothing else waits on a camera: the admin
commands, a reload and `ctl camera NAME enable|disable` hand their change to that thread and read
what it last published.

A camera's live enabled/disabled is kept in `<state_dir>/cameras.json` (written as the state file
is, models/statefile.py) and holds across reloads and restarts until the configuration file changes
that camera's `enabled` (the file wins, as for every live change), or the camera leaves the file.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from infermux import config as cfg
from infermux.cameras.config import CameraConfig, restart_needed
from infermux.cameras.forkserver import ForkServer, Forked
from infermux.cameras.source import redact
from infermux.events import Event, EventLog
from infermux.format import exit_reason
from infermux.models.statefile import read_json, set_aside, write_json

if TYPE_CHECKING:
    from infermux.execution.streams import StreamTable

log = logging.getLogger("infermux.cameras")

HANG_S = 5.0  # a running camera process that wrote no status line this long is killed (its beat is 0.25 s; a
# loaded box may hold a healthy one back for a second or two)
START_GRACE_S = 20.0  # ... and one just started may take this long to write its first (imports, a busy box)
RESTART_FIRST_S, RESTART_CAP_S = 0.25, 2.0  # a process that ended is started again after these, doubling
STEADY_S = 10.0  # a process that ran this long before it ended starts its backoff afresh
STOP_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this
TURN_S = 0.1  # the thread's longest sleep: hangs and restarts are seen at least this often
RATE_WINDOW_S = 5.0
PUBLISH_S = 0.25  # how often what `ctl cameras` shows is made again (it reads every stream's accounting)
MAX_LINE = 64 << 10  # a status line longer than this is not the child's: the process is restarted
STATE_FILE = "cameras.json"
NO_AGES = {"p50": None, "p95": None, "p99": None}  # a camera not streaming: shown as "-", no series
STATE_FORMAT = 1
STATE_MAX_BYTES = 1 << 20
COUNTERS = ("decoded", "taken", "gated", "sent", "superseded", "served", "refused", "failed")
TOTALS = (*COUNTERS, "reconnects", "decode_ms_sum")  # a process's counters, summed over its restarts


@dataclass
class Camera:
    """One camera as the daemon holds it: its settings, its process, what it last reported."""

    config: CameraConfig
    input: str = "image"
    proc: Forked | None = None
    status_r: int = -1
    status_eof: bool = False  # the process closed its status pipe (it is ending): not selected on again
    lifeline_w: int = -1
    buffer: bytes = b""
    started: float = 0.0
    last_line: float = 0.0
    lines: int = 0
    state: str = "stopped"
    reason: str = ""
    last_error: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    carried: dict[str, float] = field(default_factory=dict)  # the counters of its processes that ended
    samples: deque[tuple[float, dict[str, Any]]] = field(default_factory=lambda: deque(maxlen=64))
    restarts: int = 0  # processes started again after one ended
    failures: int = 0  # in a row, for the backoff
    next_start: float = 0.0
    killed_for: str = ""  # why the daemon killed the process (a hang), said once it has ended
    was_streaming: bool = False  # frames flowed before it was lost: the next frames are `camera_back`
    lost: bool = False


class Host(Protocol):
    """What the cameras need of the daemon (app.py's App satisfies it)."""

    config: cfg.Config  # the one in force: a reload replaces it
    run_dir: Path
    state_dir: Path | None
    events: EventLog
    endpoints: list[str]
    streams: "StreamTable"
    on_stopping: list[Callable[[], object]]  # called once the loop stops, before the drain


class Cameras:
    """Every configured camera's process; `start` once the daemon serves, `stop` when it stops."""

    def __init__(self, server: Host) -> None:
        self.server = server
        self.events: EventLog = server.events
        self.state_path = None if server.state_dir is None else Path(server.state_dir) / STATE_FILE
        self.live: dict[str, dict[str, bool]] = self._read_live()  # name -> {"enabled": live, "file": file's}
        self.cameras: dict[str, Camera] = {}
        # Each camera's connection identity, the same for every process of it while the daemon runs: under
        # stream_keys = "bound" a key belongs to the connection that sent it, and a restarted process (a
        # crash, a hang, a reload that changed it) connects as the one before it did, so its key is its own
        # at once. Random: no other client can guess it and take the key.
        self._identities: dict[str, str] = {}
        self._asks: deque[Callable[[], None]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cameras", daemon=True)
        self._published: list[dict[str, Any]] = []
        self._next_publish = 0.0
        self._wake_r, self._wake_w = os.pipe()
        self.forks = ForkServer(self._started)
        self.events.subscribe(self._on_event)

    # -- the daemon's side ------------------------------------------------------------------------

    def start(self) -> None:
        """Start every enabled camera of the configuration, and the thread that watches them."""
        if self._thread.is_alive():
            return
        self._follow(self.server.config)  # before the thread runs: `view` lists every camera from the start
        self._publish(time.monotonic())
        self._thread.start()

    def stop(self) -> None:
        """Stop every camera process (the daemon stops): SIGTERM, SIGKILL after STOP_GRACE_S."""
        self._stop.set()
        self._poke()
        if self._thread.is_alive():
            self._thread.join(STOP_GRACE_S + 2.0)
        self._stop_all()
        self.forks.stop()

    def set_enabled(self, name: str, enabled: bool) -> dict[str, Any]:
        """`ctl camera NAME enable|disable`: live, kept in the state folder; ValueError for an unknown name."""
        camera = next((c for c in self.server.config.cameras if c.name == name), None)
        if camera is None:
            known = ", ".join(c.name for c in self.server.config.cameras) or "none configured"
            raise ValueError(f"no camera {name[:80]!r}; cameras: {known}")
        def change() -> None:  # on the thread, which alone reads and writes `live`
            if enabled == camera.enabled:
                self.live.pop(name, None)
            else:
                self.live[name] = {"enabled": enabled, "file": camera.enabled}
            self._save_live()
            self._follow(self.server.config)

        self._ask(change)
        return {"camera": name, "enabled": enabled, "file": camera.enabled}

    def view(self) -> list[dict[str, Any]]:
        """What `ctl cameras` shows: one entry per configured camera (published by the thread)."""
        return list(self._published)

    # -- the thread -----------------------------------------------------------------------------------

    def _ask(self, change: Callable[[], None]) -> None:
        self._asks.append(change)
        self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _on_event(self, event: Event) -> None:
        """A reload applied: follow the file's cameras (on the thread, never the reloader's)."""
        if event.kind == "reloaded":
            self._ask(lambda: self._follow(self.server.config))

    def _run(self) -> None:
        while not self._stop.is_set():
            while self._asks:
                self._asks.popleft()()
            ready, watching = self._wait()
            now = time.monotonic()
            for camera in list(self.cameras.values()):
                if camera.status_r in ready:
                    self._read(camera, now)
                self._check(camera, now)
            if now >= self._next_publish or not watching:
                self._next_publish = now + PUBLISH_S
                self._publish(now)

    def _wait(self) -> tuple[list[int], bool]:
        """Until a status line, the zygote's answer, a wake-up, or the next turn while there is something to
        watch; what is ready (the wake-up and the zygote's answers are taken here), and whether there was."""
        fds = [c.status_r for c in self.cameras.values() if c.status_r >= 0 and not c.status_eof]
        # With no process to watch or restart, sleep until woken (an idle daemon wakes for nothing).
        watching = fds or any(c.state == "restarting" or c.proc for c in self.cameras.values())
        zygote = [self.forks.fileno()] if self.forks.fileno() >= 0 else []
        ready, _, _ = select.select([self._wake_r, *fds, *zygote], [], [], TURN_S if watching else None)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        if zygote and zygote[0] in ready:
            self.forks.drain()  # pids of processes forked (their `camera_started`), exit codes
        return ready, bool(watching)

    def _follow(self, config: cfg.Config) -> None:
        """Make the running cameras those `config` lists and enables: only a camera added, removed,
        enabled or disabled is started or stopped, and one whose settings declared `applies=CAMERA`
        changed is restarted; the others keep running untouched."""
        self._forget_stale_live(config)
        inputs = {p.name: p.input for p in config.pipelines}
        wanted = {c.name: c for c in config.cameras}
        for name in [n for n in self.cameras if n not in wanted]:
            self._halt(self.cameras.pop(name), "removed")
        for name, conf in wanted.items():
            camera = self.cameras.get(name)
            if camera is not None and restart_needed(camera.config, conf):  # as the reload planner says
                self._halt(camera, "changed")
                camera = None
            elif camera is not None:
                camera.config = conf  # a change that applies to it as it runs (`enabled`, below)
            if camera is None:
                camera = self.cameras[name] = Camera(conf, inputs.get(conf.pipeline, "image"))
            enabled = self.live.get(name, {}).get("enabled", conf.enabled)
            if enabled and camera.state in ("stopped", "disabled"):
                camera.next_start, camera.failures = 0.0, 0
                camera.state = "starting"
                self._spawn(camera)
            elif not enabled and camera.state != "disabled":
                self._halt(camera, "disabled")
                camera.state = "disabled"

    def _spawn(self, camera: Camera) -> None:
        endpoint = self._endpoint()
        if endpoint is None:
            self._lose(camera, "the daemon listens on no ipc:// endpoint a camera process can use")
            camera.next_start = time.monotonic() + RESTART_CAP_S
            return
        regions = cfg.regions_path(self.server.config.daemon, self.server.run_dir)
        status_r, status_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        os.set_blocking(status_r, False)
        try:
            # The settings go over the zygote's socket, not on a command line, which every local user may
            # read: a URL can hold the camera's password.
            identity = self._identities.setdefault(camera.config.name, secrets.token_hex(16))
            request = {"camera": {**camera.config.as_json(), "identity": identity}, "endpoint": endpoint,
                       "regions": str(regions or ""), "input": camera.input}
            camera.proc = self.forks.start(request, (status_w, lifeline_r), camera.config.name)
        except OSError as exc:  # the zygote cannot be started, or ended as it was asked
            for fd in (status_r, lifeline_w):
                os.close(fd)
            self._lose(camera, f"cannot start its process: {exc}")
            camera.next_start = time.monotonic() + RESTART_CAP_S
            return
        finally:
            os.close(status_w)
            os.close(lifeline_r)
        camera.status_r, camera.lifeline_w, camera.status_eof = status_r, lifeline_w, False
        camera.started = camera.last_line = time.monotonic()
        camera.lines, camera.buffer, camera.killed_for = 0, b"", ""

    def _started(self, forked: Forked) -> None:
        """The zygote forked a camera's process (on this thread: `ForkServer.drain`)."""
        camera = self.cameras.get(forked.tag)
        if camera is not None and camera.proc is forked:
            self.events.emit("camera_started", camera=forked.tag, pid=forked.pid, url=_redacted(camera.config.url))

    def _endpoint(self) -> str | None:
        for endpoint in self.server.endpoints:
            if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
                return endpoint
        return None

    def _read(self, camera: Camera, now: float) -> None:
        try:
            chunk = os.read(camera.status_r, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the process closed its end: it is ending, `_check` sees it (the zygote says how)
            camera.status_eof = True
            return
        camera.buffer += chunk
        *lines, camera.buffer = camera.buffer.split(b"\n")
        if len(camera.buffer) > MAX_LINE:
            self._kill(camera, "its status line is garbled")
            return
        for line in lines:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict):
                camera.last_line, camera.lines = now, camera.lines + 1
                self._take(camera, report, now)

    def _take(self, camera: Camera, report: dict[str, Any], now: float) -> None:
        """A status line: its counters, and an event where the state changed."""
        camera.report = report
        camera.samples.append((now, {k: report.get(k, 0) for k in COUNTERS}))
        camera.last_error = str(report.get("last_error") or camera.last_error)[:300]
        state, reason = str(report.get("state", "")), str(report.get("reason", ""))[:300]
        if (state, reason) == (camera.state, camera.reason):
            return
        camera.state, camera.reason = state, reason
        name = camera.config.name
        if state == "streaming":
            camera.failures = 0
            if camera.lost:
                self.events.emit("camera_back", camera=name)
            else:
                self.events.emit("camera_streaming", camera=name)
            camera.lost, camera.was_streaming = False, True
        elif state == "lost":
            self._lose(camera, reason)
        elif state == "refused":
            camera.lost = True
            camera.last_error = reason
            self.events.emit("camera_refused", camera=name, reason=reason)
        elif state == "ended":
            self.events.emit("camera_ended", camera=name, reason=reason)

    def _lose(self, camera: Camera, reason: str) -> None:
        camera.last_error = reason
        if not camera.lost:
            camera.lost = True
            self.events.emit("camera_lost", camera=camera.config.name, reason=reason)

    def _check(self, camera: Camera, now: float) -> None:
        """A process that ended is restarted (unless its file ended); one silent too long is killed."""
        proc = camera.proc
        if proc is None:
            if camera.state == "restarting" and now >= camera.next_start:
                self._spawn(camera)
            return
        code = proc.poll()
        if code is None:
            bound = START_GRACE_S if camera.lines == 0 else HANG_S
            if now - camera.last_line > bound:
                self._kill(camera, f"sent no status for {bound:.0f} s (hung)")
            return
        self._reap(camera)
        if code == 0 and camera.state == "ended":
            return
        why = camera.killed_for or f"its process ended ({exit_reason(code)})"
        self._lose(camera, why)
        camera.failures = 0 if now - camera.started > STEADY_S else camera.failures + 1
        camera.restarts += 1
        camera.state = "restarting"
        camera.next_start = now + min(RESTART_CAP_S, RESTART_FIRST_S * 2 ** max(0, camera.failures - 1))

    def _kill(self, camera: Camera, why: str) -> None:
        if camera.proc is not None and camera.proc.poll() is None:
            camera.killed_for = f"killed: {why}"
            camera.proc.kill()

    def _reap(self, camera: Camera) -> None:
        if camera.proc is not None:
            camera.proc.wait()
            # Its counts go on in `carried`, so that the camera's totals never go back (Prometheus' counters).
            camera.carried = {k: camera.carried.get(k, 0) + camera.report.get(k, 0) for k in TOTALS}
            camera.report = {}
            camera.samples.clear()
        for fd in (camera.status_r, camera.lifeline_w):
            if fd >= 0:
                os.close(fd)
        camera.proc, camera.status_r, camera.lifeline_w = None, -1, -1

    def _halt(self, camera: Camera, why: str) -> None:
        """Stop a camera's process for good (removed, changed, disabled, the daemon stops)."""
        proc = camera.proc
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
            self._reap(camera)
            self.events.emit("camera_stopped", camera=camera.config.name, reason=why)
        camera.state = "stopped"

    def _stop_all(self) -> None:
        procs = [c.proc for c in self.cameras.values() if c.proc is not None and c.proc.poll() is None]
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        for camera in self.cameras.values():
            self._reap(camera)

    # -- what is shown ----------------------------------------------------------------------------

    def _publish(self, now: float) -> None:
        pipelines = {c.config.pipeline for c in self.cameras.values()}
        streams = {(s["model"], s["key"]): s for p in pipelines for s in self.server.streams.view(p)}
        out = []
        for name, camera in self.cameras.items():
            stream = streams.get((camera.config.pipeline, name), {})
            report = {k: camera.carried.get(k, 0) + camera.report.get(k, 0) for k in TOTALS}
            decoded = report["decoded"]
            out.append({
                "camera": name, "url": _redacted(camera.config.url), "pipeline": camera.config.pipeline,
                "state": camera.state, "reason": camera.reason, "enabled": camera.state != "disabled",
                "fps": camera.config.fps,
                "pid": camera.proc.pid if camera.proc is not None else None,
                **{f"fps_{k}": v for k, v in _rates(camera.samples, now).items()},
                **{k: report[k] for k in COUNTERS},
                "superseded_daemon": stream.get("superseded", 0),
                "decode_ms": round(report["decode_ms_sum"] / decoded, 3) if decoded else None,
                "decode_seconds_total": round(report["decode_ms_sum"] / 1e3, 6),
                # A camera that is not streaming has no current age: its stream's ring holds frames of before.
                "capture_age_ms": stream.get("capture_age_ms", NO_AGES) if camera.state == "streaming" else NO_AGES,
                "reconnects": report["reconnects"], "restarts": camera.restarts,
                "last_error": camera.last_error,
            })
        self._published = out

    # -- live enabled/disabled ----------------------------------------------------------------------

    def _forget_stale_live(self, config: cfg.Config) -> None:
        """A live enable/disable holds until the file changes that camera's `enabled`, or drops it."""
        files = {c.name: c.enabled for c in config.cameras}
        stale = [n for n, v in self.live.items() if files.get(n) != v["file"]]
        for name in stale:
            del self.live[name]
            self.events.emit("override_dropped", camera=name, field="enabled",
                             reason="the file changed it" if name in files else "the camera left the file")
        if stale:
            self._save_live()

    def _read_live(self) -> dict[str, dict[str, bool]]:
        if self.state_path is None:
            return {}
        try:
            data = read_json(self.state_path, STATE_MAX_BYTES, "a cameras state file")
            if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
                raise ValueError(f"not a format {STATE_FORMAT} cameras state file")
            entries = data.get("cameras")
            if not isinstance(entries, dict) or not all(
                    isinstance(v, dict) and isinstance(v.get("enabled"), bool) and isinstance(v.get("file"), bool)
                    for v in entries.values()):
                raise ValueError("'cameras' is not an object of {\"enabled\": bool, \"file\": bool}")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            set_aside(self.state_path, exc, self.events, "cameras state file", "camera enable or disable",
                      "every camera starts as the configuration says")
            return {}
        return {str(k): {"enabled": v["enabled"], "file": v["file"]} for k, v in entries.items()}

    def _save_live(self) -> None:
        if self.state_path is None:
            return
        try:
            write_json(self.state_path, {"format": STATE_FORMAT, "cameras": self.live})
        except OSError as exc:
            self.events.emit("state_not_saved", file=str(self.state_path), reason=str(exc)[:200])


def _rates(samples: deque[tuple[float, dict[str, Any]]], now: float) -> dict[str, float]:
    """Per second over the last RATE_WINDOW_S, from the counters' first and last sample in it."""
    recent = [s for s in samples if now - s[0] <= RATE_WINDOW_S]
    if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
        return {k: 0.0 for k in COUNTERS}
    span = recent[-1][0] - recent[0][0]
    return {k: round((recent[-1][1].get(k, 0) - recent[0][1].get(k, 0)) / span, 2) for k in COUNTERS}


def _redacted(url: str) -> str:
    return redact(url)


def attach(server: Host) -> Cameras:
    """The daemon's cameras, stopped when its loop stops (before the drain)."""
    cameras = Cameras(server)
    server.on_stopping.append(cameras.stop)
    return cameras
