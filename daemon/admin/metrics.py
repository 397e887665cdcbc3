"""Prometheus text exposition, and the health probes, on an optional loopback HTTP port.

Off unless `[daemon] metrics_port` is set; docs/fleet.md lists the paths and names. Names follow Triton's
(`nv_inference_request_success` → `infermux_inference_request_success_total`)
so existing dashboards translate; every series carries model and version
labels. Everything is read from the same snapshot the console sees.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterable

from infermux.admin import hardware, snapshot
from infermux.admin.httpd import HttpServer, Reply, Route
from infermux.admin.health import Liveness, Verdict, readiness
from infermux.admin.streamseries import Series, StreamSeries
from infermux.cameras.series import families as camera_families
from infermux.execution.streams import percentile
from infermux.events import Event
from infermux.execution.stats import LATENCY_BUCKETS_US
from infermux.transport.peers import SILENT_GRACE_S

if TYPE_CHECKING:
    from infermux.admin.daemon import Daemon

log = logging.getLogger("infermux.metrics")

# A 409 is not a failure: a newer request of the same stream replaced it (queue_policy newest_per_key),
# counted by infermux_inference_request_superseded_total.
FAILURE_REASONS = {400: "bad_request", 404: "not_found", 413: "too_large", 429: "queue_full",
                   500: "backend_error", 503: "not_ready", 504: "deadline"}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROBE_TYPE = "text/plain; charset=utf-8"
# (sample field, metric, help): DCGM's and node_exporter's names, with our prefix.
GPU_FAMILIES = (
    ("utilization_ratio", "infermux_gpu_utilization_ratio", "GPU busy fraction over the driver's last sample period."),
    ("memory_used_bytes", "infermux_gpu_memory_used_bytes", "GPU memory in use (on Jetson: the shared system memory)."),
    ("memory_total_bytes", "infermux_gpu_memory_total_bytes", "GPU memory in all."),
    ("temperature_celsius", "infermux_gpu_temperature_celsius", "GPU die temperature."),
    ("power_watts", "infermux_gpu_power_watts", "GPU power draw (on Jetson: its INA3221 rail)."),
)


# The exposition format's label-value escapes: a newline in a model name must not end the sample.
_LABEL_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})


def _number(value: float) -> str:
    """A sample value at full precision (`:g` keeps 6 digits: a seconds counter would move in steps)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


def _value(value: Any) -> str:
    """A label value: escaped, and UTF-8 whatever it holds (a lone surrogate in a name becomes the
    text `\\ud800`, where it would fail the whole page's encoding)."""
    text = str(value)
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode()
    return text.translate(_LABEL_ESCAPES)


def _labels(**labels: Any) -> str:
    text = ",".join(f'{k}="{_value(v)}"' for k, v in labels.items())
    return "{" + text + "}" if text else ""


class Exposition:
    """Builds the text format: HELP and TYPE once per family, then its samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict, float]]) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(**labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class EventCounter:
    """Counts events by (kind, model, version): worker restarts and swaps have no other counter."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def __call__(self, event: Event) -> None:
        self.counts[(event.kind, event.model, event.version)] += 1

    def of(self, kind: str, keys: Iterable[tuple[str, ...]] = (), by_version: bool = False) -> list[tuple[dict, float]]:
        """One sample per (model,) or (model, version) counted, and a 0 for each of `keys` not yet
        counted: a counter that appears at 1 hides its first increase from rate() and increase()."""
        counts: Counter[tuple[str, ...]] = Counter({key: 0 for key in keys})
        for (k, model, version), n in self.counts.items():
            if k == kind:
                counts[(model, version) if by_version else (model,)] += n
        names = ("model", "version") if by_version else ("model",)
        return [(dict(zip(names, key)), n) for key, n in sorted(counts.items())]


