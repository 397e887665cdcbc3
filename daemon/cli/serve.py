"""`infermux serve`: run the daemon in the foreground (systemd runs it so)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from infermux.events import TRACEBACKS, limit_tracebacks

if TYPE_CHECKING:
    from infermux import config as cfg

DEFAULT_CONFIG = "/etc/infermux/infermux.toml"
# Exit status when another live daemon holds this one's sockets or runtime directory: the unit's
# RestartPreventExitStatus, since starting again in two seconds would find the same daemon.
ALREADY_SERVING = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", default=os.environ.get("INFERMUX_CONFIG", DEFAULT_CONFIG),
                        help=f"configuration file (default: $INFERMUX_CONFIG or {DEFAULT_CONFIG})")
    parser.add_argument("--state-dir", help="where operators' live changes are kept across restarts (default: "
                        "[daemon] state_dir, else $STATE_DIRECTORY, else /var/lib/infermux when writable, else "
                        "$XDG_STATE_HOME/infermux)")
    parser.add_argument("--runtime-dir", help="where relative ipc:// sockets go (default: $RUNTIME_DIRECTORY, "
                        "/run/infermux if writable, else $XDG_RUNTIME_DIR/infermux or /tmp/infermux-$UID)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        help="override [daemon] log_level")


def setup_logging(level: str) -> None:
    """One line per event; systemd's journal adds its own timestamps."""
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not os.environ.get("JOURNAL_STREAM"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level.upper(), format=fmt, stream=sys.stderr, force=True)
    limit_tracebacks()  # a request that fails the same way each time logs its traceback once (events.py)


def _raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard one before anything opens: systemd's soft default (1024)
    is what a few hundred clients would exhaust (docs/security.md)."""
    from infermux.transport.peers import raise_fd_limit

    soft, hard = raise_fd_limit()
    logging.getLogger("infermux").info("file descriptors: limit %d (hard %d)", soft, hard)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM: the configuration read, the process set up, the directories claimed, then
    the daemon (app.py) runs; the exit status."""
    from infermux.app import App
    from infermux.models import budget

    config = _load(args.config)
    if isinstance(config, int):
        return config
    setup_logging(args.log_level or config.daemon.log_level)
    TRACEBACKS.interval_s = config.daemon.traceback_interval_s or TRACEBACKS.interval_s
    _raise_fd_limit()
    budget.limit_malloc_arenas()  # before any thread: see budget.MALLOC_ARENAS
    # Python's default switch interval lets the frontend sit on the GIL while an executor with a
    # finished inference waits (docs/architecture.md#measured-facts gives the figures).
    sys.setswitchinterval(1e-4)
    dirs = _claim_directories(config, args)
    if isinstance(dirs, int):
        return dirs
    # What is imported by now lives as long as the process: out of the collector's sight, the full
    # collection after each unload (budget.release_memory) no longer walks it, holding the GIL from
    # every client meanwhile (docs/decisions.md gives the figures).
    gc.freeze()
    app = App(config, *dirs)
    TRACEBACKS.events = app.events
    return app.run()


def _load(path: str) -> "cfg.Config | int":
    """The configuration in `path`, or the exit status once what is wrong with it is said."""
    from infermux import config as cfg

    try:
        return cfg.load(path)
    except cfg.LibraryMissing as exc:  # the file is fine: say what to install, not "fix the file"
        print(f"infermux: cannot serve {exc.file}: {exc.reason} ({exc.path})", file=sys.stderr)
        return 1
    except cfg.ConfigError as exc:
        print(f"infermux: configuration error: {exc}", file=sys.stderr)
        print("infermux: fix the file and start again; nothing was started.", file=sys.stderr)
        return 2


def _claim_directories(config: "cfg.Config", args: argparse.Namespace) -> "tuple[Path, Path | None] | int":
    """The runtime and state directories, made, checked and claimed for this daemon (the locks last
    as long as the process), before anything binds or sweeps them; else the exit status, said why."""
    from infermux import config as cfg
    from infermux.models import statefile
    from infermux.transport import ipc, ownership

    run_dir = cfg.runtime_dir(config.daemon, args.runtime_dir)
    try:
        ipc.make_dir(run_dir)  # started by hand, no RuntimeDirectory= made it (workers' sockets go there too)
    except OSError as exc:
        print(f"infermux: cannot create the runtime directory {run_dir}: {exc.strerror}; "
              "pass --runtime-dir DIR (a folder you may write)", file=sys.stderr)
        return 1
    why = ipc.unsafe_directory(run_dir)
    if why:
        print(f"infermux: will not serve from the runtime directory {why} (docs/security.md); nothing was "
              "started", file=sys.stderr)
        return 1
    state_dir = statefile.state_dir(config.daemon, args.state_dir)
    try:
        owned = ownership.claim(run_dir, [cfg.resolve_endpoint(ep, run_dir) for ep in
                                          [*config.daemon.listen, config.daemon.admin, config.daemon.stats] if ep])
        why = statefile.claim(state_dir, owned)
    except ownership.SocketsTaken as exc:
        print(f"infermux: {exc}", file=sys.stderr)
        return ALREADY_SERVING
    if why:
        print(f"infermux: will not keep live changes in the state directory {why} (docs/security.md); nothing "
              "was started", file=sys.stderr)
        return 1
    return run_dir, state_dir
