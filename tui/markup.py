"""The console's colours and Rich markup: states, events and log lines as the views show them."""

from __future__ import annotations

from typing import Any

from infermux.format import clock


STATE_STYLE = {"ready": "green", "loading": "yellow", "warming": "yellow", "draining": "magenta",
               "failed": "bold red", "unloaded": "dim", "candidate": "cyan"}

EVENT_STYLE = {"failed": "bold red", "crashed": "bold red", "evicted": "yellow", "refused": "yellow",
               "rejected": "yellow", "admin": "cyan", "loaded": "green", "swapped": "green",
               "unloaded": "magenta", "rollout_passed": "green", "rollout_failed": "bold red",
               "rollout_paused": "yellow"}

EVENT_FIELDS = ("time", "kind", "model", "version")


def escape(text: str) -> str:
    """`text` as markup that shows it as it is. Every '[' is escaped, not only those that open a
    tag as Rich's `escape` reads one: Textual's parser takes `[2J b [dim]` for one tag, so a
    camera's reason ending in an escape sequence broke the markup written after it. A backslash
    at the end gets a space after it, or it would escape the tag that follows the text."""
    text = text.replace("[", "\\[")
    return text + " " if text.endswith("\\") else text


LEVEL_STYLE = {"warning": "yellow", "error": "bold red", "critical": "bold reverse red"}


def log_line(event: dict[str, Any]) -> str:
    """A `log` event (a warning or error the daemon logged): time, level, logger, message, repeats."""
    level = str(event.get("level", "warning"))
    style = LEVEL_STYLE.get(level, "")
    repeated = f" [dim](+{event['repeated']} like it before)[/]" if event.get("repeated") else ""
    return (f"[dim]{clock(float(event.get('time', 0)))}[/] [{style}]{escape(level):<9}[/] "
            f"[dim]{escape(str(event.get('logger', '')))}[/] {escape(str(event.get('message', '')))}{repeated}")


def event_line(event: dict[str, Any]) -> str:
    """An event as one line of Rich markup: time, kind, model:version, details."""
    kind = str(event.get("kind", "?"))
    if kind == "log":
        return log_line(event)
    target = event.get("model") or ""
    if target and event.get("version"):
        target += f":{event['version']}"
    detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in EVENT_FIELDS)
    style = EVENT_STYLE.get(kind, "")
    kind_text = f"[{style}]{escape(kind):<9}[/]" if style else f"{escape(kind):<9}"
    parts = [f"[dim]{clock(float(event.get('time', 0)))}[/]", kind_text, escape(target), escape(detail)]
    return " ".join(p for p in parts if p)
