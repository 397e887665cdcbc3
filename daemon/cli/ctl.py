"""`infermux ctl COMMAND [MODEL [VERSION]] [key=value ...]`: one admin command.

    infermux ctl set classifier contexts=3
    infermux ctl set det_v2 weights=2.1:90,2.2:10
    infermux ctl reset det_v2 weights   # the file's weights again (no field: every live change)
    infermux ctl pin det_v2 2.1
    infermux ctl drain            # stop accepting; `infermux ctl resume` to reopen
    infermux ctl models           # each version's inputs and outputs (--json: everything)
    infermux ctl events           # recent events, one line each with an ISO time (--json: as sent)
    infermux ctl streams          # per camera (model, key): received, served, superseded, refused, age
    infermux ctl sinks            # per sink: state, backlog, oldest waiting, delivered, dropped, last error
    infermux ctl pipelines        # per pipeline and step: runs, fps, latency, 409s, errors, what it runs (--json: all)
    infermux ctl cameras          # per camera: state, fps decoded/gated/sent/served, decode ms, age, last error
    infermux ctl camera gate-3 disable   # live, kept across restarts; `enable` to start it again
    infermux ctl snapshot gate-3  # its newest frame with its boxes, saved as a JPEG (the path is printed)
    infermux ctl snapshot gate-3 --out gate.jpg   # ... and a copy written to gate.jpg

Exit codes: 0 done, 1 the daemon refused (the reason is printed), 2 usage,
3 the daemon did not answer (within 5 s; a command it has accepted may then
take up to --timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from infermux.cli.common import USAGE, CliError, add_endpoint_arguments, endpoint_from, live_changes
from infermux.format import parse_value, printable

PING_S = 5.0  # how long an absent daemon may keep an operator waiting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from infermux.admin.commands import COMMANDS

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "commands:\n" + "\n".join(f"  {n:<8} {c.help}" for n, c in COMMANDS.items())
    parser.add_argument("cmd", metavar="COMMAND", choices=sorted(COMMANDS), help="admin command")
    parser.add_argument("words", nargs="*", default=[], metavar="ARG", help="MODEL, VERSION and key=value settings")
    add_endpoint_arguments(parser, admin=True)
    parser.add_argument("--json", action="store_true", help="print the raw JSON reply")
    parser.add_argument("--out", metavar="FILE", help="snapshot: also write the JPEG to FILE")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long a command the daemon answers may take (a load, a drain; default 600)")


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


def short_models(models: list[dict[str, Any]]) -> str:
    """Per version: state and placement, then each input and output as `name dtype shape` (-1: any size)."""
    lines = []
    for m in models:
        marks = ", ".join(filter(None, [m.get("placement"), m.get("state"), "default" if m.get("default") else "",
                                        "pinned" if m.get("pinned") else ""]))
        lines.append(f"{m['name']}:{m['version']}  ({marks})")
        if live_changes(m):
            lines.append(f"  {live_changes(m)}")
        for kind in ("inputs", "outputs"):
            for spec in m.get(kind, []):
                lines.append(f"  {kind[:-1]:<6} {spec['name']:<16} {spec['dtype']:<8} {spec['shape']}")
        if "inputs" not in m:
            lines.append(f"  (tensors known once loaded{': ' + m['reason'] if m.get('reason') else ''})")
        elif m.get("rollout") or m.get("state") == "candidate":
            lines.append(f"  {m.get('reason', '')}")
    return "\n".join(lines)


def event_target(event: dict[str, Any]) -> str:
    """`model:version` of an event; an admin entry names its model only in its arguments."""
    model, version = event.get("model") or "", event.get("version") or ""
    if not model and isinstance(event.get("args"), str):
        try:
            args = json.loads(event["args"])
        except ValueError:
            args = {}
        if isinstance(args, dict):
            model, version = str(args.get("model") or ""), str(args.get("version") or "")
    return f"{model}:{version}" if model and version else model


def short_events(events: list[dict[str, Any]]) -> str:
    """One line per event: ISO time (UTC), kind, model:version, the rest as key=value."""
    from datetime import datetime, timezone

    from infermux import format as fmt

    skip = ("time", "kind", "model", "version")
    lines = []
    for e in events:
        when = datetime.fromtimestamp(float(e.get("time", 0)), timezone.utc).isoformat(timespec="milliseconds")
        rest = " ".join(f"{k}={fmt.printable(v, 300) if isinstance(v, str) else json.dumps(v)}"
                        for k, v in e.items() if k not in skip)
        lines.append(f"{when.replace('+00:00', 'Z')}  {e.get('kind', '?'):<9} {event_target(e) or '-'}  {rest}")
    return "\n".join(lines)


def short_streams(reply: dict[str, Any]) -> str:
    """One line per stream: its counts (CLIENT: frames its client replaced before sending them), rates, age
    of served frames and when it last sent."""
    from infermux import format as fmt

    lines = [f"{'MODEL/KEY':<32} {'RECEIVED':>8} {'SERVED':>8} {'409':>7} {'REFUSED':>8} {'FAILED':>6} "
             f"{'CLIENT':>7} {'FPS IN':>7} {'AGE P50':>8} {'AGE P99':>8}  LAST SEEN"]
    for s in reply.get("streams", []):
        age = {q: fmt.us(v * 1000 if v is not None else None) for q, v in (s.get("age_ms") or {}).items()}
        seen = f"{s['last_seen_s']:.1f}s ago" + (" SILENT" if s.get("silent") else "")
        name = fmt.printable(f"{s['model']}/{s['key']}", 48)
        lines.append(f"{name:<32} {s['received']:>8} {s['served']:>8} {s['superseded']:>7} "
                     f"{s['refused']:>8} {s['failed']:>6} {s.get('replaced_by_client', 0):>7} "
                     f"{fmt.rate(s.get('fps_in')):>7} {age.get('p50', '-'):>8} "
                     f"{age.get('p99', '-'):>8}  {seen}")
    lines.append(f"{reply.get('tracked', 0)} streams tracked (at most {reply.get('max_keys')})")
    return "\n".join(lines)


def short_sinks(sinks: list[dict[str, Any]]) -> str:
    """One line per sink; its last error (escaped: a broker's or server's text) on the next."""
    from infermux import format as fmt

    if not sinks:
        return "no sinks: the daemon's configuration has no [[sinks]] (docs/events.md)"
    lines = [f"{'SINK':<20} {'KIND':<8} {'STATE':<8} {'BACKLOG':>8} {'OLDEST':>8} {'DELIVERED':>10} {'DROPPED':>8}"]
    for s in sinks:
        oldest = "-" if s.get("oldest_age_s") is None else f"{s['oldest_age_s']:.1f}s"
        lines.append(f"{fmt.printable(s['name'], 20):<20} {fmt.printable(s['kind'], 8):<8} {s['state']:<8} "
                     f"{s['backlog']:>8} {oldest:>8} {s['delivered']:>10} {s['dropped']:>8}")
        if s.get("last_error"):
            lines.append(f"  last error: {fmt.printable(s['last_error'], 200)}")
    return "\n".join(lines)


def short_pipelines(pipelines: list[dict[str, Any]]) -> str:
    """The pipelines as `infermux status` shows them, with what each pipeline takes and each step runs."""
    from infermux.pipelines.stats import table

    if not pipelines:
        return "no pipelines: the daemon's configuration has no [[pipelines]] (docs/pipelines.md)"
    return table(pipelines, runs_on=True)


def _cameras_table(reply: dict[str, Any]) -> str:
    from infermux.cameras.table import table

    return table(reply.get("cameras", []))


def short_snapshot(reply: dict[str, Any]) -> str:
    """Where `ctl snapshot` wrote the frame (and its copy), with the frame's time and boxes."""
    when = time.strftime("%H:%M:%S", time.localtime(float(reply.get("time") or 0)))
    boxes = reply.get("boxes")
    drawn = f"{boxes} box" if boxes == 1 else f"{boxes} boxes"
    line = f"{reply.get('path')}  ({printable(reply.get('camera'), 40)}, frame of {when}, {drawn})"
    return line + (f"\ncopy: {reply['out']}" if reply.get("out") else "")


