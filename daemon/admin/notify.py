"""sd_notify, written out: tell systemd how the daemon is doing.

The protocol is one datagram of newline-separated ``KEY=VALUE`` lines sent
to the AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` means
the Linux abstract namespace). Without the variable every call is a no-op,
so the daemon runs the same from a shell, a test or a container.

    notify = Notifier(unset_environment=True)
    notify.status("loading 2 models")
    notify.extend_timeout(60_000_000)   # a slow engine: keep systemd waiting
    notify.ready("serving 2 models")
    # from the main loop, every notify.watchdog_interval_s() seconds:
    notify.watchdog()
    # on SIGHUP:  notify.reloading(), reload, notify.ready()
    # on SIGTERM: notify.stopping(), drain, exit 0

Errors are swallowed (each call returns whether the datagram went out):
losing a status line must never take the daemon down.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Mapping

__all__ = ["Notifier"]

_ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _address(value: str | None) -> str | bytes | None:
    """The socket address for $NOTIFY_SOCKET, or None when it is unusable."""
    if not value:
        return None
    if value.startswith("@"):
        # Abstract namespace: the kernel name starts with a NUL byte.
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # e.g. "vsock:CID:PORT" (systemd >= 253): not spoken here


class Notifier:
    """A thread-safe sd_notify sender; every method is a no-op without $NOTIFY_SOCKET.

    ``environ`` defaults to ``os.environ`` and is read once, here. With
    ``unset_environment=True`` the three variables are removed from
    ``os.environ`` afterwards, so worker processes the daemon starts do not
    inherit them (systemd would log every message they sent as foreign
    under ``NotifyAccess=main``).

    A send waits at most ``send_timeout_s``: a unix datagram queue holds only
    a few messages (net.unix.max_dgram_qlen, 10 by default), and a listener
    that stopped reading must not wedge the thread that feeds the watchdog.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, *,
                 unset_environment: bool = False, send_timeout_s: float = 1.0) -> None:
        env = os.environ if environ is None else environ
        self._address = _address(env.get("NOTIFY_SOCKET"))
        self._watchdog_usec = env.get("WATCHDOG_USEC")
        self._watchdog_pid = env.get("WATCHDOG_PID")
        self._pid = os.getpid()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timeout = send_timeout_s
        if unset_environment:
            for key in _ENV_KEYS:
                os.environ.pop(key, None)

    @property
    def enabled(self) -> bool:
        """True when a notification socket is configured."""
        return self._address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` assignments as one datagram; True if it was sent."""
        if self._address is None or not assignments:
            return False
        payload = "\n".join(assignments).encode()
        with self._lock:  # the socket is created lazily and shared by threads
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                    self._sock.settimeout(self._timeout)
                self._sock.sendto(payload, self._address)
                return True
            except OSError:  # includes the timeout
                return False

    def ready(self, status: str | None = None) -> bool:
        """READY=1 (startup or reload finished), optionally with a STATUS line."""
        if status is None:
            return self.notify("READY=1")
        return self.notify("READY=1", _status(status))

    def status(self, text: str) -> bool:
        """STATUS=<text>: the one-line state `systemctl status` shows."""
        return self.notify(_status(text))

    def watchdog(self) -> bool:
        """WATCHDOG=1: the main loop is still turning."""
        return self.notify("WATCHDOG=1")

    def extend_timeout(self, usec: int) -> bool:
        """EXTEND_TIMEOUT_USEC: ask for ``usec`` more (start, reload or stop) from now."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(usec)}")

    def reloading(self) -> bool:
        """RELOADING=1 with MONOTONIC_USEC, as systemd >= 253 requires for reload ordering.

        systemd 252 ignores MONOTONIC_USEC; sending it anyway keeps the
        daemon right on newer hosts (and with ``Type=notify-reload``).
        """
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> bool:
        """STOPPING=1: shutdown has begun (requests are being drained)."""
        return self.notify("STOPPING=1")

    def watchdog_interval_s(self) -> float | None:
        """How often to call watchdog(): half of $WATCHDOG_USEC, in seconds.

        None when the watchdog is off, the value is not a positive integer,
        or $WATCHDOG_PID names another process (the variables leaked to a
        child: the watchdog is not ours to feed).
        """
        if self._watchdog_pid:
            try:
                if int(self._watchdog_pid) != self._pid:
                    return None
            except ValueError:
                return None
        try:
            usec = int(self._watchdog_usec or "")
        except ValueError:
            return None
        return usec / 2 / 1e6 if usec > 0 else None

    def close(self) -> None:
        """Close the socket (later calls reopen it)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _status(text: str) -> str:
    # A newline would start a new assignment: keep STATUS to one line.
    return "STATUS=" + " ".join(str(text).splitlines())
