"""Admin commands (docs/protocol.md#the-admin-socket): each takes the server and the request's
arguments and returns the reply fields, or raises CommandError.

`admin.py` owns the socket; this module owns what the commands mean.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from infermux import config as cfg
from infermux import format as fmt
from infermux.admin import snapshot
from infermux.frontend import recorder
from infermux.events import EventLog
from infermux.models import fallback as fallbacks
from infermux.models import overrides
from infermux.models.registry import ModelVersion, State
from infermux.pipelines.snapshots import NoFrame, SnapshotError

if TYPE_CHECKING:
    from infermux.admin.daemon import Daemon


class CommandError(Exception):
    """A command that cannot be done; the message tells the operator why and what to do."""


@dataclass(frozen=True)
class Command:
    """One admin command: what it does, whether it changes the daemon, whether it blocks."""

    run: Callable[["Daemon", dict[str, Any]], dict[str, Any]]
    help: str
    changes: bool = True
    slow: bool = False


def _str(args: dict[str, Any], key: str, required: bool = True) -> str | None:
    value = args.get(key)
    if value is None:
        if required:
            raise CommandError(f"'{key}' is required")
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise CommandError(f"'{key}' must be a non-empty string")
    return value


def _int(args: dict[str, Any], key: str, minimum: int, maximum: int = 2**31 - 1) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise CommandError(f"'{key}' must be an integer >= {minimum} and <= {maximum}, got {str(value)[:40]}")
    return value


def target(server: "Daemon", args: dict[str, Any]) -> ModelVersion:
    """The version a command names: `model` and optional `version` (default: the model's default)."""
    name = _str(args, "model")
    model = server.registry.model(name or "")
    if model is None:
        raise CommandError(f"unknown model {name!r}; models: {', '.join(sorted(server.registry.models)) or 'none'}")
    version = _str(args, "version", required=False)
    if version is None:
        mv = model.default()
        assert mv is not None
        return mv
    if version not in model.versions:
        refuse_candidate(server, model.name, version)
        raise CommandError(f"model {name!r} has no version {version!r}; versions: "
                           f"{', '.join(v.version for v in model.ordered())}")
    return model.versions[version]


def refuse_candidate(server: "Daemon", name: str, version: str) -> None:
    """A command naming a candidate (swap/rollout.py) is told what decides it, instead of acting on it."""
    rollout = server.rollouts.by_model.get(name)
    if rollout is not None and rollout.candidate.version == version:
        raise CommandError(f"{name}:{version} is a candidate shadowing the serving version ({rollout.progress()}): "
                           f"`infermux ctl promote-now {name} {version}` serves it, `infermux ctl reject {name} "
                           f"{version}` refuses it")


def audit(events: EventLog, request: dict[str, Any], reply: dict[str, Any], who: dict[str, Any]) -> None:
    """The `admin` event of a command that changes the daemon, once it is done: what was asked,
    by whom, on which model, and whether it was `accepted` or `refused` (with the reason)."""
    args = {k: v for k, v in request.items() if k != "cmd"}
    model, version = (args.get(k) for k in ("model", "version"))
    detail: dict[str, Any] = {"cmd": request.get("cmd"), "outcome": "accepted" if reply.get("ok") else "refused"}
    if not reply.get("ok"):
        detail["reason"] = str(reply.get("error", ""))[:300]
    detail["args"] = json.dumps(args, sort_keys=True, default=str)
    events.emit("admin", model if isinstance(model, str) else "",
                str(version) if isinstance(version, (str, int)) and not isinstance(version, bool) else "",
                **detail, **who)


def _label(mv: ModelVersion) -> dict[str, str]:
    return {"model": mv.name, "version": mv.version, "state": mv.state.value}


# -- read-only ----------------------------------------------------------------

def cmd_status(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    models = [{k: v[k] for k in ("name", "version", "state", "placement", "default", "contexts",
                                  "queue_depth", "in_flight", "memory_bytes", "reason")}
              for v in snapshot.models_view(server)]
    return {"daemon": snapshot.daemon_view(server), "models": models, "pipelines": server.pipelines.view()}


def cmd_pipelines(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    return {"pipelines": server.pipelines.view(), "snapshots": server.snapshots.view()}


def cmd_streams(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    """Per stream (model or pipeline, key): its counts, rates, ages and whether it went silent."""
    model = _str(args, "model", required=False)
    table = server.streams
    return {"streams": table.view(model), "tracked": len(table.streams()), "max_keys": table.max_keys,
            "silent_s": table.silent_s}


def cmd_sinks(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    """Per sink: state, backlog, oldest waiting event's age, delivered, dropped, last error."""
    return {"sinks": server.sinks.view()}


def cmd_models(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    return {"models": snapshot.models_view(server)}


def cmd_events(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    limit = _int(args, "limit", 1) or 100
    kind = _str(args, "kind", required=False)  # kind=admin: the audit trail, which traffic never evicts
    return {"events": [e.as_json() for e in server.events.recent(limit, frozenset({kind}) if kind else None)]}


# -- changes ------------------------------------------------------------------

def cmd_load(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    mv = target(server, args)
    if mv.state is State.READY:
        return {**_label(mv), "message": "already loaded"}
    if mv.state in (State.LOADING, State.WARMING):
        _wait_loaded(mv, timeout_s=600)
    elif not server.registry.load(mv):
        raise CommandError(f"{mv.name}:{mv.version} failed to load: {mv.reason}")
    return {**_label(mv), "load_ms": round(mv.last_load_s * 1000)}


def _wait_loaded(mv: ModelVersion, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while mv.state in (State.LOADING, State.WARMING) and time.monotonic() < deadline:
        time.sleep(0.02)
    if mv.state is not State.READY:
        raise CommandError(f"{mv.name}:{mv.version} is {mv.state.value}: {mv.reason}")


def cmd_unload(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    mv = target(server, args)
    if mv.state is State.UNLOADED:
        return {**_label(mv), "message": "not loaded"}
    queued = mv.placement.depth() if mv.placement is not None else 0
    server.registry.unload(mv, server.config.daemon.drain_timeout_s)
    return {**_label(mv), "drained": queued}


def _placement(method: str) -> Callable[["Daemon", dict[str, Any]], dict[str, Any]]:
    def run(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
        mv = target(server, args)
        move = getattr(server.registry, method, None)
        if move is None:
            raise CommandError(f"{method} needs cold worker processes (placement = \"cold\"), "
                               f"which this build does not have")
        try:
            message = move(mv.name, mv.version)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        return {**_label(mv), "message": message or f"{method}d"}
    return run


# What `ctl set` changes: the settings declared settable (config/settings.py); the integers held to their
# declared bounds, the weights given as the whole split (`weights`).
SETTABLE = {key: bounds for key, bounds in overrides.BOUNDS.items() if key != "weight"}
SET_OTHERS = [*(key for key in overrides.FIELDS if key not in overrides.BOUNDS), "weights"]


def cmd_set(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    mv = target(server, args)
    changes: dict[str, Any] = {k: _int(args, k, *bounds) for k, bounds in SETTABLE.items() if k in args}
    if "contexts" in changes:
        _check_contexts(server, mv, changes["contexts"])
    if "preferred_batch" in args:  # reaches a cold version's worker too (Placement.apply)
        changes["preferred_batch"] = _sizes(args, "preferred_batch")
    if "queue_policy" in args:
        policies = overrides.SETTINGS["queue_policy"].choices
        if args["queue_policy"] not in policies:
            raise CommandError(f"'queue_policy' must be one of {', '.join(policies)}, "
                               f"got {str(args['queue_policy'])[:40]}")
        changes["queue_policy"] = args["queue_policy"]
    others = SET_OTHERS
    unknown = set(args) - set(SETTABLE) - {"cmd", "model", "version", *others}
    if unknown:
        raise CommandError(f"cannot set {', '.join(sorted(unknown))}; settable: {', '.join([*SETTABLE, *others])}")
    done: dict[str, Any] = {}
    note = ""
    if "fallback" in args:
        done["fallback"] = _set_fallback(server, mv.name, args["fallback"])
        note = _unchecked(server, mv.name, done["fallback"])
    if "weights" in args:
        done["weights"] = _set_weights(server, mv.name, args["weights"])
    if changes:
        for key, value in changes.items():
            server.registry.overrides.set(mv.name, mv.version, key, value, getattr(mv.config, key))
        server.registry.configure(mv, **changes)
        done.update(changes)
    if not done:
        raise CommandError(f"nothing to set; settable: {', '.join([*SETTABLE, *others])}")
    return {**_label(mv), "set": done, **({"note": note} if note else {})}


def _check_contexts(server: "Daemon", mv: ModelVersion, contexts: int) -> None:
    """Each context is a session with its own memory and thread: at most `[daemon] max_contexts`, and
    what more of them would take must fit the memory budget."""
    why = cfg.contexts_problem(contexts, server.config.daemon)
    if not why and contexts > mv.config.contexts:
        why = server.registry.memory.room_for_contexts(mv, contexts)
    if why:
        raise CommandError(f"cannot set contexts={contexts} on {mv.name}:{mv.version}: {why}")


def _sizes(args: dict[str, Any], key: str) -> tuple[int, ...]:
    """Batch sizes as [4, 8] or "4,8" (what `ctl set ... preferred_batch=4,8` sends), sorted."""
    value = args[key]
    items = value.split(",") if isinstance(value, str) else [value] if isinstance(value, int) else value
    try:
        sizes = sorted(int(item) for item in items if not isinstance(item, (bool, float)))
    except (TypeError, ValueError):
        sizes = []
    if not sizes or len(sizes) != len(items) or sizes[0] < 1:
        raise CommandError(f"'{key}' must be batch sizes >= 1 like 4,8 or [4, 8], got {value!r}")
    return tuple(sizes)


def _set_fallback(server: "Daemon", name: str, fallback: Any) -> str:
    if not isinstance(fallback, str):
        raise CommandError("'fallback' must be a model name, or \"\" to remove it")
    if fallback and server.registry.model(fallback) is None:
        raise CommandError(f"unknown fallback model {fallback!r}")
    chain = {n: m.fallback for n, m in server.registry.models.items() if m.fallback}
    chain.pop(name, None)
    if fallback:
        chain[name] = fallback
    problem = cfg.fallback_problem(chain)
    if problem:
        raise CommandError(problem[1])
    model = server.registry.model(name)
    assert model is not None
    target = server.registry.model(fallback) if fallback else None
    why = fallbacks.refusal(model, target) if target is not None else ""
    if why:
        raise CommandError(why)
    server.registry.overrides.set(name, "", "fallback", fallback, model.fallback)
    model.fallback = fallback
    return fallback


def _unchecked(server: "Daemon", name: str, fallback: str) -> str:
    """A note when a new fallback's inputs could not be compared with its model's yet."""
    model, target = server.registry.model(name), server.registry.model(fallback) if fallback else None
    if model is None or target is None or (fallbacks.inputs_of(model) and fallbacks.inputs_of(target)):
        return ""
    return (f"inputs of {name!r} and {fallback!r} not compared yet (one is not loaded): compared when it loads, "
            f"and the fallback removed with a fallback_refused event if they differ")


def _set_weights(server: "Daemon", name: str, weights: Any) -> dict[str, int]:
    model = server.registry.model(name)
    assert model is not None
    if not isinstance(weights, dict) or not weights:
        versions = ", ".join(sorted(model.versions))
        raise CommandError(f"no weights given: give each version of {name!r} ({versions}) a weight, written "
                           "VERSION:WEIGHT,... (e.g. 1:90,2:10; on the admin socket an object {\"1\": 90, \"2\": 10})")
    for version, weight in weights.items():
        if version not in model.versions:
            raise CommandError(f"model {name!r} has no version {version!r}")
        low, high = overrides.BOUNDS["weight"]
        if not isinstance(weight, int) or isinstance(weight, bool) or not low <= weight <= high:
            raise CommandError(f"weight of {version!r} must be an integer {low}..{high} (weights are "
                               f"ratios), got {str(weight)[:40]}")
    current = server.router.weights(name)
    for version in model.versions:  # the split is the whole table: a version left out gets 0
        server.registry.overrides.set(name, version, "weight", weights.get(version, 0), current.get(version, 0))
    return dict(weights)


def cmd_drain(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    if "model" in args:
        return cmd_unload(server, args)
    server.draining = True
    deadline = time.monotonic() + server.config.daemon.drain_timeout_s
    while time.monotonic() < deadline and any(
            mv.placement is not None and mv.placement.load() for mv in server.registry.all_versions()):
        time.sleep(0.02)
    return {"accepting": False, "message": "new requests get 503 until `resume`"}


def cmd_resume(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    server.draining = False
    return {"accepting": True}


def cmd_pin(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    name, version = _str(args, "model") or "", _str(args, "version") or ""
    refuse_candidate(server, name, version)  # a pin would leave it shadowing while the pin says it serves
    try:  # the registry also accepts a version only on disk (rollback): the watcher loads it
        server.registry.pin(name, version)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    mv = server.registry.model(name).versions.get(version)  # type: ignore[union-attr]
    return _label(mv) if mv is not None else {"model": name, "version": version, "state": "loading"}


def cmd_unpin(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    name = _str(args, "model") or ""
    try:
        server.registry.unpin(name)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    default = server.registry.model(name).default()  # type: ignore[union-attr]
    return {"model": name, "default": default.version if default else None}


def cmd_reset(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    """Forget live changes of a model (of one field when `field` is given): the file's values serve."""
    name = _str(args, "model") or ""
    field = _reset_field(args)
    live = [o for o in server.registry.overrides.all() if o.model == name]
    if server.registry.model(name) is None and not live:
        raise CommandError(f"unknown model {name!r}; models: {', '.join(sorted(server.registry.models)) or 'none'}")
    dropped = server.registry.overrides.reset(name, "weight" if field == "weights" else field)
    _serve_the_files(server, name, dropped)
    if any(d.override.field == "fallback" for d in dropped):
        server.registry.check_fallbacks(name)
    return {"model": name, "reset": [d.summary() for d in dropped],
            **({} if dropped else {"message": "no live changes to reset"})}


def _reset_field(args: dict[str, Any]) -> str | None:
    """The field `reset` names, if any (one of the overridable fields or `weights`)."""
    field = _str(args, "field", required=False)
    if field is not None and field not in (*overrides.FIELDS, "weights"):
        raise CommandError(f"cannot reset {field!r}; fields: {', '.join([*overrides.FIELDS, 'weights'])}")
    return field


def _serve_the_files(server: "Daemon", name: str, dropped: list[overrides.Dropped]) -> None:
    """Give model `name` and its versions the file's values of the live changes just dropped."""
    model = server.registry.model(name)
    if model is None:
        return
    for d in dropped:
        o = d.override
        mv = model.versions.get(o.version)
        if o.field == "fallback":
            model.fallback = d.file
        elif mv is not None and o.field != "weight":
            server.registry.configure(mv, **{o.field: d.file})


def cmd_reload(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    try:  # the same reload as SIGHUP's, one at a time
        steps = server.reload()
    except cfg.LibraryMissing as exc:
        raise CommandError(f"not reloaded, the running configuration stays: {exc.reason} ({exc.path})") from None
    except cfg.ConfigError as exc:
        raise CommandError(f"configuration not reloaded, the running one stays: {exc}") from None
    return {"changes": steps.summary()}


def _rollout(decide: str) -> Callable[["Daemon", dict[str, Any]], dict[str, Any]]:
    """`promote-now` / `reject` MODEL VERSION: decide a candidate's rollout now (swap/rollout.py)."""
    def run(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
        name, version = _str(args, "model") or "", _str(args, "version") or ""
        try:
            message = getattr(server.rollouts, decide)(name, version)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        return {"model": name, "version": version, "message": message}
    return run


TAKE_BYTES = 32 << 20  # tensors one `record_take` reply carries at most (one entry at least)


def cmd_record(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    """Record the next `count` requests of `model` answered by it (frontend/recorder.py)."""
    name = _str(args, "model") or ""
    if server.registry.model(name) is None:
        what = f"{name!r} is a pipeline: record the models it calls" if name in server.pipelines.by_name \
            else f"unknown model {name!r}"
        raise CommandError(f"{what}; models: {', '.join(sorted(server.registry.models)) or 'none'}")
    count = _int(args, "count", 1, 10_000_000) or 1
    try:
        recording = server.recorder.start(name, count, server.config.daemon.record_max_bytes)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    return {"model": name, **recording.progress().as_json()}


def cmd_record_take(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    """What a recording captured since the last take: JSON entries, their tensors as frames after it."""
    name = _str(args, "model") or ""
    recording = server.recorder.get(name)
    if recording is None:
        raise CommandError(f"{name!r} is not being recorded (a recording nobody takes from for "
                           f"{recorder.ABANDON_S:.0f} s is dropped)")
    entries, frames = recorder.wire(recording.take(TAKE_BYTES))
    progress = recording.progress().as_json()
    finished = recording.finished()  # ended, and this was the last of it
    if finished:
        server.recorder.forget(name)
    return {"model": name, "entries": entries, **progress, "finished": finished, recorder.FRAMES: frames}


def cmd_record_stop(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    name = _str(args, "model") or ""
    if server.recorder.get(name) is None:
        raise CommandError(f"{name!r} is not being recorded")
    server.recorder.forget(name)
    return {"model": name, "stopped": True}


def cmd_cameras(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    return {"cameras": snapshot.cameras_view(server)}


def cmd_camera(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    """`ctl camera NAME enable|disable` (NAME and the action arrive as `model` and `version`)."""
    name, action = _str(args, "model") or "", _str(args, "version") or ""
    if action not in ("enable", "disable"):
        raise CommandError(f"camera {name[:80]!r}: say enable or disable, got {action[:40]!r}")
    if server.cameras is None:
        raise CommandError("this daemon runs no cameras")
    try:
        return server.cameras.set_enabled(name, action == "enable")
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def cmd_snapshot(server: "Daemon", args: dict[str, Any]) -> dict[str, Any]:
    """`ctl snapshot CAMERA`: the newest frame of a camera (or stream key) with its boxes drawn, written
    as a JPEG in the snapshots' folder; with `jpeg=true` the JPEG also comes back as a frame."""
    name = _str(args, "model") or ""
    try:
        path, data, seen = server.snapshots.live(name)
    except NoFrame:
        raise CommandError(_no_frame(server, name)) from None
    except SnapshotError as exc:
        raise CommandError(str(exc)) from None
    reply: dict[str, Any] = {"camera": seen.key, "pipeline": seen.pipeline, "path": str(path),
                             "time": round(seen.time, 6), "boxes": len(seen.boxes), "bytes": len(data)}
    if args.get("jpeg") is True:
        reply[recorder.FRAMES] = [data]
    return reply


def _no_frame(server: "Daemon", name: str) -> str:
    """Why there is no frame of `name`: a camera that sent none yet, or a name that is neither."""
    shown = fmt.printable(name, 80)
    if any(c.name == name for c in server.config.cameras):
        return (f"camera {shown!r} has no frame yet: it sends frames once streaming, and its pipeline must "
                "answer them (see `infermux ctl cameras`)")
    cameras = ", ".join(fmt.printable(c.name, 40) for c in server.config.cameras[:20]) or "none"
    streams = ", ".join(fmt.printable(k, 40) for k in server.snapshots.keys()[:20]) or "none yet"
    return f"unknown camera or stream {shown!r}; cameras: {cameras}; streams with a frame: {streams}"


COMMANDS: dict[str, Command] = {
    "status": Command(cmd_status, "daemon summary and one line per model version", changes=False),
    "models": Command(cmd_models, "every model version with settings and live statistics", changes=False),
    "pipelines": Command(cmd_pipelines, "every pipeline with per-step counts and latencies", changes=False),
    "streams": Command(cmd_streams, "per stream (model, key): received, served, superseded, refused, ages, "
                       "rates, silent (model?)", changes=False),
    "sinks": Command(cmd_sinks, "per sink: state, backlog, oldest waiting event's age, delivered, dropped, "
                     "last error", changes=False),
    "events": Command(cmd_events, "recent events (limit=N, kind=KIND: e.g. kind=admin, the audit trail)",
                      changes=False),
    "load": Command(cmd_load, "load a version (model, version?)", slow=True),
    "unload": Command(cmd_unload, "drain and unload a version (model, version?)", slow=True),
    "promote": Command(_placement("promote"), "move a version to the daemon process (hot)", slow=True),
    "demote": Command(_placement("demote"), "move a version to a worker process (cold)", slow=True),
    "set": Command(cmd_set, f"change {', '.join([*SETTABLE, *SET_OTHERS])}", slow=True),
    "drain": Command(cmd_drain, "with model: drain and unload it; alone: stop accepting requests", slow=True),
    "resume": Command(cmd_resume, "accept requests again after `drain`"),
    "pin": Command(cmd_pin, "serve this version by default, ignore newer ones (model, version)"),
    "unpin": Command(cmd_unpin, "let the newest ready version serve again (model)"),
    "reset": Command(cmd_reset, "forget live changes (model, field?): the configuration's values serve again"),
    "reload": Command(cmd_reload, "re-read the configuration file and apply the difference", slow=True),
    "promote-now": Command(_rollout("promote_now"), "serve a candidate now, ending its shadowing (model, version)",
                           slow=True),
    "reject": Command(_rollout("reject"), "refuse a candidate now; the serving version stays (model, version)",
                      slow=True),
    "retry": Command(_rollout("retry"), "shadow a refused or rejected version again (model, version)"),
    "record": Command(cmd_record, "record the next requests of a model and its answers (model, count)"),
    "record_take": Command(cmd_record_take, "what a recording captured so far, tensors as frames (model)",
                           changes=False),
    "record_stop": Command(cmd_record_stop, "end a recording and drop what it holds (model)"),
    "cameras": Command(cmd_cameras, "per camera: state, fps decoded/gated/sent/served, decode ms, capture-to-result "
                       "age, reconnects, last error", changes=False),
    "snapshot": Command(cmd_snapshot, "the newest frame of a camera or stream key with its boxes, saved as a "
                        "JPEG (NAME; --out FILE: a copy here)", changes=False, slow=True),
    "camera": Command(cmd_camera, "enable or disable a camera live, kept across restarts (NAME enable|disable)"),
}