def render(server: "Daemon", events: EventCounter, gpu: hardware.GpuSource | None = None,
           streams: StreamSeries | None = None) -> str:
    """The whole exposition for one scrape (`streams`: the exporter's choice of stream series, kept
    between scrapes so that no counter goes back)."""
    models = snapshot.models_view(server)
    daemon = snapshot.daemon_view(server)
    out = Exposition()
    _requests(out, models)
    _models(out, models, events)
    _memory(out, daemon["memory"])
    _clients(out, daemon["clients"])
    _frontend(out, daemon)
    _gpus(out, gpu.samples() if gpu is not None else [])
    _processes(out, _process_samples(server))
    _pipelines(out, server.pipelines.view())
    _streams(out, server, streams or StreamSeries())
    _cameras(out, server)
    _sinks(out, server.sinks.view(), server.pipelines.view())
    return out.text()


def _cameras(out: Exposition, server: "Daemon") -> None:
    """Per configured camera: its state, frames at each stage, decode time and capture-to-result age; its
    zones' objects and lines' crossings per label."""
    for family in camera_families(snapshot.cameras_view(server)):
        out.family(*family)


def _version(m: dict) -> dict:
    """A model version's labels."""
    return {"model": m["name"], "version": m["version"]}


def _requests(out: Exposition, models: list[dict]) -> None:
    """Per model version: requests by outcome, their latency and times, batches, queues."""
    mv = _version
    out.family("infermux_inference_request_success_total", "counter", "Requests served (status 200).",
               [(mv(m), m["stats"]["served"]) for m in models])
    out.family("infermux_inference_request_failure_total", "counter", "Requests answered with an error, by reason.",
               [({**mv(m), "reason": reason}, n) for m in models for reason, n in _failures(m["stats"]["by_status"])])
    out.family("infermux_inference_request_superseded_total", "counter", "Requests a newer one of their stream "
               "replaced before they were computed (409, queue_policy newest_per_key): not errors.",
               [(mv(m), int(m["stats"]["by_status"].get("409", 0))) for m in models])
    _histogram(out, models, mv)
    for part in ("queue", "compute"):
        out.family(f"infermux_inference_{part}_duration_seconds_total", "counter",
                   f"Cumulative {part} time of served requests, seconds.",
                   [(mv(m), m["stats"]["sums_us"].get(part, 0.0) / 1e6) for m in models])
    out.family("infermux_inference_batches_total", "counter", "Backend calls, by batch size.",
               [({**mv(m), "size": size}, n) for m in models for size, n in m["stats"]["batches"].items()])
    # The same calls in one series from 0 on (a size's series appears at its first call, unseen by rate()):
    # what the mean batch size is computed from. Triton's nv_inference_exec_count.
    out.family("infermux_inference_executions_total", "counter", "Backend calls (batches) of any size.",
               [(mv(m), sum(m["stats"]["batches"].values())) for m in models])
    out.family("infermux_inference_pending_requests", "gauge", "Requests queued or running.",
               [(mv(m), m["queue_depth"] + m["in_flight"]) for m in models])
    out.family("infermux_inference_queued_requests", "gauge", "Requests waiting for a context (429 at max_queue).",
               [(mv(m), m["queue_depth"]) for m in models])
    out.family("infermux_inference_max_queue", "gauge", "The queue's bound: requests past it are answered 429.",
               [(mv(m), m["max_queue"]) for m in models])


def _models(out: Exposition, models: list[dict], events: EventCounter) -> None:
    """Per model version: its state, contexts, memory, restarts, swaps and rollouts."""
    mv = _version
    out.family("infermux_model_state", "gauge", "1 for the state each model version is in.",
               [({**mv(m), "state": m["state"]}, 1) for m in models])
    out.family("infermux_model_contexts", "gauge", "Execution contexts per model version.",
               [(mv(m), m["contexts"]) for m in models])
    out.family("infermux_model_memory_bytes", "gauge", "Measured memory footprint per model version.",
               [(mv(m), m["memory_bytes"]) for m in models])
    cold = [(m["name"], m["version"]) for m in models if m["placement"] == "cold"]
    out.family("infermux_worker_restarts_total", "counter", "Cold worker processes that crashed and were restarted.",
               events.of("crashed", cold, by_version=True))
    out.family("infermux_model_swaps_total", "counter", "Versions swapped in without downtime.",
               events.of("swapped", {(m["name"],) for m in models}))
    _rollouts(out, models, events, mv)


