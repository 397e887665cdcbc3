"""`infermux status`: the daemon and its models, once (`--json` for scripts)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from infermux.infer import add_endpoint_arguments, endpoint_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the raw JSON reply")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _fmt_us(value: Any) -> str:
    return "-" if value is None else (f"{value / 1000:.1f}ms" if value >= 1000 else f"{value:.0f}us")


def table(models: list[dict[str, Any]]) -> str:
    """The models as a fixed-width table."""
    head = ("MODEL", "VERSION", "PLACE", "STATE", "CTX", "QUEUE", "INFL", "QPS", "P50", "P99", "MEMORY")
    rows = [head]
    for m in models:
        st = m.get("stats", {})
        name = m["name"] + (" *" if m.get("default") else "") + (" (pinned)" if m.get("pinned") else "")
        rows.append((name, m["version"], m["placement"], m["state"], str(m["contexts"]), str(m["queue_depth"]),
                     str(m["in_flight"]), f"{st.get('qps', 0):.0f}", _fmt_us(st.get("p50_us")),
                     _fmt_us(st.get("p99_us")), human_bytes(m["memory_bytes"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for m in models:
        if m.get("reason"):
            lines.append(f"  {m['name']}:{m['version']}: {m['reason']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from infermux.client import AdminClient

    try:
        with AdminClient(endpoint_from(args, "admin"), timeout_s=5) as admin:
            daemon = admin.call("status")["daemon"]
            models = admin.call("models")["models"]
    except TimeoutError as exc:
        print(f"infermux: {exc}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps({"daemon": daemon, "models": models}, indent=2))
        return 0
    mem = daemon["memory"]
    print(f"infermux {daemon['version']}  pid {daemon['pid']}  up {daemon['uptime_s']:.0f}s  "
          f"{daemon['requests']} requests  {'accepting' if daemon['accepting'] else 'DRAINING'}  "
          f"models {human_bytes(mem['models_bytes'])} of budget {human_bytes(mem['budget_bytes'])}")
    print(table(models))
    return 0
