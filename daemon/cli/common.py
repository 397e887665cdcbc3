"""What every client command shares: where the daemon's sockets are, and how a failure reaches the user.

Exit codes (docs/operating.md, "Status and control"; infermux(1)): 0 done, 1 refused or
failed (the reason is printed), 2 usage or configuration, 3 the daemon did
not answer. A failure is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from infermux.config import DaemonConfig

T = TypeVar("T")

DEFAULT_CONFIG = "/etc/infermux/infermux.toml"

USAGE = 2
NO_DAEMON = 3


class CliError(SystemExit):
    """A failure to report as one line with an exit code (a SystemExit, so library callers stop too)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = code


def add_endpoint_arguments(parser: argparse.ArgumentParser, admin: bool = False, several: bool = False) -> None:
    """--endpoint / --admin / --config / --runtime-dir.

    `admin`: the command talks to the admin socket only (`status`, `ctl`),
    so --endpoint names that socket; otherwise --endpoint is the inference
    socket and --admin the admin one (asked for a model's inputs).
    `several`: --endpoint may be given again, for a client that fails over
    between daemons (`args.more_endpoints` holds the ones after the first)."""
    if admin:
        parser.add_argument("--endpoint", "-e", "--admin", dest="endpoint", metavar="ENDPOINT",
                            help="the admin socket (default: [daemon] admin of --config)")
    else:
        parser.add_argument("--endpoint", "-e", metavar="ENDPOINT", action=_Several if several else "store",
                            help="the inference socket (default: the first [daemon] listen of --config)"
                            + ("; again for more daemons, to fail over between" if several else ""))
        parser.add_argument("--admin", metavar="ENDPOINT", help="the admin socket (default: [daemon] admin "
                            "of --config, else admin.sock beside an ipc:// --endpoint)")
    parser.add_argument("--config", "-c", help="daemon configuration to take the sockets from "
                        f"(default: $INFERMUX_CONFIG or {DEFAULT_CONFIG}, else the default sockets in the "
                        "runtime directory); only its socket paths are read")
    parser.add_argument("--runtime-dir", help="the daemon's --runtime-dir, if it was started with one")


class _Several(argparse.Action):
    """--endpoint given again: the first stays `endpoint` (admin.sock is found beside it), the others
    go to `more_endpoints`."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is None:
            setattr(namespace, self.dest, values)
        else:
            namespace.more_endpoints = [*getattr(namespace, "more_endpoints", []), values]


def endpoint_from(args: argparse.Namespace, which: str = "listen", check: bool = True) -> str:
    """The socket to talk to: `which` is "listen" (inference), "admin" or "stats".

    The flags win (--endpoint for the command's own socket, --admin for the
    admin one); else the configuration's [daemon] socket, resolved in the
    runtime directory. Raises CliError (exit 2) when there is no configuration to read, and
    (with `check`) NoDaemon when an ipc:// socket file is missing."""
    endpoint = _given_endpoint(args, which)
    if not endpoint:
        from infermux import config as cfg

        daemon = _socket_config(args)
        raw = daemon.listen[0] if which == "listen" else str(getattr(daemon, which))
        endpoint = cfg.resolve_endpoint(raw, cfg.runtime_dir(daemon, args.runtime_dir))
    from infermux.transport import ipc

    ipc.check_directory(endpoint)  # UnsafeDirectory (exit 1): a socket anyone could have put there
    if check:
        present(endpoint)
    return endpoint


class NoDaemon(TimeoutError):
    """Nothing listens where the daemon's socket should be (reported as "did not answer", exit 3)."""


def present(endpoint: str) -> None:
    """Fail at once, instead of after a timeout, when an ipc:// socket file does not exist."""
    from infermux.transport import ipc

    path = ipc.path_of(endpoint)
    if path is not None and not path.exists():
        raise NoDaemon(f"no daemon at {endpoint}: the socket does not exist (is `infermux serve` running? "
                       f"with this --config and --runtime-dir?)")


