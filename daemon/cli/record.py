"""`infermux record MODEL --count N --out DIR`: keep the next N requests of a model and its answers.

    infermux record det --count 500 --out ~/rec/det-v3

The daemon copies the inputs of the next N requests for MODEL that the
model itself answers (200, no fallback) and the outputs it gave, up to
`[daemon] record_max_bytes` (1 GiB by default) of tensors; this command
takes them as they come and writes one .npz per request and a
manifest.json (client/recording.py says the format; numpy reads them).
`infermux replay DIR --engine FILE` then judges another engine on them.

Exit codes: 0 all N recorded, 1 fewer (record_max_bytes reached, stopped,
the daemon refused; what was recorded is kept), 2 usage, 3 the daemon did
not answer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from infermux.cli.common import USAGE, CliError, add_endpoint_arguments, endpoint_from

POLL_S = 0.2
PROGRESS_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="the model whose requests to record")
    parser.add_argument("--count", "-n", type=int, required=True, help="how many requests to record")
    parser.add_argument("--out", "-o", required=True, metavar="DIR", help="a new (or empty) folder for the files")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="give up after this many seconds (default: wait for N requests)")
    add_endpoint_arguments(parser, admin=True)


def run(args: argparse.Namespace) -> int:
    from infermux.client import AdminClient
    from infermux.client.inference import AdminError
    from infermux.client.recording import RecordingError, Writer

    if args.count < 1:
        raise CliError("infermux record: --count must be at least 1", USAGE)
    try:
        writer = Writer(Path(args.out).expanduser(), args.model)
    except (RecordingError, OSError) as exc:
        raise CliError(f"infermux record: {exc}", USAGE) from None
    with AdminClient(endpoint_from(args, "admin"), timeout_s=10) as admin:
        try:
            admin.call("record", model=args.model, count=args.count)
        except AdminError as exc:
            writer.discard()
            raise CliError(f"infermux record: {exc}") from None
        try:
            progress = _collect(admin, args, writer)
        except KeyboardInterrupt:
            admin.call("record_stop", check=False, model=args.model)
            progress = {"ended": "interrupted"}
        except BaseException:
            admin.call("record_stop", check=False, model=args.model)
            raise
    count = len(writer.requests)
    complete = count >= args.count
    manifest = writer.finish(str(progress.get("ended", "")), complete)
    if complete:
        print(f"recorded {count} requests of {args.model} in {writer.folder} ({manifest.name} lists them)")
        return 0
    print(f"infermux record: recorded {count} of {args.count} requests: {progress.get('ended') or 'stopped'}; "
          f"they are in {writer.folder}", file=sys.stderr)
    return 1


def _collect(admin: Any, args: argparse.Namespace, writer: Any) -> dict[str, Any]:
    """Take what the daemon recorded until its recording ends; returns its last progress."""
    from infermux.client.inference import AdminError

    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    shown = time.monotonic()
    while True:
        try:
            reply, frames = admin.call_frames("record_take", model=args.model)
        except AdminError as exc:  # dropped meanwhile (abandoned, stopped by someone else)
            return {"ended": str(exc)}
        _write(writer, reply["entries"], frames)
        if reply["finished"]:
            return reply
        if deadline is not None and time.monotonic() > deadline:
            admin.call("record_stop", check=False, model=args.model)
            return {"ended": f"--timeout {args.timeout:g} s passed"}
        if time.monotonic() - shown >= PROGRESS_S:
            shown = time.monotonic()
            print(f"recording {args.model}: {len(writer.requests)}/{args.count} "
                  f"({reply['skipped']} left out, {reply['bytes'] / 2**20:.1f} MiB)", file=sys.stderr)
        if not reply["entries"]:
            time.sleep(POLL_S)


def _write(writer: Any, entries: list[dict[str, Any]], frames: list[Any]) -> None:
    import numpy as np

    frame = iter(frames)
    for entry in entries:
        tensors = {}
        for kind in ("inputs", "outputs"):
            tensors[kind] = {t["name"]: np.frombuffer(next(frame).buffer, dtype=np.dtype(t["dtype"]))
                             .reshape(t["shape"]) for t in entry[kind]}
        writer.add(tensors["inputs"], tensors["outputs"], entry["version"], entry["latency_us"])
