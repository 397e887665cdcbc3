"""Camera processes forked from the cameras' zygote (cameras/zygote.py), not started as new interpreters.

A camera process started with `python -m` spends most of its first half second of CPU importing Python,
numpy, PyAV and ZeroMQ; a camera that crashes again and again pays it on every restart, taken from the
models the daemon serves (docs/decisions.md, "A camera's process is forked from a zygote"). The zygote
imports all that once, then forks a camera process on each request: a restart costs a fork.

`ForkServer` is the daemon's side, used by the cameras' thread alone: `start` sends a request (the
camera's settings, and its status and lifeline pipes as file descriptors) and returns a `Forked` at once,
without waiting for the zygote (which may still be importing); the zygote answers each request, in order,
with the new process's pid, and says when one of its processes ended and how. `Forked` offers what the
supervisor used of a `subprocess.Popen`: pid (None until the zygote answered), poll, kill, terminate and
wait. A zygote that ends (killed) takes its processes with it: the daemon SIGKILLs them, reports them
ended, and the next `start` starts another zygote.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from typing import Any, Callable

MAX_MESSAGE = 1 << 20  # a request (a camera's settings: a few KB) or an answer, at most
FDS = 2  # a request's file descriptors: the camera's status pipe (write end) and lifeline (read end)
STOP_S = 1.0  # the zygote, its socket closed, ends at once; after this it is killed


def send(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    """One message (a JSON object) on the zygote's socket, with `fds` passed along."""
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the file descriptors that came with it; (None, []) at the end of the socket."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, FDS)
    if not data:
        return None, fds
    message = json.loads(data)
    return (message if isinstance(message, dict) else {}), fds


class Forked:
    """One camera process the zygote forked (or was asked to): a Popen's pid, poll, kill, terminate, wait."""

    def __init__(self, server: ForkServer, tag: str) -> None:
        self.server, self.tag = server, tag
        self.pid: int | None = None  # known once the zygote answered
        self.returncode: int | None = None  # as Popen's: negative for a signal
        self._signal_on_start = 0  # asked to be signalled before its pid was known

    def poll(self) -> int | None:
        """Its exit code once the zygote said it ended, else None."""
        if self.returncode is None:
            self.server.drain()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the process (once it is forked); nothing once it ended."""
        if self.poll() is not None:
            return
        if self.pid is None:
            self._signal_on_start = sig
            return
        try:
            os.kill(self.pid, sig)  # not reaped yet: the zygote says when it reaps, and `poll` read that first
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; subprocess.TimeoutExpired after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"camera {self.tag}", timeout or 0.0)
            self.server.wait_readable(left)
        assert self.returncode is not None
        return self.returncode

    def started(self, pid: int) -> None:
        self.pid = pid
        if self._signal_on_start:
            self.send_signal(self._signal_on_start)


class ForkServer:
    """The daemon's side of the zygote: starts it when a camera is first started, asks it for processes."""

    def __init__(self, on_started: Callable[[Forked], None]) -> None:
        self.on_started = on_started  # a process's pid became known (the `camera_started` event)
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.pending: deque[Forked] = deque()  # asked for, in order; the zygote answers in that order
        self.children: dict[int, Forked] = {}

    def fileno(self) -> int:
        """The socket to select on for the zygote's answers (-1 when no zygote runs)."""
        return self.sock.fileno() if self.sock is not None else -1

    def start(self, request: dict[str, Any], fds: tuple[int, int], tag: str) -> Forked:
        """Ask for a camera process (`request`: child.serve's settings); OSError where the zygote cannot
        be started or asked. The caller may close its copies of `fds` once this returns."""
        if self.sock is None:
            self._start_zygote()
        assert self.sock is not None
        try:
            send(self.sock, request, fds)
        except OSError:
            self._lost()
            raise
        forked = Forked(self, tag)
        self.pending.append(forked)
        return forked

    def _start_zygote(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infermux.cameras.zygote", "--control", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours

    def drain(self) -> None:
        """Read every answer the zygote has sent: pids of processes forked, exit codes of processes ended."""
        while self.sock is not None:
            try:
                message, fds = receive(self.sock)
            except BlockingIOError:
                return
            except (OSError, ValueError, UnicodeDecodeError):  # a broken socket, a garbled answer: it is done
                message, fds = None, []
            for fd in fds:  # the zygote sends none: never keep one
                os.close(fd)
            if message is None:
                self._lost()
                return
            self._take(message)

    def _take(self, message: dict[str, Any]) -> None:
        if "started" in message or "error" in message:
            if not self.pending:
                return
            forked = self.pending.popleft()
            if "error" in message:  # the fork failed (no memory, too many processes)
                forked.returncode = 1
                return
            pid = int(message["started"])
            self.children[pid] = forked
            forked.started(pid)
            self.on_started(forked)
        elif "ended" in message:
            ended = self.children.pop(int(message["ended"]), None)
            if ended is not None:
                ended.returncode = int(message.get("code", 1))

    def wait_readable(self, timeout: float | None) -> None:
        """Until the zygote says something (or `timeout` passes)."""
        if self.sock is not None:
            select.select([self.sock], [], [], timeout)

    def _lost(self) -> None:
        """The zygote ended, or its socket broke."""
        self.stop()

    def stop(self) -> None:
        """End the zygote. A process of it still running would run unwatched: it is SIGKILLed and reported
        ended (the daemon stops its cameras before, and they end by their lifelines anyway)."""
        for forked in list(self.children.values()):
            if forked.pid is not None:
                try:
                    os.kill(forked.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            forked.returncode = -signal.SIGKILL
        for forked in self.pending:
            forked.returncode = 1  # never forked
        self.children.clear()
        self.pending.clear()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