def retried(call: Callable[[], T], errors: type[Exception], wait_s: float, every_s: float = 0.1) -> T:
    """`call()`, made again every `every_s` while it raises `errors`, for up to `wait_s`; then its error."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return call()
        except errors:
            if time.monotonic() >= deadline:
                raise
            time.sleep(every_s)


def _given_endpoint(args: argparse.Namespace, which: str) -> str | None:
    """What the command line says about socket `which`, if anything."""
    endpoint = getattr(args, "endpoint", None)
    if not hasattr(args, "admin"):  # status, ctl (and top, per socket): --endpoint is the socket asked for
        return endpoint
    if which == "admin":
        if args.admin:
            return str(args.admin)
        if endpoint and endpoint.startswith("ipc://") and not args.config:
            return beside(endpoint, "admin.sock")
        return None
    return endpoint if which == "listen" else None


def beside(endpoint: str, name: str) -> str:
    """`ipc:///run/infermux/infer.sock`, "admin.sock" -> `ipc:///run/infermux/admin.sock`."""
    path = endpoint[len("ipc://"):]
    return f"ipc://{os.path.join(os.path.dirname(path), name)}"


def _socket_config(args: argparse.Namespace) -> "DaemonConfig":
    """The socket settings of the configuration the flags or the environment name (config.load_sockets)."""
    from infermux import config as cfg

    path = args.config or os.environ.get("INFERMUX_CONFIG") or DEFAULT_CONFIG
    if path == DEFAULT_CONFIG and not os.path.exists(path):
        # Not installed (a checkout): the default sockets in the default runtime directory are
        # where the sample configuration's daemon listens, as any other that keeps the defaults.
        return cfg.DaemonConfig()
    try:
        return cfg.load_sockets(path)
    except cfg.ConfigError as exc:
        if exc.reason.startswith("not valid TOML"):
            # ctl reload after a bad edit: the daemon refuses it and says where; reach it on the defaults.
            print(f"infermux: warning: {exc}; trying the default sockets", file=sys.stderr)
            return cfg.DaemonConfig()
        where = "--config" if args.config else ("$INFERMUX_CONFIG" if os.environ.get("INFERMUX_CONFIG")
                                                  else "the default configuration")
        raise CliError(f"infermux: {where} {exc.file}: {exc.reason}; give --config FILE "
                       f"(or --endpoint SOCKET)", USAGE) from None


def guarded(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand, turning every failure into one line on stderr and its exit code."""
    try:
        code = int(run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except CliError as exc:
        print(exc.message, file=sys.stderr)
        return exc.exit_code
    except TimeoutError as exc:
        print(f"infermux: {exc}", file=sys.stderr)
        return NO_DAEMON
    except PermissionError as exc:  # ipc.UnsafeDirectory: a socket in a folder every user may write
        print(f"infermux: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `infermux status | head -1`: the reader has what it wanted. Point stdout at /dev/null
        # so the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the last guard: a user sees a sentence, a developer can ask for more
        from infermux.client.inference import AdminError, NotAdminSocket, RequestTooLarge

        if isinstance(exc, RequestTooLarge):
            print(f"infermux: {exc}", file=sys.stderr)
            return 1
        if isinstance(exc, AdminError):
            print(f"infermux: {exc}", file=sys.stderr)
            return USAGE if isinstance(exc, NotAdminSocket) else 1
        if type(exc).__name__ == "ZMQError":  # a malformed endpoint, mostly: zmq is imported late
            print(f"infermux: cannot use that socket: {exc} (endpoints look like ipc:///run/infermux/admin.sock "
                  f"or tcp://127.0.0.1:5555)", file=sys.stderr)
            return USAGE
        if os.environ.get("INFERMUX_DEBUG"):
            raise
        print(f"infermux: unexpected error: {type(exc).__name__}: {exc} "
              f"(INFERMUX_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


def add_model_arguments(parser: argparse.ArgumentParser, *, old_flag: bool = False) -> None:
    """MODEL (positional, as in every client command) and --version; `old_flag` keeps `--model NAME` working."""
    parser.add_argument("model", nargs="?" if old_flag else None, metavar="MODEL", help="model name")
    if old_flag:
        parser.add_argument("--model", dest="model_flag", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--version", help="model version (default: the model's default)")


def model_of(args: argparse.Namespace) -> str:
    """The model named positionally or by the older `--model` (exit 2 when neither, or two different)."""
    flag = getattr(args, "model_flag", None)
    if args.model and flag and args.model != flag:
        raise CliError(f"infermux: two models given ({args.model!r} and --model {flag!r}); name one", USAGE)
    model = args.model or flag
    if not model:
        raise CliError("infermux: name the model: `infermux COMMAND MODEL ...`", USAGE)
    args.model = model
    return str(model)


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """--input, --shape and --dtype: what `infer`, `bench` and `tune` send."""
    from infermux.protocol import DTYPES

    parser.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an input read from a .npy file (repeatable)")
    parser.add_argument("--shape", "-s", action="append", default=[], metavar="NAME=1x3x64x64",
                        help="a random input of this shape (repeatable; with neither this nor --input, "
                        "random inputs of the shapes the daemon reports for the model)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="dtype of --shape inputs")


def live_changes(model: dict[str, Any]) -> str:
    """A version's fields changed live, marked as such: `live: weight=100 (file 0), ...`; "" when none
    (the admin `models` entry's `overrides`; `infermux ctl reset` gives the file's values back)."""
    changed = model.get("overrides") or {}
    return ("live: " + ", ".join(f"{field}={_shown(v['live'])} (file {_shown(v['file'])})"
                                 for field, v in sorted(changed.items()))) if changed else ""


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return str(value) if value != "" else "none"
