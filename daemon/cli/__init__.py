"""The `infermux` command line: one subcommand per module.

Each subcommand lives in the module named for it and exposes
`add_arguments(parser)` and `run(args) -> int`; this file only wires them,
so `infermux --help` stays fast (heavy imports happen inside `run`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("infermux.cli.serve", "run the daemon"),
    "infer": ("infermux.cli.infer", "send one request and print the reply"),
    "bench": ("infermux.cli.bench", "closed-loop load generator: QPS and latency percentiles"),
    "status": ("infermux.cli.status", "print the daemon's models table once"),
    "ctl": ("infermux.cli.ctl", "run one admin command (load, unload, set, pin, drain, reload, ...)"),
    "top": ("infermux.tui.top", "live console: queues, memory, routing, with control"),
    "build": ("infermux.cli.build", "build a TensorRT engine from an ONNX model on this device"),
    "keygen": ("infermux.cli.keygen", "make a CURVE keypair for a tcp:// listener or a client"),
    "tune": ("infermux.cli.tune", "find how many contexts a model should run (the sizing rule)"),
    "doctor": ("infermux.cli.doctor", "check what this device lacks to serve: libraries, GPU, config, sockets"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only `command`'s module is imported (all when None)."""
    from infermux import __version__

    parser = argparse.ArgumentParser(prog="infermux", description="Multi-model inference daemon for edge GPUs.")
    parser.add_argument("--version", action="version", version=f"infermux {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=help_text)
            continue
        mod = importlib.import_module(module)
        sp = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().splitlines()[0])
        mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `infermux` console script."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(command if command in COMMANDS else "")
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
