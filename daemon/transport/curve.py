"""CURVE for tcp:// listeners (docs/security.md).

ipc sockets are guarded by file permissions; a TCP port is not, so a tcp://
listener encrypts and authenticates with CURVE: the daemon holds a secret
key, and only clients whose public key sits in `curve_authorized_dir` get
through the handshake. The check is a ZAP handler (pyzmq's
ThreadAuthenticator) on the daemon's own zmq Context: ZAP handlers serve
the sockets of the context they run in, and without one libzmq lets every
CURVE client in, so it is started before anything binds.

Socket options are copied into a listener when it binds, so one ROUTER can
serve ipc:// without CURVE and tcp:// with it: `secure_listener` switches the
options before each bind.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from infermux.config import DaemonConfig
from infermux.events import EventLog

log = logging.getLogger("infermux.curve")

SECRET_SUFFIX = ".key_secret"
PUBLIC_SUFFIX = ".key"
SERVER_NAME = "server"
# A scanner with fresh keys must not flood the journal: the first few refused keys of each
# minute get a line each, the rest one summary line with their count at the minute's end.
_LOG_EVERY_S = 60.0
_LOG_FIRST = 5


class CurveError(RuntimeError):
    """Key files missing, unreadable, or not what they should be."""


def load_keypair(secret_file: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a `.key_secret` file made by `infermux keygen`."""
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
    except (OSError, ValueError) as exc:
        raise CurveError(f"cannot read CURVE key {secret_file}: {exc}") from None
    if not secret:
        raise CurveError(f"{secret_file} holds no secret key (give the {SECRET_SUFFIX} file, not the {PUBLIC_SUFFIX})")
    return public, secret


def load_public(public_file: Path) -> bytes:
    """The public key in a `.key` (or `.key_secret`) file."""
    try:
        public, _ = zmq.auth.load_certificate(public_file)
    except (OSError, ValueError) as exc:
        raise CurveError(f"cannot read CURVE public key {public_file}: {exc}") from None
    return public


class RefusalLog:
    """Refused CURVE keys, logged at most `first` a line each per interval, then counted.

    The ZAP callback calls `refused`; a timer writes the interval's summary
    line, so the count is told even when the scan stops.
    """

    def __init__(self, where: Path, interval_s: float = _LOG_EVERY_S, first: int = _LOG_FIRST) -> None:
        self.where, self.interval_s, self.first = where, interval_s, first
        self._lock = threading.Lock()
        self._since = -interval_s  # monotonic start of the current interval
        self._named: set[bytes] = set()  # keys given a line of their own this interval
        self._counted = 0  # refusals not named this interval
        self._timer: threading.Timer | None = None

    def refused(self, key: bytes) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._since >= self.interval_s and self._timer is None:
                self._since, self._named = now, set()
            if key not in self._named and len(self._named) < self.first:
                self._named.add(key)
                log.warning("refused CURVE client key %s: not in %s", key.decode("ascii", "replace"), self.where)
                return
            self._counted += 1
            if self._timer is None:
                self._timer = threading.Timer(max(0.0, self._since + self.interval_s - now), self.summary)
                self._timer.daemon = True
                self._timer.start()

    def summary(self) -> None:
        """Log how many refusals were not named this interval (the timer, and `stop`)."""
        with self._lock:
            counted, self._counted = self._counted, 0
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None
        if counted:
            log.warning("refused %d more CURVE connection(s) in the last %.0f s with keys not in %s "
                        "(the first %d keys of each interval are named)", counted, self.interval_s,
                        self.where, self.first)