# The data commands' tables for people (`--json` gives their JSON instead).
TABLES: dict[str, Callable[[dict[str, Any]], str]] = {
    "models": lambda reply: short_models(reply.get("models", [])),
    "events": lambda reply: short_events(reply.get("events", [])),
    "streams": short_streams,
    "cameras": _cameras_table,
    "sinks": lambda reply: short_sinks(reply.get("sinks", [])),
    "pipelines": lambda reply: short_pipelines(reply.get("pipelines", [])),
    "snapshot": lambda reply: short_snapshot(reply),
}


def show(cmd: str, reply: dict[str, Any], as_json: bool) -> None:
    """Print a successful reply: JSON for scripts and the data commands, else one `ok:` line."""
    if cmd in TABLES and not as_json:
        print(TABLES[cmd](reply))
    elif as_json or cmd in ("models", "events", "status"):
        print(json.dumps(reply, indent=2))
    else:
        print("ok: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in reply.items() if k != "ok"))


def snapshot_out(args: argparse.Namespace, request: dict[str, Any]) -> Path | None:
    """`--out FILE`, checked before the daemon is asked: a folder that exists and can be written (exit 2)."""
    if args.cmd == "snapshot" and "model" not in request:
        raise CliError("infermux ctl snapshot: name the camera (or stream key): `infermux ctl snapshot CAMERA`",
                       USAGE)
    if args.out is None:
        return None
    if args.cmd != "snapshot":
        raise CliError(f"infermux ctl {args.cmd}: --out goes with `snapshot` only", USAGE)
    out = Path(args.out).expanduser()
    folder = out.parent if str(out.parent) else Path(".")
    if out.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK) or \
            (out.exists() and not os.access(out, os.W_OK)):
        raise CliError(f"infermux ctl snapshot: cannot write {str(out)!r} (--out): give a file in a folder "
                       "you may write", USAGE)
    request["jpeg"] = True
    return out


