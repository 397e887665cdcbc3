"""`infermux status`: the daemon and its models, once (`--json` for scripts, `--check` for monitors).

Exit codes: 0 shown, 1 with --check when a model version has failed, 2
usage, 3 the daemon did not answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from infermux.cli.common import add_endpoint_arguments, endpoint_from, live_changes
from infermux import format as fmt
from infermux.admin.threadload import BUSY


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(parser, admin=True)
    parser.add_argument("--json", action="store_true", help="print the raw JSON reply")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a model version has failed (its reason goes to stderr)")
    # For the bash completion: what MODEL may be, one name a line, asked for a second at most.
    parser.add_argument("--names", action="store_true", help=argparse.SUPPRESS)


def errors(stats: dict[str, Any]) -> int:
    """Replies of 500 (the backend or infermux failed on the request) since the version was loaded."""
    return int((stats.get("by_status") or {}).get("500", 0))


def table(models: list[dict[str, Any]]) -> str:
    """The models as a fixed-width table. WEIGHT is the version's routing weight (under `weighted`),
    SHARE the part of the model's requests naming no version that it takes now; `*` marks the
    default where it takes them all."""
    head = ("MODEL", "VERSION", "PLACE", "STATE", "WEIGHT", "SHARE", "CTX", "QUEUE", "INFL", "QPS", "P50", "P99",
            "ERR", "MEMORY")
    rows = [head]
    for m in models:
        st = m.get("stats", {})
        share = m.get("traffic_share")
        split = share not in (None, 100.0, 100)  # a weighted split: SHARE says where requests go, not `*`
        name = (m["name"] + (" *" if m.get("default") and not split else "")
                + (" (pinned)" if m.get("pinned") else ""))
        weight = str(m.get("weight", 0)) if m.get("strategy") == "weighted" else "-"
        rows.append((name, m["version"], m["placement"], m["state"], weight,
                     "-" if share is None else f"{share:.0f}%", str(m["contexts"]), str(m["queue_depth"]),
                     str(m["in_flight"]), fmt.rate(st.get("qps")), fmt.us(st.get("p50_us")),
                     fmt.us(st.get("p99_us")), str(errors(st)), fmt.size(m["memory_bytes"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for m in models:
        if m.get("reason"):
            lines.append(f"  {m['name']}:{m['version']}: {m['reason']}")
    for m in models:  # what an operator changed live (`infermux ctl reset` gives the file's values back)
        if live_changes(m):
            lines.append(f"  {m['name']}:{m['version']}: {live_changes(m)}")
    return "\n".join(lines)


def failed(models: list[dict[str, Any]]) -> list[str]:
    """`name:version: reason` of each failed version."""
    return [f"{m['name']}:{m['version']}: {m.get('reason') or 'failed'}" for m in models if m["state"] == "failed"]


def _names(endpoint: str) -> int:
    """Print the names a request may address (models and pipelines), one a line."""
    from infermux.client import AdminClient

    with AdminClient(endpoint, timeout_s=1) as admin:
        models = admin.call("models")["models"]
        pipelines = admin.call("status").get("pipelines", [])
    print("\n".join(sorted({m["name"] for m in models} | {p["name"] for p in pipelines if "name" in p})))
    return 0


def _show(daemon: dict[str, Any], models: list[dict[str, Any]], pipelines: list[dict[str, Any]]) -> None:
    """The daemon's line, what its frontend and MPS run, the models' table, the pipelines' table."""
    from infermux.pipelines.stats import table as pipeline_table

    mem = daemon["memory"]
    print(f"infermux {daemon['version']}  pid {daemon['pid']}  up {fmt.duration(daemon['uptime_s'])}  "
          f"{daemon['requests']} requests{express_part(daemon)}  {'accepting' if daemon['accepting'] else 'DRAINING'}  "
          f"models {fmt.size(mem['models_bytes'])} of budget {fmt.size(mem['budget_bytes'])}")
    wire = daemon.get("wire") or {}
    if wire.get("kind") == "python":  # the slower calls: say so, and what brings the compiled ones
        print(f"frontend: {wire.get('detail', '')}")
    elif not (daemon.get("express") or {}).get("on", True):
        print("frontend: the express lane is off (INFERMUX_EXPRESS=off in the daemon's environment)")
    busy = busy_line(daemon)
    if busy:
        print(busy)
    mps = daemon.get("mps") or {}
    if mps.get("mode", "off") != "off":  # cold workers as MPS clients (workers/mps.py)
        print(f"mps {mps['mode']}: {'active' if mps.get('active') else 'not active'}, {mps.get('detail', '')}")
    print(table(models))
    if pipelines:
        print(pipeline_table(pipelines))


def run(args: argparse.Namespace) -> int:
    from infermux.client import AdminClient

    if args.names:
        return _names(endpoint_from(args, "admin"))
    with AdminClient(endpoint_from(args, "admin"), timeout_s=5) as admin:
        status = admin.call("status")
        daemon, pipelines = status["daemon"], status.get("pipelines", [])
        models = admin.call("models")["models"]
    if args.json:
        print(json.dumps({"daemon": daemon, "models": models, "pipelines": pipelines}, indent=2))
    else:
        _show(daemon, models, pipelines)
    if args.check and failed(models):
        print("\n".join(f"infermux status: failed: {line}" for line in failed(models)), file=sys.stderr)
        return 1
    return 0


def express_part(daemon: dict[str, Any]) -> str:
    """" (N express)" when the express lane has answered requests, so an operator sees which path served."""
    served = (daemon.get("express") or {}).get("served", 0)
    return f" ({served} express)" if served else ""


def busy_line(daemon: dict[str, Any]) -> str:
    """A line when the frontend thread used most of a core lately: that one thread limits the QPS
    (admin/threadload.py); "" otherwise."""
    load = daemon.get("frontend_thread") or {}
    if load.get("busy_ratio") is None or load["busy_ratio"] < BUSY:
        return ""
    return (f"frontend thread: {100 * load['busy_ratio']:.0f}% of a core over the last {fmt.duration(load['over_s'])}; "
            "near 100% it limits the QPS (docs/performance.md)")