class CurveGuard:
    """The daemon's side: its keypair, the authorised client keys, and the ZAP handler."""

    def __init__(self, context: zmq.Context, secret_key: Path, authorized_dir: Path, events: EventLog) -> None:
        self.secret_key = secret_key
        self.public, self.secret = b"", b""
        self.authorized_dir = authorized_dir
        self._events = events
        self._ctx = context
        self._keys: frozenset[bytes] = frozenset()
        self.refusals = RefusalLog(authorized_dir)
        self._auth: ThreadAuthenticator | None = None

    @classmethod
    def from_config(cls, daemon: DaemonConfig, context: zmq.Context, events: EventLog) -> "CurveGuard | None":
        if daemon.curve_secret_key is None or daemon.curve_authorized_dir is None:
            return None
        return cls(context, daemon.curve_secret_key, daemon.curve_authorized_dir, events)

    def start(self) -> None:
        """Load the authorised keys and start the ZAP handler (before any bind)."""
        if not zmq.has("curve"):
            raise CurveError("this libzmq was built without CURVE support")
        self.public, self.secret = load_keypair(self.secret_key)
        self.reload()
        self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("infermux.curve.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self)

    def reload(self) -> int:
        """Read `authorized_dir` again (SIGHUP, admin `reload`); returns how many keys it holds."""
        try:
            keys = zmq.auth.load_certificates(self.authorized_dir)
        except (OSError, ValueError) as exc:
            raise CurveError(f"cannot read authorised client keys in {self.authorized_dir}: {exc}") from None
        self._keys = frozenset(keys)
        self._events.emit("curve", clients=len(self._keys), authorized_dir=str(self.authorized_dir))
        return len(self._keys)

    def callback(self, domain: str, client_key: bytes) -> bool:
        """ZAP: is this (z85) client key authorised? Called on the authenticator's thread."""
        if client_key in self._keys:
            return True
        self.refusals.refused(client_key)
        return False

    def secure(self, sock: zmq.Socket, endpoint: str) -> None:
        """Set the socket's options for the next bind: CURVE server on tcp://, none elsewhere."""
        if endpoint.startswith("tcp://"):
            sock.curve_secretkey = self.secret
            sock.curve_publickey = self.public
            sock.curve_server = True
        else:
            sock.curve_server = False  # back to the NULL mechanism for ipc://

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self.refusals.summary()


def secure_listener(sock: zmq.Socket, endpoint: str, guard: CurveGuard | None, events: EventLog) -> None:
    """Prepare `sock` to bind `endpoint`: CURVE when configured, else a loud warning for tcp://."""
    if guard is not None:
        guard.secure(sock, endpoint)
    elif endpoint.startswith("tcp://"):
        # config.py lets this through only with allow_insecure_tcp = true.
        log.warning("%s has no CURVE (allow_insecure_tcp = true): anyone who can reach this port "
                    "can run models and read their results", endpoint)
        events.emit("insecure", endpoint=endpoint)


# -- the client's side ----------------------------------------------------------

def client_options(key: str | os.PathLike[str], server_key: str | os.PathLike[str] | None = None) -> dict[str, bytes]:
    """The `curve=` argument of Client/Pipeline/run_load, from key files.

    `key` is the client's `.key_secret` file, or a directory holding exactly
    one (or `client.key_secret` among several). `server_key` is the daemon's
    public key file; by default `server.key` beside the client's key.
    """
    path = Path(key).expanduser()
    secret_file = _find_secret(path) if path.is_dir() else path
    server = Path(server_key).expanduser() if server_key else secret_file.parent / f"{SERVER_NAME}{PUBLIC_SUFFIX}"
    if not server.is_file():
        raise CurveError(f"no server public key at {server}: copy the daemon's {SERVER_NAME}{PUBLIC_SUFFIX} "
                         f"there, or name it with --curve-server-key")
    public, secret = load_keypair(secret_file)
    return {"curve_serverkey": load_public(server), "curve_publickey": public, "curve_secretkey": secret}


def _find_secret(folder: Path) -> Path:
    found = sorted(p for p in folder.glob(f"*{SECRET_SUFFIX}") if p.name != f"{SERVER_NAME}{SECRET_SUFFIX}")
    if len(found) == 1:
        return found[0]
    preferred = folder / f"client{SECRET_SUFFIX}"
    if preferred in found:
        return preferred
    if not found:
        raise CurveError(f"no client {SECRET_SUFFIX} file in {folder} (make one with `infermux keygen {folder} "
                         f"--name client`)")
    raise CurveError(f"several keys in {folder} ({', '.join(p.name for p in found)}): give the file itself")


def add_arguments(parser: Any) -> None:
    """--curve-key / --curve-server-key for client commands talking to a tcp:// listener."""
    parser.add_argument("--curve-key", metavar="PATH",
                        help="CURVE: this client's .key_secret file, or a directory holding it and server.key")
    parser.add_argument("--curve-server-key", metavar="FILE",
                        help="CURVE: the daemon's public key file (default: server.key beside --curve-key)")


def options_from(args: Any) -> Mapping[str, bytes] | None:
    """The client's CURVE options from parsed arguments; None without --curve-key."""
    if not getattr(args, "curve_key", None):
        if getattr(args, "curve_server_key", None):
            raise CurveError("--curve-server-key needs --curve-key (this client's own key)")
        return None
    return client_options(args.curve_key, args.curve_server_key)
