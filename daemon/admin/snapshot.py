"""What the daemon looks like right now, as JSON-ready dicts.

One place builds the view that the admin `status`/`models` commands, the
stats stream, the console and the Prometheus exporter all read, so they
never disagree.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable

from infermux import __version__
from infermux.admin import hardware
from infermux.admin.threadload import ThreadLoad
from infermux.config import parse_budget
from infermux.events import TRACEBACKS
from infermux.models import life
from infermux.models.budget import rss_bytes
from infermux.models.registry import Model, ModelVersion, State

if TYPE_CHECKING:
    from infermux.admin.daemon import Daemon


def host_memory_total() -> int:
    """Physical memory in bytes (the budget's base on CPU-only boxes and on Jetson)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


class GpuReadings:
    """The GPUs for the snapshot (the console's header): the source is chosen on first use, and read
    at most every `every_s`, since the stats stream asks four times a second and NVML takes milliseconds."""

    def __init__(self, choose: Callable[[], "hardware.GpuSource | None"] = hardware.gpu_source,
                 every_s: float = 1.0) -> None:
        self.choose, self.every_s = choose, every_s
        self._source: hardware.GpuSource | None = None
        self._chosen = False
        self._view: dict[str, Any] = {}
        self._next = 0.0
        self._lock = threading.Lock()

    def view(self) -> dict[str, Any]:
        """{"source": "nvml" | "jetson" | "" (none), "devices": [GpuSample as a dict, ...]}."""
        with self._lock:
            now = time.monotonic()
            if now >= self._next:
                if not self._chosen:
                    self._source, self._chosen = self.choose(), True
                source = self._source
                devices = source.samples() if source is not None else []
                self._view = {"source": source.kind if source is not None else "",
                              "devices": [asdict(d) for d in devices]}
                self._next = now + self.every_s
            return self._view


#: The daemon's GPU readings (one source per process, like the metrics exporter's).
GPUS = GpuReadings()
#: The frontend thread's load (one frontend per process).
FRONTEND = ThreadLoad()


def version_view(server: "Daemon", mv: ModelVersion) -> dict[str, Any]:
    """One model version: settings, state, queues and live statistics."""
    placement = mv.placement
    contexts = placement.contexts() if placement is not None else []
    mc = mv.config
    model = server.registry.model(mv.name)
    queueing = _queueing(placement.settings() if placement is not None else mc)
    view: dict[str, Any] = {
        "name": mv.name, "version": mv.version, "state": mv.state.value, "reason": mv.reason,
        "phase": life.shown(mv.phase, mv.ready and model is not None and model.versions.get(mv.version) is mv).value,
        "placement": mc.placement,
        "default": model is not None and model.default() is mv,
        "pinned": model is not None and model.pinned == mv.version,
        "contexts": len(contexts) if contexts else mc.contexts,
        "queues": [c.queued for c in contexts],
        "queue_depth": sum(c.queued for c in contexts),
        "in_flight": sum(c.in_flight for c in contexts),
        "max_queue": queueing.pop("max_queue"),
        "timeout_ms": mc.timeout_ms, **_routing(server, model, mv), **queueing,
        "nice": mc.nice,  # added to its contexts' threads' nice value, or a cold one's worker's (execution/priority.py)
        "memory_bytes": mv.memory_bytes, "engine": str(mc.engine),
        "backend": mc.backend or mc.engine.suffix.lstrip("."),
        "last_load_ms": round(mv.last_load_s * 1000),
        "stats": mv.stats.snapshot().as_json(),
        # Fields an operator changed live, each with the file's value (models/overrides.py).
        "overrides": {field: o.as_json() for field, o in sorted(server.registry.overrides.of(mv.name, mv.version).items())},
    }
    _add_details(server, mv, view)
    return view


def _queueing(settings: Any) -> dict[str, Any]:
    """How a version queues and batches: its placement's settings in force, else its configuration's."""
    return {"max_queue": settings.max_queue, "max_batch": settings.max_batch,
            "batch_delay_us": settings.batch_delay_us, "preferred_batch": list(settings.preferred_batch),
            "queue_policy": settings.queue_policy, "per_key_depth": settings.per_key_depth}


def _routing(server: "Daemon", model: Model | None, mv: ModelVersion) -> dict[str, Any]:
    """How requests reach a version: fallback, weight, strategy and its share of the traffic."""
    return {
        "fallback": model.fallback if model is not None else "",
        "weight": server.router.weights(mv.name).get(mv.version, 0),
        "strategy": server.router.strategy(model) if model is not None else "",
        # Where requests that name no version go now: pinned, default or weights (None under hash).
        "traffic_share": server.router.traffic_share(model, mv.version) if model is not None else 0.0,
    }


def _add_details(server: "Daemon", mv: ModelVersion, view: dict[str, Any]) -> None:
    """What only some versions have: the engine's specs, a cold worker, a rollout it is the candidate of."""
    engine = mv.engine
    if engine is not None:  # model metadata, as Triton's: what to send and what comes back
        view["inputs"], view["outputs"] = _specs(engine)
    worker = getattr(mv, "worker_info", None)
    if callable(worker):
        view["worker"] = worker()
    rollout = server.rollouts.by_model.get(mv.name)
    if rollout is not None and rollout.candidate is mv:  # a candidate shadowing (swap/rollout.py)
        view["rollout"] = rollout.view()


_SPECS: dict[int, tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]] = {}  # id(engine): its specs as dicts
_SPECS_KEPT = 1024  # engines remembered at most (hot swaps make new ones): then it starts over


