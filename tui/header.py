"""The two lines above the tabs: the daemon (uptime, pid, traffic, health), then its resources (memory, GPUs, version).

Least useful last on each line, since 80 columns cut the end. While the
daemon is away both lines are the last figures seen, greyed, after
`STALE as of HH:MM:SS`: nothing green claims it is up.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from infermux import format as fmt
from infermux.admin.threadload import BUSY, SATURATED
from infermux.tui.markup import escape


def daemon_line(d: dict[str, Any]) -> list[str]:
    """uptime, pid, requests, accepting/DRAINING, ready count, failures, clients the daemon holds off
    (replies dropped for those that do not read, connections refused), a frontend thread near a full
    core, internal errors."""
    states = d.get("states") or {}
    accepting = "[green]accepting[/]" if d.get("accepting", True) else "[b reverse red] DRAINING [/]"
    parts = [f"up {fmt.duration(d.get('uptime_s', 0))}", f"pid {d.get('pid', '?')}",
             f"{fmt.count(int(d.get('requests', 0)))} req{_express(d)}", accepting,
             f"{states.get('ready', 0)}/{sum(states.values())} ready"]
    if states.get("failed"):
        parts.append(f"[b red]{states['failed']} failed[/]")
    parts += _held_off(d.get("clients") or {})
    busy = (d.get("frontend_thread") or {}).get("busy_ratio")
    if busy is not None and busy >= BUSY:  # one thread near a full core: it limits the QPS
        parts.append(f"[{_level(busy, BUSY, SATURATED)}]frontend {100 * busy:.0f}% busy[/]")
    if (d.get("wire") or {}).get("kind") == "python":  # the frontend runs pyzmq's slower calls (wire.py)
        parts.append("[yellow]pyzmq wire[/]")
    if not (d.get("express") or {}).get("on", True):  # INFERMUX_EXPRESS=off: every request the general path's
        parts.append("[yellow]express off[/]")
    if d.get("internal_errors"):
        parts.append(f"[b red]{d['internal_errors']} err[/]")
    return parts


def _held_off(clients: dict[str, Any]) -> list[str]:
    """What the daemon did about clients, where it did any: replies dropped, connections refused or closed."""
    return [f"[yellow]{fmt.count(int(clients[key]))} {what}[/]" for key, what in (
        ("dropped_replies", "replies dropped"), ("refused_connections", "conns refused"),
        ("idle_closed", "silent conns closed")) if clients.get(key)]


def _express(d: dict[str, Any]) -> str:
    """` (1.2k express)`: how many of the requests the express lane answered; nothing before the first."""
    served = int((d.get("express") or {}).get("served", 0))
    return f" ({fmt.count(served)} express)" if served else ""


def gpu_part(sample: dict[str, Any], label: str) -> str:
    """`gpu 37% 12.1G/80.0G 54°C`: what the device reports, a reading it cannot give left out."""
    parts = [label]
    util = sample.get("utilization_ratio")
    if util is not None:
        parts.append(f"[{_level(util, 0.7, 0.9)}]{100 * util:.0f}%[/]")
    used, total = sample.get("memory_used_bytes"), sample.get("memory_total_bytes")
    if used is not None and total:
        parts.append(f"[{_level(used / total, 0.8, 0.95)}]{fmt.size(used)}[/]/{fmt.size(total)}")
    temp = sample.get("temperature_celsius")
    if temp is not None:
        parts.append(f"[{_level(temp, 75, 85)}]{temp:.0f}°C[/]")
    return " ".join(parts)


def _level(value: float, warn: float, bad: float) -> str:
    return "b red" if value >= bad else "yellow" if value >= warn else "default"


def resources_line(d: dict[str, Any]) -> list[str]:
    """Model memory against the budget, the daemon's RSS, each GPU (or `no GPU`), the version."""
    mem = d.get("memory") or {}
    parts = [f"mem {fmt.size(mem.get('models_bytes'))}/{fmt.size(mem.get('budget_bytes'))}",
             f"rss {fmt.size(mem.get('rss_bytes'))}"]
    gpu = d.get("gpu") or {}
    devices = gpu.get("devices") or []
    if devices:
        many = len(devices) > 1
        parts += [gpu_part(s, f"gpu{s.get('gpu', '')}" if many else "gpu") for s in devices]
    elif gpu.get("source"):  # a source that read nothing this time (driver trouble)
        parts.append(f"[yellow]no GPU reading[/] [dim]({escape(str(gpu['source']))})[/]")
    else:
        parts.append("[dim]no GPU[/]")
    parts.append(f"[b]infermux[/] {escape(str(d.get('version', '?')))}")
    return parts


def status_text(snapshot: dict[str, Any], stale: bool = False) -> str:
    """Both lines as Rich markup. `stale`: the daemon stopped answering; the figures are the last seen."""
    d = snapshot.get("daemon") or {}
    first, second = daemon_line(d), resources_line(d)
    if stale:
        when = fmt.clock(float(snapshot["time"])) if snapshot.get("time") else "?"
        first = [p for p in first if "accepting" not in p and "DRAINING" not in p]  # no claim it still serves
        return (f"[b reverse red] STALE [/] as of {when} · [dim]" + plain(" · ".join(first)) + "[/]\n"
                + "[dim]" + plain(" · ".join(second)) + "[/]")
    return " · ".join(first) + "\n" + " · ".join(second)


def plain(markup: str) -> str:
    """`markup` without its colours (to be greyed as a whole), still escaped."""
    return escape(Text.from_markup(markup).plain)