def _memory(out: Exposition, memory: dict) -> None:
    out.family("infermux_memory_budget_bytes", "gauge", "Memory budget for models.", [({}, memory["budget_bytes"])])
    out.family("infermux_memory_models_bytes", "gauge", "Memory used by loaded models.", [({}, memory["models_bytes"])])
    out.family("infermux_process_resident_bytes", "gauge", "Daemon resident memory.", [({}, memory["rss_bytes"])])


def _clients(out: Exposition, clients: dict) -> None:
    """What the daemon did about its clients: replies dropped, requests stalled, connections refused."""
    out.family("infermux_replies_dropped_total", "counter",
               "Replies dropped because the client's pipe was full (it does not read them).",
               [({}, clients["dropped_replies"])])
    out.family("infermux_requests_stalled_total", "counter",
               "Requests not computed because their client's replies were being dropped (dropped or 429).",
               [({}, clients["stalled_requests"])])
    out.family("infermux_requests_dropped_oversize_total", "counter",
               "Inference connections libzmq dropped unread for a frame over max_message_bytes + 64 KiB: "
               "their requests got no reply (the client should ask the daemon's limits first).",
               [({}, clients.get("dropped_oversize", 0))])
    out.family("infermux_connections_refused_total", "counter",
               f"New inference connections shut down at once: over max_connections with none silent for {SILENT_GRACE_S:g} s, "
               "or too near the fd limit.",
               [({}, clients["refused_connections"])])
    out.family("infermux_connections_idle_closed_total", "counter",
               f"Inference connections silent for {SILENT_GRACE_S:g} s, closed to make room for a new one at max_connections.",
               [({}, clients["idle_closed"])])
    out.family("infermux_connections", "gauge", "Live connections to the inference socket.",
               [({}, clients["connections"])])


def _frontend(out: Exposition, daemon: dict) -> None:
    """The frontend's refusals and shortcuts, its thread's CPU, errors and uptime."""
    out.family("infermux_replies_too_large_total", "counter",
               "Replies over max_reply_bytes: computed, dropped, answered 413 instead.",
               [({}, daemon["replies_too_large"])])
    out.family("infermux_requests_refused_oversize_total", "counter",
               "Requests answered 413 without computing: their connection's last request of the same shapes "
               "made a reply over max_reply_bytes moments before.",
               [({}, daemon["requests_refused_oversize"])])
    out.family("infermux_headers_from_layout_total", "counter",
               "Requests whose header was a known layout with another id: read by a comparison, not decoded.",
               [({}, daemon["headers_from_layout"])])
    out.family("infermux_express_requests_total", "counter",
               "Requests the express lane answered: received, looked up by their header layout and replied to "
               "from C, with one call into Python each.",
               [({}, daemon["express"]["served"])])
    frontend = daemon.get("frontend_thread") or {}
    out.family("infermux_frontend_thread_cpu_seconds_total", "counter",
               "CPU time of the frontend thread, which receives, parses and answers every request (and computes "
               "those of the fast path): its rate near 1 means that one thread limits the QPS.",
               [({}, float(frontend["cpu_s"]))] if frontend else [])
    out.family("infermux_internal_errors_total", "counter", "Errors logged with a traceback (500s among them).",
               [({}, daemon["internal_errors"])])
    out.family("infermux_uptime_seconds", "gauge", "Seconds since the daemon started.", [({}, float(daemon["uptime_s"]))])


STREAM_COUNTERS = (("requests", "received", "Requests of a stream (a model's or pipeline's key), as received."),
                   ("served", "served", "Requests of a stream served (200)."),
                   ("superseded", "superseded", "Requests of a stream replaced by a newer one of it before they "
                                                "were computed (409, queue_policy newest_per_key)."),
                   ("refused", "refused", "Requests of a stream refused: 429, 503 or 504."),
                   ("failed", "failed", "Requests of a stream answered with another error (400, 413, 500...)."),
                   ("replaced_by_client", "replaced_by_client", "Frames of a stream its client replaced by a newer "
                                                                "one before sending them (the requests' `replaced`)."))


