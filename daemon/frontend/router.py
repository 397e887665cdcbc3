"""The router: where each request goes, or why it is answered at once.

Policy, in order (docs/protocol.md#statuses): unknown model (404); version asked for
and missing (404, or the default version under `version_mismatch =
"fallback"`); which version serves (default, `weighted` split, or `hash`
on the request's key); not ready (503 with retry time, or the fallback);
inputs the engine does not accept (400); a deadline the queue cannot meet
or a full queue (the fallback, else 429); otherwise queued.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any

from infermux.config import COLD, MAX_FALLBACK_DEPTH, Config, RoutingConfig
from infermux.pipelines.runner import Pipeline
from infermux.execution import batcher
from infermux.execution.executor import Executor, ReplyFn
from infermux.execution.hashring import HashRing
from infermux.execution.job import ONLY_INPUT, Envelope, Job, internal_sink
from infermux.execution.placement import Admission, Placement
from infermux.execution.streams import HOLD_S, StreamTable, stream_key
from infermux.frontend.parsecache import MAX_LAYOUTS, Layout
from infermux.protocol import OPERATOR_RETRY_MS, ProtocolError, Status, dtype_name, encode_reply, error_header
from infermux.models.overrides import file_weights
from infermux.models.registry import Model, ModelVersion, Registry, State

log = logging.getLogger("infermux.router")

MAX_NAMED_PIPELINES = 8  # a 400 names this many pipelines that take frames, then says how many more


class Deferred(Exception):
    """A pipeline step's admission (Router.admit_step) needs a cold version's worker started, which
    the frontend thread alone does (Registry.on_demand): nothing was admitted; the frontend admits it."""


class Router:
    """Admits jobs to placements (placement.py); returns an error header for those it cannot."""

    def __init__(self, registry: Registry, config: Config, reply: ReplyFn,
                 streams: StreamTable | None = None) -> None:
        self.registry = registry
        self.streams = streams or StreamTable()  # per-stream accounting of clients' keyed requests
        self._reply = reply
        self._rings: dict[tuple[str, tuple[str, ...]], HashRing[str]] = {}
        self.routing: RoutingConfig = config.routing
        self.file_weights: dict[str, dict[str, int]] = {}  # model -> version -> weight the file gives
        self.pipelines: dict[str, Pipeline] = {}  # addressed like models (daemon/pipelines/)
        self._accepted: dict[int, tuple[Layout, Any]] = {}  # id(layout) -> (layout, engine that accepts it)
        self._step: Job | None = None  # the pipeline step being admitted off the frontend thread (admit_step)
        # Pipelines' steps send the same tensors frame after frame: (engine, their names, dtypes and
        # shapes) that an engine accepted, so that `_check_tensors` is not done again for each frame.
        # Keyed by the engine's identity, with the engine kept so that its id is not reused.
        self._steps_accepted: dict[tuple[int, tuple[tuple[str, str, tuple[int, ...]], ...]], Any] = {}
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Route as `config` says (at start, and on every reload): its `[routing]` table, and the
        versions' weights the file gives; an operator's live weights (the registry's overrides)
        count over them until the file changes that weight or `ctl reset`."""
        self.routing, self.file_weights = config.routing, file_weights(config)
        self.bound_keys = config.daemon.stream_keys == "bound"  # a key is its first connection's (streams.py)

    def weights(self, name: str) -> dict[str, int]:
        """Version -> weight of model `name` for `weighted` routing: the file's, live ones over them."""
        return self.registry.overrides.weights_of(name, self.file_weights)

    # -- admission ---------------------------------------------------------

    def admit(self, job: Job) -> dict[str, Any] | None:
        """Queue `job` somewhere; None if queued, else the error header to send."""
        try:
            self._track(job)
            self._admit(job)
            return None
        except ProtocolError as exc:
            self._count(job, exc.status)
            return error_header(exc.status, exc.message, job.request.id, retry_after_ms=exc.retry_after_ms)

    def admit_step(self, job: Job) -> dict[str, Any] | None:
        """`admit` for a pipeline's model step, on the pipeline's thread (Server.admit_step holds the
        lock that makes these one at a time and that `quiesce` waits for). Every policy is the same;
        where it would have to start a cold version's worker, it raises Deferred, having admitted nothing."""
        self._step = job
        try:
            return self.admit(job)
        finally:
            self._step = None

    def _on_demand(self, job: Job, mv: ModelVersion) -> None:
        """Registry.on_demand, or Deferred where `job` is a step admitted off the frontend thread and
        the version is a cold one not loading (its worker must be started, by the frontend)."""
        if job is self._step and mv.config.placement == COLD and mv.state in (State.UNLOADED, State.FAILED):
            raise Deferred(mv.name)
        self.registry.on_demand(mv)

    def admit_fast(self, job: Job, layout: Layout | None = None) -> bool:
        """Serve `job` at once if nothing about it needs deciding; False, having done nothing, if
        something does (then `admit` takes it).

        The common request: no version asked for, a model and context `idle` offers, and inputs the
        version accepts; the context answers it 504 (or its fallback does) if its time is up. Those checks are the general path's, in its order, without the
        steps that cannot apply: pipelines, fallback and deadline decisions, batching holds, queues.
        A keyed request is counted on its stream here too (`_track`, once). `layout`: the header
        layout the request was read from (parsecache.py), whose tensors, once accepted by an
        engine, are not checked against it again.
        """
        req = job.request
        if req.version is not None or (self.bound_keys and req.key is not None):  # whose key: the general path's
            return False
        fast = self.idle(req.model, batcher.rows(req.inputs), req.key)
        if fast is None:
            return False
        mv, executor = fast
        job.deadline_ns = job.received_ns + (req.timeout_ms or mv.config.timeout_ms) * 1_000_000
        if not self.accepts(layout, mv):
            try:
                self._check_tensors(mv, job)
            except ProtocolError:
                return False
            self._accept(layout, mv)
        job.target = mv
        self._track(job)  # a stream's request served here is counted as on the general path
        if not executor.compute(job):
            return False
        mv.last_used = time.monotonic()
        return True

    def idle(self, name: str, rows: int, key: Any = None) -> tuple[ModelVersion, Executor] | None:
        """Where a request for model `name` (no version asked for) of `rows` rows and `key` is computed
        at once, nothing about it needing deciding: the version that serves the model's plain requests
        (no fallback, and its one version, or its least_queue default, ready) and the idle context its
        placement offers (Placement.idle_context; a cold one offers none); None where the general
        path must decide. The one question the fast path asks, for admit_fast and the express lane
        (express.py) alike."""
        model = self.registry.models.get(name)
        if model is None or model.fallback or name in self.pipelines:
            return None
        if len(model.ordered()) > 1 and model.pinned is None and self.strategy(model) != "least_queue":
            return None
        mv = model.default()
        if mv is None or mv.state is not State.READY or mv.placement is None:
            return None
        executor = mv.placement.idle_context(rows, key)
        return None if executor is None else (mv, executor)

    def accepts(self, layout: Layout | None, mv: ModelVersion) -> bool:
        """Whether `mv`'s engine accepted the tensors of `layout`'s requests already (_accept)."""
        return layout is not None and self._accepted.get(id(layout)) == (layout, mv.engine)

    def _accept(self, layout: Layout | None, mv: ModelVersion) -> None:
        """Remember that `mv`'s engine accepts the tensors of `layout`'s requests: a layout fixes their
        names, dtypes, shapes and the outputs asked for, all that `_check_tensors` reads of a client's
        request. Keyed by identity, with the layout kept so that its id is not reused."""
        if layout is None or mv.engine is None:
            return
        if len(self._accepted) >= MAX_LAYOUTS:  # as many as the parse keeps; starts over when full
            self._accepted.clear()
        self._accepted[id(layout)] = (layout, mv.engine)

    def _track(self, job: Job) -> None:
        """Count a client's keyed request on its stream (once: admit_fast, then admit if that declined);
        it is answered where it is answered (Job.answered). Under stream_keys = "bound", 403 for a key
        another client holds (_owner)."""
        req = job.request
        envelope = job.reply_to
        if job.stream is None and req.key is not None and isinstance(envelope, list) and \
                (req.model in self.pipelines or self.registry.model(req.model) is not None):
            owner = _owner(envelope) if self.bound_keys else None
            if owner is not None and self.streams.foreign(req.model, req.key, owner):
                hold = f"{self.streams.silent_s or HOLD_S:g} s"
                raise ProtocolError(Status.FORBIDDEN, f"stream key {stream_key(req.key)[:64]!r} of {req.model!r} "
                                    f"belongs to another client until it has sent nothing for {hold} "
                                    "([daemon] stream_keys = \"bound\"); send your own key")
            job.stream = self.streams.receive(req.model, req.key, owner, req.replaced)

    def _count(self, job: Job, status: int) -> None:
        """Record a reply no executor saw on the chosen version's statistics, and on the request's stream."""
        if job.target is not None:
            job.target.stats.router.record(int(status), (time.perf_counter_ns() - job.received_ns) // 1000)
        job.answered(int(status))

    def _admit(self, job: Job) -> None:
        """Route `job` (the policy in the module's docstring) and submit it to the chosen version's
        placement, or to a fallback; raises ProtocolError with the reply for one it refuses."""
        req = job.request
        pipeline = self.pipelines.get(req.model)
        if pipeline is not None:  # its threads run the steps; each model step comes back through here
            pipeline.submit(job)
            return
        model = self.registry.model(req.model)
        if model is None:
            names = ", ".join(sorted([*self.registry.models, *self.pipelines])) or "none"
            raise ProtocolError(Status.NOT_FOUND, f"unknown model {req.model!r}; served models: {names}")
        mv = self._choose_version(model, job)
        job.target = mv
        if not job.deadline_ns:
            job.deadline_ns = job.received_ns + (job.request.timeout_ms or mv.config.timeout_ms) * 1_000_000
        if not mv.ready:
            self._unready(job, model, mv)
            return
        self._check_tensors(mv, job)
        placement = mv.placement
        if placement is None:  # unloaded between the state check and here
            raise _retry(Status.NOT_READY, f"model {mv.name!r} version {mv.version!r} is {mv.state.value}",
                         mv.eta_ms())
        if model.fallback and placement.expected_wait_us() > job.remaining_us():
            if self._fallback(job, model, "deadline"):
                return
        admitted = placement.submit(job)
        if admitted is Admission.FULL and self._push_out(job, mv, placement):
            return
        if admitted is not Admission.QUEUED:
            self._refused(job, model, mv, placement, admitted)
        mv.last_used = time.monotonic()

    def _unready(self, job: Job, model: Model, mv: ModelVersion) -> None:
        """The version chosen for `job` is not ready: start it on demand (a cold one's worker), then its
        fallback serves, else 503 with the time to retry after; an unloaded hot one stays so (_unloaded)."""
        self._on_demand(job, mv)
        if mv.state is State.UNLOADED:  # hot, unloaded by an operator: it stays so
            self._unloaded(job, model, mv)
            return
        if model.fallback and self._fallback(job, model, "not_ready"):
            return
        raise _not_ready(mv, mv.state.value)

    def _unloaded(self, job: Job, model: Model, mv: ModelVersion) -> None:
        """An unloaded hot version does not come back by itself: its fallback serves
        (`reason: unloaded`), else the 503 says so and why the fallback did not serve."""
        why = self._fallback_why(job, model, "unloaded") if model.fallback else "it has no fallback"
        if why is None:
            return
        stays = f" ({mv.reason})" if mv.reason else \
            f" and does not come back by itself (`infermux ctl load {mv.name}` loads it)"
        # As for a failed version: only an operator brings it back, so the
        # client is told to rest (and a failover client to use another box).
        raise _retry(Status.NOT_READY, f"model {mv.name!r} version {mv.version!r} is unloaded{stays}; {why}",
                     OPERATOR_RETRY_MS)

    def _refused(self, job: Job, model: Model, mv: ModelVersion, placement: Placement,
                 admitted: Admission) -> None:
        """The placement did not take `job`: the fallback, else 429 (full) or 503 (closed: it is
        stopping, or its worker ended and restarts on demand)."""
        reason = "queue_full" if admitted is Admission.FULL else "not_ready"
        if model.fallback and self._fallback(job, model, reason):
            return
        if admitted is Admission.CLOSED or not mv.ready:
            self._on_demand(job, mv)
            raise _not_ready(mv, mv.state.value if not mv.ready else "restarting")
        raise _retry(Status.TOO_MANY, f"model {mv.name!r} queue is full ({placement.settings().max_queue} "
                     f"requests); retry later", self._retry_ms(placement))

    def _choose_version(self, model: Model, job: Job) -> ModelVersion:
        req = job.request
        if req.version is not None:
            mv = model.versions.get(req.version)
            if mv is not None:
                return mv
            known = ", ".join(v.version for v in model.ordered())
            if self.routing.version_mismatch == "reject":
                raise ProtocolError(Status.NOT_FOUND, f"model {model.name!r} has no version "
                                    f"{req.version!r}; versions: {known}")
            job.fallback = {"from": model.name, "reason": "version", "version": req.version}
        strategy = self.strategy(model)
        ready = model.ready_versions()
        if model.pinned is None and len(ready) > 1:
            if strategy == "weighted":
                picked = self._weighted(model, ready)
                if picked is not None:
                    return picked
            elif strategy == "hash" and req.key is not None:
                return self._hashed(model, ready, str(req.key))
        default = model.default()
        assert default is not None  # a Model always has at least one version
        return default

    def traffic_share(self, model: Model, version: str) -> float | None:
        """The percentage of requests without a version that `version` of `model` gets now, as
        `_choose_version` routes them; None under `hash`, where each key's requests go to one version."""
        ready = model.ready_versions()
        if model.pinned is None and len(ready) > 1:
            strategy = self.strategy(model)
            if strategy == "hash":
                return None
            if strategy == "weighted":
                weights = self.weights(model.name)
                total = sum(weights.get(mv.version, 0) for mv in ready)
                if total > 0:
                    mine = weights.get(version, 0) if any(mv.version == version for mv in ready) else 0
                    return 100.0 * mine / total
        default = model.default()
        return 100.0 if default is not None and default.version == version else 0.0

    def strategy(self, model: Model) -> str:
        return model.strategy(self.routing.strategy)

    def _weighted(self, model: Model, ready: list[ModelVersion]) -> ModelVersion | None:
        weights = self.weights(model.name)
        pool = [(mv, weights.get(mv.version, 0)) for mv in ready]
        total = sum(w for _, w in pool)
        if total <= 0:
            return None
        point = random.random() * total
        for mv, weight in pool:
            point -= weight
            if point < 0:
                return mv
        return pool[-1][0]

    def _hashed(self, model: Model, ready: list[ModelVersion], key: str) -> ModelVersion:
        names = tuple(mv.version for mv in ready)
        ring = self._rings.get((model.name, names))
        if ring is None:
            ring = self._rings[(model.name, names)] = HashRing(list(names))
        return model.versions[ring.lookup(key)]

    def _check_tensors(self, mv: ModelVersion, job: Job) -> None:
        engine = mv.engine
        if engine is None:
            return
        inputs = job.request.inputs
        step = None
        if job is self._step and ONLY_INPUT not in inputs and job.request.outputs is None:
            step = (id(engine), tuple((n, a.dtype.str, a.shape) for n, a in inputs.items()))
            if self._steps_accepted.get(step) is engine:
                return
        self._check_inputs(mv, job, engine, inputs)
        if step is not None:
            if len(self._steps_accepted) >= MAX_LAYOUTS:  # starts over when full, as `_accepted`
                self._steps_accepted.clear()
            self._steps_accepted[step] = engine

    def _check_inputs(self, mv: ModelVersion, job: Job, engine: Any, inputs: dict[str, Any]) -> None:
        """ProtocolError 400 unless `engine` takes `inputs` (and has the outputs asked for)."""
        names = {s.name for s in engine.inputs}
        if ONLY_INPUT in inputs and len(inputs) == len(names) == 1 and internal_sink(job.reply_to) is not None:
            inputs[engine.inputs[0].name] = inputs.pop(ONLY_INPUT)  # the version is chosen: its name
        if set(inputs) != names:
            raise ProtocolError(Status.BAD_REQUEST, f"model {mv.name!r} takes inputs "
                                f"{sorted(names)}, got {sorted(inputs)}{self._frames_go_to_pipelines(job)}")
        for spec in engine.inputs:
            array = inputs[spec.name]
            problem = spec.accepts(dtype_name(array.dtype), array.shape)
            if problem:
                raise ProtocolError(Status.BAD_REQUEST, f"model {mv.name!r}: {problem}"
                                    f"{self._frames_go_to_pipelines(job)}")
        wanted = job.request.outputs
        if wanted is not None:
            have = {s.name for s in engine.outputs}
            missing = [o for o in wanted if o not in have]
            if missing:
                raise ProtocolError(Status.BAD_REQUEST, f"model {mv.name!r} has no output {missing[0]!r}; "
                                    f"outputs: {sorted(have)}")

    def _frames_go_to_pipelines(self, job: Job) -> str:
        """For a refused model request that sent a camera frame (an input entry with a "format"):
        that frames go to pipelines, and which pipelines this daemon has; "" for plain tensors."""
        sent = frame_inputs(job)
        if not sent:
            return ""
        said = f"; input {sent[0]!r} is a camera frame (it has a \"format\"): a model takes tensors, a pipeline " \
               f"takes frames, so send it to a pipeline"
        if not self.pipelines:
            return said + " (this daemon has none: docs/pipelines.md says how to add one)"
        named = [f"{name!r} (input {p.config.input!r})" for name, p in sorted(self.pipelines.items())]
        more = len(named) - MAX_NAMED_PIPELINES
        listed = ", ".join(named[:MAX_NAMED_PIPELINES]) + (f" and {more} more" if more > 0 else "")
        return f"{said}; pipelines that take frames: {listed}"

    # -- degradation -------------------------------------------------------

    def _fallback(self, job: Job, model: Model, reason: str) -> bool:
        """Send `job` to `model`'s fallback; False if the chain is exhausted or it fails there."""
        return self._fallback_why(job, model, reason) is None

    def _fallback_why(self, job: Job, model: Model, reason: str) -> str | None:
        """Send `job` to `model`'s fallback; None once it is admitted there, else why it was not."""
        if job.hops >= MAX_FALLBACK_DEPTH:
            return f"the fallback chain is longer than {MAX_FALLBACK_DEPTH}"
        target = self.registry.model(model.fallback)
        if target is None:
            return f"its fallback {model.fallback!r} is not served"
        previous = (job.fallback, job.request.model, job.request.version, job.hops, job.target)
        job.fallback = {"from": (job.fallback or {}).get("from", job.request.model), "reason": reason}
        job.request.model, job.request.version, job.hops = target.name, None, job.hops + 1
        try:
            self._admit(job)
            return None
        except Deferred:  # the frontend admits it from the start: as it was
            job.fallback, job.request.model, job.request.version, job.hops, job.target = previous
            raise
        except ProtocolError as exc:
            job.fallback, job.request.model, job.request.version, job.hops, job.target = previous
            return f"its fallback {target.name!r} did not take the request ({int(exc.status)}: {exc.message})"

    def _push_out(self, job: Job, mv: ModelVersion, placement: Placement) -> bool:
        """Per-key fairness at a full queue (Placement.push_out): queue `job` in place of the
        flooding key's newest request, which is refused as if it had found the queue full."""
        victim = placement.push_out(job)
        if victim is None:
            return False
        queued = placement.submit(job) is Admission.QUEUED
        model = self.registry.model(victim.request.model)
        if not (model is not None and model.fallback and self._fallback(victim, model, "queue_full")):
            self._count(victim, Status.TOO_MANY)
            header = error_header(Status.TOO_MANY, f"model {mv.name!r} queue is full and key "
                                  f"{victim.request.key!r} holds the most of it; retry later",
                                  victim.request.id, retry_after_ms=self._retry_ms(placement))
            self._reply(victim.reply_to, encode_reply(header))
        if queued:
            mv.last_used = time.monotonic()
        return queued

    def on_late(self, job: Job) -> None:
        """An executor found `job` past its deadline: the fallback gets a fresh budget, else 504."""
        model = self.registry.model(job.request.model)
        waited_ms = (time.perf_counter_ns() - job.received_ns) / 1e6
        if model is not None and model.fallback:
            target = self.registry.model(model.fallback)
            fallback_default = target.default() if target else None
            if fallback_default is not None:
                job.deadline_ns = time.perf_counter_ns() + fallback_default.config.timeout_ms * 1_000_000
                if self._fallback(job, model, "deadline"):
                    return
        self._count(job, Status.DEADLINE)
        # A request the fallback could not serve in time either still says where it was sent.
        header = error_header(Status.DEADLINE, f"deadline passed after {waited_ms:.1f} ms waiting for "
                              f"model {job.request.model!r}; not computed", job.request.id,
                              fallback=job.fallback)
        self._reply(job.reply_to, encode_reply(header))

    @staticmethod
    def _retry_ms(placement: Placement) -> int:
        """Retry-After for a full queue: the time to work through it, at least 1 ms."""
        return max(1, int(placement.expected_wait_us() / 1000))



def frame_inputs(job: Job) -> list[str]:
    """Names of a client request's inputs that its header declares camera frames (a "format" in
    their entry, as `protocol.Frame` sends them); [] for an internal request or plain tensors.
    Only asked on the way to a 400: the header was bounded and parsed once already."""
    envelope = job.reply_to
    if not isinstance(envelope, list) or len(job.frames) <= len(envelope):
        return []
    try:
        entries = json.loads(bytes(job.frames[len(envelope)])).get("inputs")
    except (ValueError, AttributeError, TypeError):
        return []
    return [e["name"] for e in entries or () if isinstance(e, dict) and "format" in e and isinstance(e.get("name"), str)]


def _not_ready(mv: ModelVersion, state: str) -> ProtocolError:
    """503 with the time to retry after, and why."""
    return _retry(Status.NOT_READY, f"model {mv.name!r} version {mv.version!r} is {state}"
                  + (f" ({mv.reason})" if mv.reason else "") + "; retry later", mv.eta_ms())


def _retry(status: Status, message: str, retry_after_ms: int) -> ProtocolError:
    return ProtocolError(status, message, retry_after_ms=int(retry_after_ms))


def _owner(envelope: Envelope) -> Any:
    """Who holds the keys a request sends under stream_keys = "bound": its CURVE client's key where the
    frontend read one, else its connection (the envelope: the ROUTER's identity of the connection, and
    those of any proxies before it)."""
    user = getattr(envelope, "user", None)
    return ("curve", user) if user else tuple(bytes(frame) for frame in envelope)
