"""The `infermux` command line: one subcommand per module.

Each subcommand lives in the module named for it and exposes
`add_arguments(parser)` and `run(args) -> int`; this file only wires them,
so `infermux --help` stays fast (heavy imports happen inside `run`).
Failures reach the user as one line and an exit code (common.guarded).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("infermux.cli.serve", "run the daemon"),
    "infer": ("infermux.cli.infer", "send one request and print the reply"),
    "bench": ("infermux.cli.bench", "closed-loop load generator: QPS and latency percentiles"),
    "status": ("infermux.cli.status", "print the daemon's models table once"),
    "ctl": ("infermux.cli.ctl", "run one admin command (load, unload, set, pin, drain, reload, ...)"),
    "top": ("infermux.cli.top", "live console: queues, memory, routing, with control"),
    "build": ("infermux.cli.build", "build a TensorRT engine from an ONNX model on this device"),
    "keygen": ("infermux.cli.keygen", "make a CURVE keypair for a tcp:// listener or a client"),
    "sign": ("infermux.cli.sign", "make a publisher's key pair, sign engines, check their signatures"),
    "record": ("infermux.cli.record", "record a model's next requests and its answers as .npz files"),
    "replay": ("infermux.cli.replay", "judge an engine on a recording: agreement, worst cases, latency"),
    "tune": ("infermux.cli.tune", "find how many contexts a model should run (the sizing rule)"),
    "doctor": ("infermux.cli.doctor", "check what this device lacks to serve: libraries, GPU, config, sockets"),
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that points at --help, not the whole usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only `command`'s module is imported (all when None)."""
    from infermux import __version__

    parser = Parser(prog="infermux", description="Multi-model inference daemon for edge GPUs.")
    parser.add_argument("--version", action="version", version=f"infermux {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
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
    from infermux.cli.common import guarded

    return guarded(args._run, args)


if __name__ == "__main__":
    sys.exit(main())