def _streams(out: Exposition, server: "Daemon", chosen: StreamSeries) -> None:
    """Per stream: the busiest `stream_metrics_keys` keys of each model by name, the rest as key="other"
    (admin/streamseries.py); per model, how many streams there are and how many went silent."""
    series, models = chosen.select(server.streams, server.config.daemon.stream_metrics_keys)
    labels = lambda s: {"model": s.model, "key": s.key}  # noqa: E731
    for name, field, help_text in STREAM_COUNTERS:
        out.family(f"infermux_stream_{name}_total", "counter", help_text,
                   [(labels(s), getattr(s.totals, field)) for s in series])
    _age_summary(out, series, labels)
    named = [s for s in series if s.last_seen_s is not None]
    out.family("infermux_stream_last_seen_seconds", "gauge", "Seconds since a stream's last request.",
               [(labels(s), float(s.last_seen_s or 0.0)) for s in named])
    out.family("infermux_stream_silent", "gauge", "1 while a stream that was sending has sent nothing for "
               "stream_silent_s.", [(labels(s), int(bool(s.silent))) for s in named])
    out.family("infermux_streams", "gauge", "Streams (keys) of a model or pipeline the daemon tracks.",
               [({"model": m}, n.tracked) for m, n in models.items()])
    out.family("infermux_streams_silent", "gauge", "Streams of a model or pipeline that went silent.",
               [({"model": m}, n.silent) for m, n in models.items()])


def _age_summary(out: Exposition, series: list[Series], labels: Callable[[Series], dict]) -> None:
    """Receipt-to-reply age of served requests: quantiles over a stream's last served ones, _sum and _count
    over all (seconds)."""
    name = "infermux_stream_age_seconds"
    out.lines += [f"# HELP {name} Age of a stream's served requests, receipt to reply, seconds "
                  "(quantiles over its last 256).", f"# TYPE {name} summary"]
    for s in series:
        ordered = sorted(s.ages_ms)
        for q in (0.5, 0.99):
            value = percentile(ordered, q * 100)
            out.lines.append(f"{name}{_labels(**labels(s), quantile=f'{q:g}')} "
                             f"{_number(round(value / 1000, 6)) if value is not None else 'NaN'}")
        out.lines.append(f"{name}_sum{_labels(**labels(s))} {_number(s.totals.age_s)}")
        out.lines.append(f"{name}_count{_labels(**labels(s))} {s.totals.served}")
def _rollouts(out: Exposition, models: list[dict], events: EventCounter, mv: Callable[[dict], dict]) -> None:
    """Candidates shadowing live requests (swap/rollout.py), and how rollouts ended."""
    shadowing = [m for m in models if m.get("rollout")]
    out.family("infermux_rollout_agreement_ratio", "gauge", "Share of a candidate's shadowed requests that agree "
               "with the serving version so far.", [(mv(m), m["rollout"]["agreement"]) for m in shadowing])
    out.family("infermux_rollout_compared_requests", "gauge", "Requests a candidate has computed and compared.",
               [(mv(m), m["rollout"]["compared"]) for m in shadowing])
    out.family("infermux_rollout_shadow_requests", "gauge", "Comparisons after which a candidate is decided.",
               [(mv(m), m["rollout"]["shadow_requests"]) for m in shadowing])
    out.family("infermux_rollout_paused", "gauge", "1 while a candidate's mirroring is paused for lack of spare CPU "
               "(min_idle_cpu) or a busy frontend.",
               [(mv(m), 1 if m["rollout"]["paused"] else 0) for m in shadowing])
    out.family("infermux_rollout_not_mirrored_total", "counter", "Live requests not copied to a candidate: its "
               "queue was full (mirroring behind or paused).", [(mv(m), m["rollout"]["not_mirrored"]) for m in shadowing])
    names = {(m["name"],) for m in models}
    out.family("infermux_rollout_passed_total", "counter", "Candidates promoted after shadowing.",
               events.of("rollout_passed", names))
    out.family("infermux_rollout_failed_total", "counter", "Candidates refused after shadowing.",
               events.of("rollout_failed", names))


