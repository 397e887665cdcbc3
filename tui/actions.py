"""What each console action asks the daemon, and which ones ask the operator first.

One table serves the key bindings, the command palette and the docs, so a
key and its palette entry can never do different things.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from infermux.format import parse_value

#: (admin command, its arguments)
Request = tuple[str, dict[str, Any]]


class Refused(Exception):
    """The action cannot apply to this target; the message says why (shown as a warning)."""


def _version(m: dict[str, Any]) -> dict[str, Any]:
    return {"model": m["name"], "version": str(m["version"])}


def _contexts(delta: int) -> Callable[[dict[str, Any], str], Request]:
    def build(m: dict[str, Any], text: str) -> Request:
        n = int(m.get("contexts") or 1) + delta
        if n < 1:
            raise Refused(f"{m['name']}:{m['version']} already has a single context")
        return "set", {**_version(m), "contexts": n}
    return build


def _contexts_to(m: dict[str, Any], text: str) -> Request:
    try:
        n = int(text.strip())
    except ValueError:
        n = 0
    if n < 1:
        raise Refused(f"contexts is a whole number, 1 or more (e.g. 3); got {text.strip()!r}")
    return "set", {**_version(m), "contexts": n}


def _weights(m: dict[str, Any], text: str) -> Request:
    try:
        weights = parse_value("weights", text.strip())
    except ValueError:
        weights = None
    if not isinstance(weights, dict) or not weights:
        shown = f"got {text.strip()!r}" if text.strip() else "got nothing"
        raise Refused(f"weights are written VERSION:WEIGHT,…, e.g. 1:90,2:10; {shown}")
    return "set", {"model": m["name"], "weights": weights}


@dataclass(frozen=True)
class Action:
    """One operator action.

    `scope`: "version" acts on the selected model version, "daemon" on the
    whole daemon. `confirm`: the question asked first ({target} is filled in).
    `prompt`: the editor's title when the action needs a value first ({model}, {target}).
    `done`: the notification's title when the daemon did it ({target}: `classifier v1`, {model}).
    """

    name: str
    title: str
    help: str
    build: Callable[[dict[str, Any], str], Request]
    scope: str = "version"
    confirm: str = ""
    prompt: str = ""
    done: str = ""

    def outcome(self, target: dict[str, Any], ok: bool) -> str:
        """The notification's title: `Drained classifier v1`, or `Drain model failed: classifier v1`."""
        if not target:
            return self.done if ok else f"{self.title} failed"
        names = {"target": f"{target['name']} v{target['version']}", "model": target["name"]}
        if ok:
            return self.done.format(**names)
        return f"{self.title} failed: " + names["target" if "{target}" in self.done else "model"]


ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("load", "Load", "load the selected version", lambda m, _: ("load", _version(m)),
           done="Loaded {target}"),
    Action("unload", "Unload", "unload the selected version: its queue is answered first, new requests go to "
           "its fallback or get 503", lambda m, _: ("unload", _version(m)),
           confirm="Unload {target}?\nQueued requests are answered first; new ones get 503 or its fallback.",
           done="Unloaded {target}"),
    Action("promote", "Promote to hot", "move the selected version into the daemon process",
           lambda m, _: ("promote", _version(m)),
           done="Promoted {target} to hot"),
    Action("demote", "Demote to cold", "move the selected version to a worker process",
           lambda m, _: ("demote", _version(m)),
           confirm="Demote {target} to a worker process?\nIt is reloaded there; requests wait meanwhile.",
           done="Demoted {target} to cold"),
    Action("more", "Add a context", "one more execution context for the selected version", _contexts(+1),
           done="Added a context to {target}"),
    Action("fewer", "Remove a context", "one execution context fewer for the selected version", _contexts(-1),
           done="Removed a context from {target}"),
    Action("contexts", "Set contexts", "set how many execution contexts the selected version runs", _contexts_to,
           prompt="Execution contexts of {target} (a number)",
           done="Contexts of {target} set"),
    Action("pin", "Pin version", "serve the selected version by default, ignore newer ones",
           lambda m, _: ("pin", _version(m)),
           done="Pinned {target}"),
    Action("unpin", "Unpin model", "let the newest ready version serve again",
           lambda m, _: ("unpin", {"model": m["name"]}),
           done="Unpinned {model}"),
    Action("weights", "Edit weights", "traffic split between the selected model's versions", _weights,
           prompt="Weights of {model} (VERSION:WEIGHT, comma-separated)",
           done="Weights of {model} changed"),
    Action("fallback", "Edit fallback", "the model that takes the selected model's overflow",
           lambda m, text: ("set", {"model": m["name"], "fallback": text.strip()}),
           prompt="Fallback model of {model} (empty: none)",
           done="Fallback of {model} changed"),
    Action("drain", "Drain model", "the same as unload (the older name): finish its queue, then unload it",
           lambda m, _: ("drain", _version(m)),
           confirm="Drain {target}?\nIt finishes its queue, then unloads; load it again with l.",
           done="Drained {target}"),
    Action("drain_all", "Drain daemon", "refuse new requests on the whole daemon until resumed",
           lambda m, _: ("drain", {}), scope="daemon",
           confirm="Drain the whole daemon?\nEvery new request gets 503 until you resume (D).",
           done="Daemon drained"),
    Action("resume", "Resume daemon", "accept requests again after a drain", lambda m, _: ("resume", {}),
           scope="daemon",
           done="Daemon resumed"),
    Action("reload", "Reload configuration", "re-read the configuration file and apply the difference",
           lambda m, _: ("reload", {}), scope="daemon",
           confirm="Reload the configuration from {config}?\nModels added, removed or changed there are applied now.",
           done="Configuration reloaded"),
)}


def _text(value: Any) -> str:
    """A setting for a person: weights {"1": 7, "2": 3} -> 1=7, 2=3 (not a Python repr); no fallback -> none."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value) if value not in ("", None) else "none"


def summary(cmd: str, reply: dict[str, Any]) -> str:
    """The daemon's answer in one line for a notification."""
    if not reply.get("ok"):
        return str(reply.get("error", "failed"))
    if reply.get("message"):
        return str(reply["message"])
    if cmd in ("unload", "drain") and "drained" in reply:  # drain of a version: unload after its queue
        return f"unloaded after answering {reply.get('drained', 0)} queued request(s)"
    said = _SUMMARIES.get(cmd)
    if said is not None:
        return said(reply)
    fields = {k: v for k, v in reply.items() if k not in ("ok", "model", "version")}
    return ", ".join(f"{k} {v}" for k, v in fields.items()) or "done"


def _set_summary(reply: dict[str, Any]) -> str:
    return "; ".join(f"{k} {_text(v)}" for k, v in (reply.get("set") or {}).items()) or "nothing changed"


def _reload_summary(reply: dict[str, Any]) -> str:
    changes = {k: v for k, v in (reply.get("changes") or {}).items() if v}
    return "configuration reloaded: " + ("; ".join(f"{k} {v}" for k, v in changes.items()) or "no changes")


#: What a command's success says, where it says more than its reply's fields.
_SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "set": _set_summary,
    "load": lambda reply: f"loaded in {reply.get('load_ms', '?')} ms",
    "pin": lambda reply: f"{reply.get('model')}:{reply.get('version')} pinned",
    "unpin": lambda reply: f"unpinned; default now {reply.get('default')}",
    "resume": lambda reply: "accepting requests again",
    "reload": _reload_summary,
}
