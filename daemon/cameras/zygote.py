"""The cameras' zygote: `python -m infermux.cameras.zygote`, started by the daemon (cameras/forkserver.py).

It imports once what a camera process needs (cameras/child.py, with numpy and ZeroMQ; PyAV and, where
installed, OpenCV for the motion gate), then forks a camera process for each request on its control
socket: a restarted camera starts decoding without paying for those imports again. It runs nothing else:
no thread of its own, no ZeroMQ context, no camera, so each fork starts clean (the idle pool threads
OpenBLAS and OpenCV start on import are not copied by a fork; those libraries start them again in the
child as they need them). Each camera process still is a process of its own, and a crash or a hang in its
decoder stays there.

It answers each request with the new pid (`{"started": pid}`, or `{"error": why}` where the fork failed),
and says `{"ended": pid, "code": exit code}` when it reaps one. It ends when the daemon's end of the
socket closes; its camera processes end by their lifelines (child.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import socket
import sys
import traceback
from typing import Any, NoReturn

from infermux.cameras import child
from infermux.cameras.forkserver import receive, send

# Imported here for every camera process to share; optional (a camera without them says why it cannot run).
PRELOAD = ("av", "cv2")


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def serve(sock: socket.socket) -> int:
    """Fork a camera process per request, report the ends of those reaped, until the socket closes."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears of each end
    try:
        while True:
            ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
            if wake_r in ready:
                while _drained(wake_r):
                    pass
                reap(sock)
            if sock.fileno() in ready:
                message, fds = receive(sock)
                if message is None:
                    return 0
                fork(sock, message, fds, (wake_r, wake_w))
    except (BrokenPipeError, ConnectionResetError):  # the daemon is gone: so is the reason to run
        return 0


def _drained(fd: int) -> bool:
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"ended": pid, "code": os.waitstatus_to_exitcode(status)})


def fork(sock: socket.socket, request: dict[str, Any], fds: list[int], wake: tuple[int, int]) -> None:
    """One camera process for `request`, its status and lifeline pipes `fds`; the pid (or why not) answered."""
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        send(sock, {"error": f"a request needs 2 file descriptors, got {len(fds)}"})
        return
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        send(sock, {"error": str(exc)[:300]})
        return
    if pid == 0:
        camera(sock, request, fds, wake)
    for fd in fds:
        os.close(fd)
    send(sock, {"started": pid})


def camera(sock: socket.socket, request: dict[str, Any], fds: list[int], wake: tuple[int, int]) -> NoReturn:
    """The forked camera process: the zygote's socket and wakeup closed, then child.py until it ends."""
    code = 1
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wake:
            os.close(fd)
        code = child.serve(request["camera"], str(request["endpoint"]), str(request["regions"]),
                           str(request["input"]), status_fd=fds[0], lifeline=fds[1])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # what a camera process started with `python -m` would print, then exit 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infermux.cameras.zygote")
    parser.add_argument("--control", type=int, required=True, help="the daemon's socket (SOCK_SEQPACKET)")
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group: the daemon stops the cameras itself (SIGTERM).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    with socket.socket(fileno=args.control) as sock:
        return serve(sock)


if __name__ == "__main__":
    sys.exit(main())