def _pipelines(out: Exposition, pipelines: list[dict]) -> None:
    """Frames per pipeline by status, and each step's runs and time (daemon/pipelines/stats.py)."""
    out.family("infermux_pipeline_frames_total", "counter", "Frames a pipeline answered, by status.",
               [({"pipeline": p["name"], "status": code}, n) for p in pipelines
                for code, n in p["frames"]["by_status"].items()])
    out.family("infermux_pipeline_refused_from_memory_total", "counter",
               "Frames a pipeline refused from memory: the same frame it refused (400/413) sent again.",
               [({"pipeline": p["name"]}, p.get("refused_from_memory", 0)) for p in pipelines])
    out.family("infermux_pipeline_regions_dropped_total", "counter",
               "Regions a pipeline dropped because their box or score was not a finite number.",
               [({"pipeline": p["name"]}, p.get("dropped_regions", 0)) for p in pipelines])
    _steps(out, [({"pipeline": p["name"], "step": name}, s) for p in pipelines for name, s in p["steps"].items()])


def _steps(out: Exposition, steps: list[tuple[dict, dict]]) -> None:
    """Each pipeline step's runs and time, what its re-inference did, the tracks it holds."""
    out.family("infermux_pipeline_step_runs_total", "counter", "Runs of a pipeline step, by status.",
               [({**labels, "status": code}, n) for labels, s in steps for code, n in s["by_status"].items()])
    out.family("infermux_pipeline_step_duration_seconds_total", "counter",
               "Cumulative time of a pipeline step's successful runs, seconds.",
               [(labels, s["sums_us"].get("total", 0.0) / 1e6) for labels, s in steps])
    out.family("infermux_pipeline_reinfer_regions_total", "counter",
               "Regions a re-inferred step computed, gave its track's last answer (reused), or skipped (no budget).",
               [({**labels, "outcome": outcome}, s["reinfer"][outcome]) for labels, s in steps if "reinfer" in s
                for outcome in ("computed", "reused", "skipped")])
    out.family("infermux_pipeline_tracked_streams", "gauge", "Streams a track step holds tracks for.",
               [(labels, s["tracking"]["streams"]) for labels, s in steps if "tracking" in s])
    out.family("infermux_pipeline_tracks", "gauge", "Tracks a track step holds, over its streams.",
               [(labels, s["tracking"]["tracks"]) for labels, s in steps if "tracking" in s])


def _gpus(out: Exposition, samples: list[hardware.GpuSample]) -> None:
    """Every GPU family, declared even on a box without a GPU (dashboards find the names)."""
    for field, name, help_text in GPU_FAMILIES:
        out.family(name, "gauge", help_text,
                   [({"gpu": s.gpu, "name": s.name}, float(value)) for s in samples
                    if (value := getattr(s, field)) is not None])


def _process_samples(server: "Daemon") -> list[hardware.ProcessSample]:
    """The daemon, and the worker process of every cold version that has one."""
    found = [hardware.process_sample("daemon", os.getpid())]
    for mv in server.registry.all_versions():
        worker = mv.worker_info()
        if worker is not None:
            found.append(hardware.process_sample(f"worker {mv.name}:{mv.version}", worker["pid"]))
    return [p for p in found if p is not None]


def _processes(out: Exposition, samples: list[hardware.ProcessSample]) -> None:
    out.family("infermux_process_cpu_seconds_total", "counter", "CPU time (user + system) of each infermux process.",
               [({"process": p.process, "pid": p.pid}, p.cpu_seconds) for p in samples])
    out.family("infermux_process_resident_memory_bytes", "gauge", "Resident memory of each infermux process.",
               [({"process": p.process, "pid": p.pid}, p.resident_bytes) for p in samples])


def _failures(by_status: dict[str, int]) -> list[tuple[str, int]]:
    """Error replies by reason, every known reason present (at 0 until it happens: see EventCounter.of)."""
    counts = Counter({reason: 0 for reason in FAILURE_REASONS.values()})
    for code, n in by_status.items():
        if code not in ("200", "409"):
            counts[FAILURE_REASONS.get(int(code), code)] += n
    return sorted(counts.items())


