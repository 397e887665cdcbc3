"""One worker process as the daemon holds it: the child, its pipes, its lifeline.

The daemon binds both pipes in its runtime directory before it starts the
child (`python -m infermux.workers.child`, never a fork), so a worker that dies
leaves nothing bound. Its exit is seen at once through a pidfd; the worker
sees the daemon's death through the lifeline pipe, whose write end only the
daemon holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping, TypeVar, cast

import zmq

from infermux.format import exit_reason
from infermux.transport import ipc
from infermux.workers import wire as wire
from infermux.execution.inline import InlinePolicy
from infermux.workers.lane import Lane
from infermux.workers.slots import pid_alive

M = TypeVar("M", bound=wire.Message)


class WorkerExited(Exception):
    """The worker process ended while the daemon waited for it."""


def read_rss(pid: int) -> int:
    """Resident memory of `pid` in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class WorkerProcess:
    """A started worker: `send` from any thread; `recv`/`wait_for` from one thread at a time.

    `lane` (lane.py) carries requests and replies. Whoever reads it takes it
    (`take_lane`) and closes it once it reports the worker's end, so that no
    poll ever sees a closed fd; `close` closes it only if nobody took it."""

    def __init__(self, ctx: zmq.Context, run_dir: Path, wid: int, preload: list[str], heartbeat_s: float,
                 inline: InlinePolicy, log_level: str = "info", env: Mapping[str, str] | None = None) -> None:
        self.wid = wid
        self.env = dict(env or {})  # on top of the daemon's: the MPS client variables (mps.py)
        self.tag = f"w{os.getpid()}-{wid}"
        self.down_endpoint = f"ipc://{run_dir / (self.tag + '.d')}"
        self.up_endpoint = f"ipc://{run_dir / (self.tag + '.u')}"
        self.started = time.monotonic()
        self.hello = wire.Hello(0, 0)  # until the worker says it (pool.py)
        self._send_lock = threading.Lock()
        ipc.prepare(self.down_endpoint)
        self.down = ctx.socket(zmq.PUSH)
        self.down.setsockopt(zmq.LINGER, 0)
        self.down.setsockopt(zmq.SNDHWM, 100_000)  # never blocks: in flight is bounded by max_queue
        self.up = ctx.socket(zmq.PULL)
        self.up.setsockopt(zmq.LINGER, 0)
        with ipc.private_files():  # only the daemon's user may talk to its workers, from the bind on
            self.down.bind(self.down_endpoint)
            self.up.bind(self.up_endpoint)
        for endpoint in (self.down_endpoint, self.up_endpoint):
            ipc.bound(endpoint)  # this daemon's own files: the only ones it removes
        read_end, self._lifeline = os.pipe()
        lane, theirs = Lane.pair()
        self.lane: Lane | None = lane
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infermux.workers.child", "--id", str(wid), "--down", self.down_endpoint,
                 "--up", self.up_endpoint, "--lifeline", str(read_end), "--lane", str(theirs.fileno()),
                 "--preload", ",".join(preload), "--heartbeat-s", str(heartbeat_s),
                 "--inline-max-us", str(inline.idle_max_us), "--inline-busy-max-us", str(inline.busy_max_us),
                 "--log-level", log_level],
                pass_fds=(read_end, theirs.fileno()), stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env} if self.env else None)
        except BaseException:
            os.close(self._lifeline)
            lane.close()
            self._close_sockets()
            raise
        finally:
            os.close(read_end)
            theirs.close()
        self.pid = self.proc.pid
        try:
            self.pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # kernels before 5.3: poll the exit status instead
            self.pidfd = None

    # -- messages -------------------------------------------------------------------

    def send(self, frames: list[Any], copy: bool = True, wait_s: float = 0.0) -> bool:
        """Queue a message to the worker; False if it cannot take it (gone, or not connected
        within `wait_s`: a PUSH without a peer refuses)."""
        with self._send_lock:
            try:
                if wait_s and not self.down.poll(int(wait_s * 1000), zmq.POLLOUT):
                    return False
                self.down.send_multipart(frames, flags=zmq.NOBLOCK, copy=copy)
                return True
            except (zmq.Again, zmq.ZMQError):
                return False

    def wait_for(self, *kinds: type[M], timeout_s: float) -> M:
        """The next message of one of `kinds` (others are skipped); raises WorkerExited, TimeoutError,
        or wire.MalformedMessage if it does not decode."""
        wanted = {kind.KIND for kind in kinds}
        deadline = time.monotonic() + timeout_s
        poller = zmq.Poller()
        poller.register(self.up, zmq.POLLIN)
        if self.pidfd is not None:
            poller.register(self.pidfd, zmq.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"worker {self.pid} did not answer within {timeout_s:.0f} s")
            events = dict(poller.poll(min(100, int(left * 1000) + 1)))
            if self.up in events:
                frames = self.up.recv_multipart()
                if wire.kind_of(frames[0]) in wanted:
                    return cast(M, wire.decode(frames[0]))
                continue
            if self.exited():
                raise WorkerExited(f"worker {self.pid} ended ({exit_reason(self.proc.poll())})")

    def take_lane(self) -> Lane:
        """The lane, now the caller's to read and to close."""
        lane, self.lane = self.lane, None
        assert lane is not None, "the lane was taken already"
        return lane

    # -- life -------------------------------------------------------------------------

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def reason(self) -> str:
        """How the child ended. Its pipes close a moment before the kernel records its exit,
        so a crash seen on a pipe waits briefly for the status instead of saying 'running'."""
        try:
            return exit_reason(self.proc.wait(timeout=0.2))
        except subprocess.TimeoutExpired:
            return exit_reason(None)

    def rss(self) -> int:
        return read_rss(self.pid)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 5.0) -> str:
        """Ask the worker to exit (EXIT, then the lifeline), kill it after `grace_s`; returns how it ended."""
        if self.proc.poll() is None:
            self.send([wire.Exit().encode()])
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
                self.proc.wait()
        return self.reason()

    def close(self) -> None:
        """Release the daemon's side: pipes, socket files, lifeline, pidfd (the process must be gone)."""
        if self.proc.poll() is None:
            self.kill()
        self.proc.wait()
        self._close_sockets()
        if self.lane is not None:
            self.lane.close()
            self.lane = None
        for fd in (self._lifeline, self.pidfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._lifeline, self.pidfd = -1, None

    def _close_sockets(self) -> None:
        with self._send_lock:  # no `send` may be inside the socket while it closes
            self.down.close(0)
        self.up.close(0)
        ipc.remove(self.down_endpoint)
        ipc.remove(self.up_endpoint)


def sweep_sockets(run_dir: Path) -> None:
    """Remove pipe files of workers whose daemon was killed (`w<pid>-<id>.d|.u`)."""
    try:
        entries = list(run_dir.iterdir())
    except OSError:
        return
    for path in entries:
        name = path.name
        if name.startswith("w") and name.endswith((".d", ".u")) and "-" in name:
            pid = name[1:].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                path.unlink(missing_ok=True)
