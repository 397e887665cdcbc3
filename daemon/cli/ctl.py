"""`infermux ctl COMMAND [MODEL [VERSION]] [key=value ...]`: one admin command.

    infermux ctl set classifier contexts=3
    infermux ctl set det_v2 weights=2.1:90,2.2:10
    infermux ctl pin det_v2 2.1
    infermux ctl drain            # stop accepting; `infermux ctl resume` to reopen

Exit codes: 0 done, 1 the daemon refused (the reason is printed), 2 usage,
3 the daemon did not answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from infermux.cli.infer import add_endpoint_arguments, endpoint_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from infermux.admin.commands import COMMANDS

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "commands:\n" + "\n".join(f"  {n:<8} {c.help}" for n, c in COMMANDS.items())
    parser.add_argument("cmd", metavar="COMMAND", choices=sorted(COMMANDS), help="admin command")
    parser.add_argument("words", nargs="*", metavar="ARG", help="MODEL, VERSION and key=value settings")
    add_endpoint_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the raw JSON reply")


def parse_value(key: str, text: str) -> Any:
    """`3` -> 3, `2.1:90,2.2:10` -> {"2.1": 90, "2.2": 10} for weights, JSON where it parses, else text."""
    if key == "weights" and not text.startswith("{"):
        pairs = (item.rsplit(":", 1) for item in text.split(",") if item)
        return {version: int(weight) for version, weight in pairs}
    try:
        return json.loads(text)
    except ValueError:
        return text


def request_args(words: list[str]) -> dict[str, Any]:
    """Positional MODEL and VERSION, then key=value pairs."""
    args: dict[str, Any] = {}
    positional = [w for w in words if "=" not in w]
    for key, word in zip(("model", "version"), positional):
        args[key] = word
    if len(positional) > 2:
        raise ValueError(f"unexpected {positional[2]!r}: settings are written key=value")
    for word in words:
        if "=" in word:
            key, _, value = word.partition("=")
            args[key] = parse_value(key, value)
    return args


def run(args: argparse.Namespace) -> int:
    from infermux.client import AdminClient

    try:
        request = request_args(args.words)
    except ValueError as exc:
        print(f"infermux ctl: {exc}", file=sys.stderr)
        return 2
    try:
        with AdminClient(endpoint_from(args, "admin"), timeout_s=600) as admin:
            reply = admin.call(args.cmd, check=False, **request)
    except TimeoutError as exc:
        print(f"infermux: {exc}", file=sys.stderr)
        return 3
    if args.json or args.cmd in ("models", "events", "status"):
        print(json.dumps(reply, indent=2))
    elif reply.get("ok"):
        print("ok: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in reply.items() if k != "ok"))
    if not reply.get("ok"):
        print(f"infermux ctl {args.cmd}: {reply.get('error')}", file=sys.stderr)
        return 1
    return 0