def _histogram(out: Exposition, models: list[dict], mv: Any) -> None:
    """Latency in seconds (base units: `promtool check metrics` rejects µs); the daemon counts in µs."""
    name = "infermux_inference_request_duration_seconds"
    out.lines += [f"# HELP {name} Latency of served requests in the daemon, seconds.", f"# TYPE {name} histogram"]
    bounds = [(str(us), f"{us / 1e6:g}") for us in LATENCY_BUCKETS_US] + [("+Inf", "+Inf")]
    for m in models:
        stats, labels = m["stats"], mv(m)
        counts = stats.get("latency_le_us", {})
        running = 0
        for bound_us, le in bounds:
            running += counts.get(bound_us, 0)
            out.lines.append(f"{name}_bucket{_labels(**labels, le=le)} {running}")
        out.lines.append(f"{name}_sum{_labels(**labels)} {_number(stats['sums_us'].get('total', 0.0) / 1e6)}")
        out.lines.append(f"{name}_count{_labels(**labels)} {running}")


class MetricsServer:
    """The HTTP port answering GET /metrics, /healthz and /readyz (httpd.py serves it)."""

    def __init__(self, server: "Daemon", port: int, host: str = "127.0.0.1",
                 gpu: hardware.GpuSource | None = None) -> None:
        self.server = server
        self.events = EventCounter()
        server.events.subscribe(self.events)
        self.streams = StreamSeries()
        self.liveness = Liveness()
        server.ticks.append(self.liveness.tick)  # the loop turn that also feeds the systemd watchdog
        self.gpu = gpu if gpu is not None else hardware.gpu_source()
        self.http = HttpServer(host, port, self.routes())
        self.port = self.http.port
        server.events.emit("listening", endpoint=f"http://{host}:{self.port}/metrics")

    def routes(self) -> dict[str, Route]:
        """Path -> what answers it: the exposition on the server's render thread, probes at once."""
        return {"/metrics": Route(lambda: (200, CONTENT_TYPE, render(self.server, self.events, self.gpu, self.streams)),
                                  slow=True),
                "/healthz": Route(lambda: _probe(self.liveness.verdict(self.server.stopping))),
                "/readyz": Route(lambda: _probe(readiness(self.server)))}

    def start(self) -> None:
        self.http.start()

    def stop(self) -> None:
        self.http.stop()


def _probe(verdict: Verdict) -> Reply:
    return verdict.status, PROBE_TYPE, verdict.reason + "\n"


def _sinks(out: Exposition, sinks: list[dict], pipelines: list[dict]) -> None:
    """Per sink: whether it delivers, its spool's backlog against its bound, delivered and dropped events
    (daemon/sinks/hub.py); per pipeline, the tracked objects' events it made (docs/events.md)."""
    labels = lambda s: {"sink": s["name"], "kind": s["kind"]}  # noqa: E731
    out.family("infermux_sink_up", "gauge", "1 while a sink delivers (its last delivery was acknowledged), "
               "0 while it fails.", [(labels(s), int(s["state"] == "up")) for s in sinks if s["state"] != "starting"])
    out.family("infermux_sink_backlog_events", "gauge", "Events waiting in a sink's spool.",
               [(labels(s), s["backlog"]) for s in sinks])
    out.family("infermux_sink_backlog_bytes", "gauge", "Bytes of the events waiting in a sink's spool.",
               [(labels(s), s["backlog_bytes"]) for s in sinks])
    out.family("infermux_sink_spool_max_events", "gauge", "A sink's spool bound in events (max_events): past it "
               "the oldest are dropped.", [(labels(s), s["max_events"]) for s in sinks])
    out.family("infermux_sink_spool_max_bytes", "gauge", "A sink's spool bound in bytes (max_mb).",
               [(labels(s), s["max_bytes"]) for s in sinks])
    out.family("infermux_sink_oldest_waiting_seconds", "gauge", "Age of the oldest event waiting in a sink's spool "
               "(0 when none waits).", [(labels(s), float(s["oldest_age_s"] or 0.0)) for s in sinks])
    out.family("infermux_sink_delivered_total", "counter", "Events a sink acknowledged.",
               [(labels(s), s["delivered"]) for s in sinks])
    out.family("infermux_sink_dropped_total", "counter", "Events dropped from a full spool (its oldest).",
               [(labels(s), s["dropped"]) for s in sinks])
    out.family("infermux_pipeline_events_total", "counter", "Tracked objects' events a pipeline made, by type.",
               [({"pipeline": p["name"], "type": kind}, n) for p in pipelines if "events" in p
                for kind, n in p["events"]["events"].items()])
