"""`infermux top`: the live console — queues, memory and routing, with control.

    infermux top                       # the daemon of /etc/infermux/infermux.toml
    infermux top --config ./infermux.toml --runtime-dir ./run
    infermux top --admin ipc:///run/infermux/admin.sock --stats ipc:///run/infermux/stats.sock
    infermux status --json > dump.json && infermux top --from-file dump.json

Keys are shown in the footer; ctrl+p opens the command palette. This module
is the command (its arguments, the sockets); the console is infermux.tui.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", "-c", help="daemon configuration to take the sockets from "
                        "(default: $INFERMUX_CONFIG or /etc/infermux/infermux.toml)")
    parser.add_argument("--runtime-dir", help="the daemon's --runtime-dir, if it was started with one")
    parser.add_argument("--admin", help="admin socket (overrides the configuration's)")
    parser.add_argument("--stats", help="stats socket (overrides the configuration's)")
    parser.add_argument("--from-file", metavar="JSON",
                        help="show a saved `infermux status --json` instead of a live daemon (read-only)")


def endpoints(args: argparse.Namespace) -> tuple[str, str, str]:
    """(admin, stats, config path): --admin/--stats, else the configuration's sockets."""
    import os

    from infermux.cli.common import endpoint_from

    config = args.config or os.environ.get("INFERMUX_CONFIG", "/etc/infermux/infermux.toml")
    found = {}
    for which in ("admin", "stats"):
        given = getattr(args, which)
        ns = argparse.Namespace(endpoint=given, config=config, runtime_dir=args.runtime_dir)
        found[which] = endpoint_from(ns, which, check=False)  # the console waits for the daemon: no check
    return found["admin"], found["stats"], config


def run(args: argparse.Namespace) -> int:
    from infermux import vendor

    vendor.activate()  # before the first textual import: the Debian package's vendored copy wins
    if not _textual_installed():
        print(f"infermux top: the console needs Textual, which {sys.executable} cannot import: "
              "pip install 'infermux[tui]' (from a clone: .venv/bin/pip install -e '.[tui]')", file=sys.stderr)
        return 1
    from infermux.config import ConfigError
    from infermux.tui.feed import Endpoints, Feed, LiveFeed, StaticFeed

    feed: Feed
    if args.from_file:
        try:
            feed = StaticFeed.from_file(args.from_file)
        except (OSError, ValueError) as exc:
            print(f"infermux top: {exc}", file=sys.stderr)
            return 2
        config = ""
    else:
        try:
            admin, stats, config = endpoints(args)
        except (ConfigError, OSError) as exc:
            print(f"infermux top: {exc}\n(give --config, or --admin and --stats)", file=sys.stderr)
            return 2
        if not admin or not stats:
            print("infermux top: the configuration disables the admin or stats socket", file=sys.stderr)
            return 2
        feed = LiveFeed(Endpoints(admin, stats))
    from infermux.tui.app import TopApp

    TopApp(feed, config_path=config).run()
    return 0


def _textual_installed() -> bool:
    """Whether Textual imports here: an install without the `tui` extra has none, and the console is built on it."""
    try:
        import textual  # noqa: F401
    except ImportError:
        return False
    return True