def write_out(out: Path, frames: list[Any]) -> str:
    """The JPEG the daemon sent, written to `out`; its path (exit 1 if the write fails)."""
    if not frames:
        raise CliError("infermux ctl snapshot: the daemon sent no JPEG (is it an older one?)")
    try:
        out.write_bytes(frames[0].bytes)
    except OSError as exc:
        raise CliError(f"infermux ctl snapshot: cannot write {str(out)!r}: {exc.strerror or exc}") from None
    return str(out)


def run(args: argparse.Namespace) -> int:
    from infermux.client import AdminClient

    try:
        request = request_args(args.words)
        if args.cmd == "reset" and "version" in request:  # `ctl reset MODEL [FIELD]`
            request["field"] = request.pop("version")
    except ValueError as exc:
        raise CliError(f"infermux ctl: {exc}", USAGE) from None
    out = snapshot_out(args, request)
    with AdminClient(endpoint_from(args, "admin"), timeout_s=args.timeout) as admin:
        admin.ping(min(PING_S, args.timeout))  # an absent daemon fails now, not after --timeout
        reply, frames = admin.call_frames(args.cmd, check=False, **request)
    if out is not None and reply.get("ok"):
        reply["out"] = write_out(out, frames)
    if not reply.get("ok"):
        if args.json:
            print(json.dumps(reply, indent=2))
        print(f"infermux ctl {args.cmd}: {reply.get('error')}", file=sys.stderr)
        return 1
    show(args.cmd, reply, args.json)
    return 0
