"""`infermux serve`: run the daemon in the foreground (systemd runs it so)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from infermux.events import TRACEBACKS, limit_tracebacks

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
    from infermux.models import budget, statefile
    from infermux import config as cfg
    from infermux.swap import swapper as swap
    from infermux.admin.channel import AdminServer
    from infermux.admin.metrics import MetricsServer
    from infermux.frontend.server import Server
    from infermux.admin.supervisor import Supervisor
    from infermux.cameras import supervisor as camera_supervisor
    from infermux.transport import ipc, ownership

    try:
        config = cfg.load(args.config)
    except cfg.LibraryMissing as exc:  # the file is fine: say what to install, not "fix the file"
        print(f"infermux: cannot serve {exc.file}: {exc.reason} ({exc.path})", file=sys.stderr)
        return 1
    except cfg.ConfigError as exc:
        print(f"infermux: configuration error: {exc}", file=sys.stderr)
        print("infermux: fix the file and start again; nothing was started.", file=sys.stderr)
        return 2
    setup_logging(args.log_level or config.daemon.log_level)
    TRACEBACKS.interval_s = config.daemon.traceback_interval_s or TRACEBACKS.interval_s
    _raise_fd_limit()
    budget.limit_malloc_arenas()  # before any thread: see budget.MALLOC_ARENAS
    # The default 5 ms switch interval lets the frontend sit on the GIL while
    # an executor with a finished inference waits (docs/architecture.md#measured-facts: 0.52x -> 0.74x).
    sys.setswitchinterval(1e-4)
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
    try:  # before anything binds or sweeps the runtime directory; the locks last as long as the process
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
    server = Server(config, run_dir, state_dir)
    TRACEBACKS.events = server.events
    admin = AdminServer(server)
    metrics = None
    try:
        server.bind()
        admin.start()
        if config.daemon.metrics_port:
            metrics = MetricsServer(server, config.daemon.metrics_port, config.daemon.metrics_host)
            metrics.start()
    except (RuntimeError, OSError) as exc:
        logging.getLogger("infermux").error("%s", exc)
        return 1
    swapper = swap.attach(server)  # engine_dir discovery before READY; hot swap after (docs/hot-swap.md)
    supervisor = Supervisor(server)
    supervisor.install_signals()
    cameras = camera_supervisor.attach(server)  # stopped with the loop, before the drain

    def ready() -> None:
        if swapper is not None:
            swapper.start()
        cameras.start()
        supervisor.models_ready()

    server.start_models(done=ready)
    try:
        server.serve_forever()
    finally:
        if swapper is not None:
            swapper.stop()
        admin.stop()
        if metrics is not None:
            metrics.stop()
        server.ctx.term()
    logging.getLogger("infermux").info("stopped")
    return 0