def _specs(engine: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An engine's inputs and outputs as dicts (copies), converted once per engine: its specs never
    change, and asdict over every model's was most of a snapshot's time."""
    kept = _SPECS.get(id(engine))
    if kept is None or kept[0] is not engine:
        if len(_SPECS) >= _SPECS_KEPT:
            _SPECS.clear()
        kept = _SPECS[id(engine)] = (engine, [asdict(s) for s in engine.inputs], [asdict(s) for s in engine.outputs])
    return [dict(d) for d in kept[1]], [dict(d) for d in kept[2]]


def models_view(server: "Daemon") -> list[dict[str, Any]]:
    return [version_view(server, mv) for mv in server.registry.all_versions()]


def daemon_view(server: "Daemon") -> dict[str, Any]:
    """The daemon as a whole: identity, uptime, memory, request count."""
    versions = server.registry.all_versions()
    total = host_memory_total()
    budget = parse_budget(server.config.path, server.config.daemon.memory_budget, total)
    enforced = server.registry.memory.budget  # the budget the daemon enforces: of GPU memory where NVML reads it
    total, budget = enforced.total, enforced.limit
    states = {s.value: sum(1 for mv in versions if mv.state is s) for s in State}
    loop = server.frontend
    express = loop.express.served if loop.express is not None else 0
    return {
        "version": __version__, "pid": os.getpid(), "uptime_s": round(time.time() - server.started, 1),
        "endpoints": server.endpoints, "config": str(server.config.path),
        "requests": server.requests, "accepting": not server.draining,
        # The frontend's socket calls: compiled (transport/_wire.c) or pyzmq's, and why (wire.py).
        "wire": {"kind": loop.wire_choice.kind, "detail": loop.wire_choice.describe()},
        # Requests whose header was a known layout with another id: not decoded again (parsecache.py),
        # the express lane's among them (express.py), which the lane answered from C.
        "headers_from_layout": loop.parses.hits + express,
        "express": {"on": loop.express is not None, "served": express},
        # The frontend thread's CPU, and the share of a core it used lately (admin/threadload.py):
        # near 1, that one thread is what limits the QPS.
        "frontend_thread": load.as_json() if (load := FRONTEND.read(loop.frontend_native_id)) else None,
        "replies_too_large": loop.replies_too_large,  # over max_reply_bytes: answered 413 instead
        # Requests of a kind whose reply was just over it: answered 413 without computing (oversize.py).
        "requests_refused_oversize": loop.oversize.refused,
        # Errors logged with a traceback (500s among them), repeats included: events.TRACEBACKS.
        "internal_errors": TRACEBACKS.total,
        "memory": {"budget_bytes": budget, "models_bytes": server.registry.memory_used(),
                   "rss_bytes": rss_bytes(), "total_bytes": total},
        "states": {k: v for k, v in states.items() if v},
        "routing": {"strategy": server.config.routing.strategy,
                    "version_mismatch": server.config.routing.version_mismatch},
        # Clients' input regions (regions.py): mapped, not owned; they count in no budget.
        "shared_memory": {"socket": str(loop.region_server.path) if loop.region_server else "",
                          **loop.regions.info()},
        # Inference connections, refusals, replies dropped for peers that do not read (peers.py).
        "clients": loop.peers.info(),
        # Cold workers as CUDA MPS clients (workers/mps.py).
        "mps": server.workers.mps.view(server.config.daemon.mps),
        "gpu": GPUS.view(),
    }


SNAPSHOT_STREAMS = 256  # streams a snapshot carries at most: the silent ones, then the most recently seen


def streams_view(server: "Daemon") -> dict[str, Any]:
    """The streams for the stats stream (the console's Streams view): at most SNAPSHOT_STREAMS of them
    (admin `streams` has them all), and how many there are."""
    table = server.streams
    streams = table.streams()  # least recently seen first
    silent = [s for s in streams if s.silent]
    chosen = {id(s): s for s in [*silent, *reversed(streams)][:SNAPSHOT_STREAMS]}
    now = table.clock()
    views = sorted((s.view(now) for s in chosen.values()), key=lambda v: (v["model"], v["key"]))
    return {"total": len(streams), "shown": views, "silent_s": table.silent_s}


def cameras_view(server: "Daemon") -> list[dict[str, Any]]:
    """Each camera's entry (cameras/supervisor.py) with its zones' and lines' counts, where it has any
    (pipelines/zones.py): what `ctl cameras`, the console and /metrics show."""
    cameras = server.cameras.view() if server.cameras is not None else []
    return [{**c, **server.pipelines.zones.view(str(c.get("camera", "")))} for c in cameras]


def full(server: "Daemon") -> dict[str, Any]:
    """Everything the stats stream publishes in one snapshot."""
    return {"time": time.time(), "daemon": daemon_view(server), "models": models_view(server),
            "pipelines": server.pipelines.view(), "streams": streams_view(server),
            "sinks": server.sinks.view(),  # docs/events.md: for the console, as `ctl sinks` shows them
            "cameras": cameras_view(server)}  # the console's Cameras view
