"""Shadow rollout (docs/hot-swap.md#shadow-rollout): a published version earns its traffic before it serves.

For a model with a `[models.rollout]` table, the swapper does not switch a
newly published engine in: it loads it beside the serving version as the
model's **candidate** (`Switch.load_beside`; state `candidate`, in no routing
table) and starts a `Rollout` here. Whatever the model's placement, the
candidate is loaded cold, in a worker process of its own whose every thread
runs at nice 19 from before its engine loads (workers/pool.py): a low
priority thread inside the daemon would share the interpreter lock and the
address space with the frontend, and its clients would pay for both. The
frontend hands over a copy of live requests of the model (inputs, and the
answer the serving version gave: frontend/mirror.py); the `shadow` thread
sends each to the candidate's worker (never through the router: no client
can receive it), waits, and compares the answers (models/agreement.py).
After `shadow_requests` comparisons the candidate is promoted: the version
is loaded afresh at the model's own configuration (its placement and its
nice) beside what serves, switched in (`rollout_passed`; the swapper
retires what it replaced), and the candidate's worker stops; if that load
fails the candidate is refused with its reason. Else it is refused
(`rollout_failed`: the agreement, the worst disagreement and its request's
input shapes; the version's state says why and the serving version stays).
`promote_now` and `reject` decide early.

Mirroring never costs a client: a copy is taken only while the rollout's
queue has room (else the request is just counted as not mirrored), the
candidate computes one request at a time at the lowest CPU priority, and
its time is the CPU its worker process used meanwhile (what a busy box kept
a nice-19 process waiting is not the engine's), and mirroring waits while
every context of the serving version is busy, while less than
`min_idle_cpu` of the CPUs' time is idle (/proc/stat), or while the
frontend thread worked more than half its time: it takes spare CPU only
(`min_idle_cpu = 0` turns both spare-capacity gates off). A candidate slower
than the serving version on a request is paced to PACE_SHARE of the wall time. Whether it is paused is said from the last half second, looked at
every 50 ms: paused once most looks found it had to wait (`rollout_paused`),
resumed once few did (`rollout_resumed`); the reason (the one most of
those looks found) shows in the candidate's state. So a box at its capacity gets two events, not one per
request.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from infermux.config import COLD, MAX_NICE, ModelConfig, RolloutConfig
from infermux.events import EventLog
from infermux.execution.job import Internal, Job
from infermux.execution.placement import Admission
from infermux.models import life
from infermux.models.agreement import Rule, Verdict, compare, compare_regions
from infermux.models.registry import Registry
from infermux.models.verdicts import Decisions
from infermux.models.version import ModelVersion, State
from infermux.pipelines.calls import StepCall, StepFailed
from infermux.swap.gate import Measures, judge
from infermux.swap.probes import CpuIdle, LoopBusy, MemoryProbe, WorkerCpu
from infermux.protocol import Request

log = logging.getLogger("infermux.rollout")

REJECTED = "rejected by an operator"
QUEUE = 4            # samples waiting for the shadow thread, per rollout; more live requests are not copied
MIRROR_TIMEOUT_S = 10.0
NO_DEADLINE_NS = 3600 * 10**9
LOOK_S = 0.05        # how often the shadow thread looks whether the serving version is busy
LOOKS = 10           # the looks `paused` is decided on: the last half second
PAUSE_AT, RESUME_AT = 8, 2  # busy looks of LOOKS that pause mirroring, and that resume it
PAUSE_EVENTS_S = 60.0  # at most one rollout_paused (and its rollout_resumed) per candidate this often
FRONTEND_BUSY = 0.5  # mirroring waits while the frontend thread worked more than this share of its time
PACE_SHARE = 0.05  # a candidate slower than the serving version computes at most this share of the wall time
PACE_MAX_S = 2.0   # and waits at most this long after one request: a very slow one is still judged soon


@dataclass
class Sample:
    """One live request as the serving version answered it."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    version: str
    serving_us: int = 0  # the serving version's compute time for it (its reply's timing_us)


@dataclass
class Computed:
    """The candidate's answer to one sample, and what it cost."""

    outputs: dict[str, np.ndarray]
    error: str = ""
    compute_us: int = 0
    memory_bytes: int | None = None  # the most it was measured to hold meanwhile; None where it cannot be told
    cpu_timed: bool = False  # compute_us is at most the CPU its worker took: no busy box's wait in it


@dataclass
class Rollout:
    """One candidate and how its comparisons went."""

    candidate: ModelVersion
    own: ModelConfig  # the version at the model's own placement and nice: what is loaded once it passes
    config: RolloutConfig
    replaces: ModelVersion | None  # the entry of the candidate's own version it would replace, if any
    digest: str = ""  # sha256 of its engine file: what its verdict is kept under (models/verdicts.py)
    measures: Measures = field(default_factory=Measures)  # its times beside the serving version's, its memory
    queue: deque[Sample] = field(default_factory=lambda: deque(maxlen=QUEUE))
    compared: int = 0
    agreed: int = 0
    not_mirrored: int = 0  # live requests not copied: the queue was full (the shadow thread is behind or paused)
    paused: str = ""  # why mirroring is paused, as said; "" when it goes on
    looks: deque[str] = field(default_factory=lambda: deque(maxlen=LOOKS))  # why it was busy at each look
    looked: float = 0.0
    paced_until: float = 0.0  # no mirroring before this (monotonic): the candidate was slower than the serving version
    computing_s: float = 0.0  # the candidate's compute time over every comparison
    said_paused: float = -math.inf  # when `rollout_paused` was last said
    unsaid: int = 0  # pauses since then that no event said (a box at its capacity comes and goes)
    told: bool = False  # the current pause was said: its end is said too
    worst: tuple[Verdict, str] | None = None  # the worst disagreement and its request's input shapes
    decided: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.candidate.name

    def rule(self) -> Rule:
        c = self.config
        return Rule(c.compare, c.rtol, c.atol, c.iou)

    def agreement(self) -> float:
        return self.agreed / self.compared if self.compared else 1.0

    def progress(self) -> str:
        """The candidate's `reason` while it shadows."""
        text = (f"shadowing: {self.compared}/{self.config.shadow_requests} compared, {self.agreement():.2%} agree "
                f"(needs {self.config.min_agreement:.2%})")
        return f"{text}; mirroring paused: {self.paused}" if self.paused else text

    def view(self) -> dict[str, Any]:
        return {"compared": self.compared, "shadow_requests": self.config.shadow_requests, "agreed": self.agreed,
                "agreement": round(self.agreement(), 6), "min_agreement": self.config.min_agreement,
                "compare": self.config.compare, "not_mirrored": self.not_mirrored, "paused": self.paused,
                "worst": self.worst[0].detail if self.worst else "", "max_latency_ratio": self.config.max_latency_ratio,
                "max_memory_mb": self.config.max_memory_mb, "computing_s": round(self.computing_s, 3),
                "shadowing_s": round(time.monotonic() - self.started, 3), **self.measures.view()}


class Rollouts:
    """The rollouts of one daemon, at most one per model, and the `shadow` thread that mirrors for them.

    `refused(candidate, reason)` tells the swapper a candidate's file must not be tried again;
    `promoted(name)` tells it to retire what the candidate replaced; `retried(name, version)` that an
    operator wants a refused version shadowed again. Every verdict is kept in `decisions`.
    """

    def __init__(self, registry: Registry, events: EventLog, decisions: Decisions | None = None) -> None:
        self.registry, self.events = registry, events
        self.decisions = decisions if decisions is not None else Decisions(None, events)
        self.retried: Callable[[str, str], None] = lambda name, version: None
        self.by_model: dict[str, Rollout] = {}  # read by the frontend without a lock (one assignment)
        self.refused: Callable[[ModelVersion, str], None] = lambda mv, why: None
        self.promoted: Callable[[str], None] = lambda name: None
        self._cpu = CpuIdle()
        self.frontend = LoopBusy()  # the frontend thread adds the time of each of its turns (server.py)
        self._lock = threading.Lock()
        self._bell = threading.Event()
        self._stopping = False
        # The shadow thread, which looks for the moments the serving version is idle and compares, keeps
        # the daemon's priority (at nice 19 on a busy box it would seldom look at the right moment); what
        # computes a candidate is its worker process, at nice 19.
        self._thread = threading.Thread(target=self._run, name="shadow", daemon=True)
        self._thread.start()

    # -- starting and deciding ------------------------------------------------------------

    def load(self, config: ModelConfig) -> ModelVersion:
        """A candidate for `config`, loaded beside what serves (`Switch.load_beside`) as a cold version at the
        lowest CPU priority, whatever the model's placement: in a worker process of its own, every thread of
        which runs at nice 19 from before its engine loads (workers/pool.py), so its set-up, warm-up and
        comparisons take spare CPU only and share neither the interpreter lock nor the address space with
        the frontend. Check `.ready`."""
        return self.registry.switch.load_beside(replace(config, placement=COLD, nice=MAX_NICE))

    def start(self, candidate: ModelVersion, own: ModelConfig, digest: str = "") -> None:
        """`candidate` (loaded by `load`; `own` the version's configuration, with its rollout table, at the
        model's own placement; `digest` its engine file's sha256) shadows its model from now on; an earlier
        candidate of the model is cancelled."""
        config = own.rollout
        if config is None:
            raise ValueError(f"{own.name}:{own.version} has no rollout table")
        model = self.registry.model(candidate.name)
        if model is None:
            self.registry.unload(candidate, reason="its model is gone")
            return
        previous = self.by_model.get(candidate.name)
        if previous is not None:
            self._end(previous, f"superseded by a newer candidate, version {candidate.version}", cancel=True)
        candidate.state = State.CANDIDATE
        listed = model.versions.get(candidate.version)
        if listed is not None and not listed.ready:  # its earlier failure: the version is listed once, as candidate
            self.registry.discard(listed)
            listed = None
        rollout = Rollout(candidate, own, config, listed, digest)
        rollout.measures.held(MemoryProbe(candidate).held())  # what its load left (its warm-up's peak), read
        candidate.reason = rollout.progress()  # before the shadow thread can take a sample of it
        model.candidate = candidate
        with self._lock:
            self.by_model = {**self.by_model, candidate.name: rollout}
        self._bell.set()  # the shadow thread sleeps while no candidate shadows: it has one to look at
        life.say(self.events, candidate, "rollout_started", shadow_requests=config.shadow_requests,
                         compare=config.compare, min_agreement=config.min_agreement)
        if rollout.measures.memory_known:  # its load's peak over max_memory_mb already: refused before it compares
            self._judge(rollout)

    def candidate_of(self, name: str, version: str) -> Rollout:
        rollout = self.by_model.get(name)
        if rollout is None or rollout.candidate.version != version:
            held = f"its candidate is version {rollout.candidate.version}" if rollout else "it has no candidate"
            raise ValueError(f"{name}:{version} is not a candidate ({held})")
        return rollout

    def promote_now(self, name: str, version: str) -> str:
        rollout = self.candidate_of(name, version)
        self._decide(rollout, passed=True, why="promoted by an operator")
        if rollout.decided != "passed":  # it failed to load at the model's own placement
            raise ValueError(f"{name}:{version} was refused: {rollout.candidate.reason}")
        return f"{name}:{version} serves (promoted after {rollout.compared} comparisons)"

    def reject(self, name: str, version: str) -> str:
        rollout = self.candidate_of(name, version)
        self._decide(rollout, passed=False, why=REJECTED)
        return f"{name}:{version} refused; the serving version stays"

    def retry(self, name: str, version: str) -> str:
        """An operator's `retry`: forget the verdict on `version` of `name`, so that it shadows again."""
        if self.registry.model(name) is None:
            raise ValueError(f"unknown model {name!r}; models: {', '.join(sorted(self.registry.models)) or 'none'}")
        if not self.decisions.take_back(name, version):
            raise ValueError(f"{name}:{version} has no verdict to take back (only a refused or rejected version "
                             "is retried)")
        model = self.registry.model(name)
        life.say_or_emit(self.events, model.versions.get(version) if model else None, name, version, "rollout_retry",
                         reason="asked by an operator")
        self.retried(name, version)
        return f"{name}:{version} will shadow again once it loads"

    def cancel(self, name: str, why: str) -> None:
        """The candidate's file went away or a pin leaves it out: unload it, decide nothing."""
        rollout = self.by_model.get(name)
        if rollout is not None:
            self._end(rollout, why, cancel=True)

    def _decide(self, rollout: Rollout, passed: bool, why: str = "") -> None:
        with self._lock:
            if rollout.decided or self.by_model.get(rollout.name) is not rollout:
                return
            rollout.decided = "passed" if passed else "failed"
            self.by_model = {m: r for m, r in self.by_model.items() if r is not rollout}
        if passed:
            self._promote(rollout, why)
        else:
            self._refuse(rollout, why)

    def _promote(self, rollout: Rollout, why: str) -> None:
        """The version loaded afresh at the model's own placement and priority, switched in, and the
        candidate's worker stopped; refused with the load's reason if that load fails (what serves stays)."""
        candidate = rollout.candidate
        promoted = self.registry.switch.load_beside(rollout.own, like=candidate)
        if not promoted.ready:
            rollout.decided = "failed"
            self._refuse(rollout, f"rollout passed, but the version failed to load at its own placement: "
                                  f"{promoted.reason}")
            return
        life.say(self.events, candidate, "rollout_passed", agreement=round(rollout.agreement(), 4),
                 compared=rollout.compared, **({"reason": why} if why else {}))
        self.decisions.record(candidate.name, candidate.version, rollout.digest, "passed", why)
        model = self.registry.model(candidate.name)
        promoted.memory_bytes = promoted.memory_bytes or candidate.memory_bytes
        try:
            previous = self.registry.switch.switch(promoted, "promoted")
        except ValueError as exc:  # unloaded meanwhile (an operator's unload, memory)
            life.say(self.events, candidate, "failed", reason=f"promotion failed: {exc}")
            previous = None
        if model is not None and model.candidate is candidate:
            model.candidate = None
        life.say(self.events, promoted, "swapped", reason="rollout passed")
        self.registry.unload(candidate, self.registry.config.daemon.drain_timeout_s,
                             reason="promoted: its version serves at its own placement")
        if previous is not None:
            self.registry.switch.drain(previous, "replaced by its candidate")
        self.registry.check_fallbacks(candidate.name)
        self.promoted(candidate.name)

    def _refuse(self, rollout: Rollout, why: str) -> None:
        candidate = rollout.candidate
        shapes = rollout.worst[1] if rollout.worst else ""
        worst = rollout.worst[0].detail if rollout.worst else ""
        reason = why or (f"rollout failed: {rollout.agreement():.2%} of {rollout.compared} shadowed requests agree, "
                         f"{rollout.config.min_agreement:.2%} needed ({rollout.rule().describe()})")
        if worst and reason.startswith("rollout failed"):  # the gate's, not an operator's: where it went wrong
            reason += f"; worst: {worst}, inputs {shapes}"
        self._end(rollout, reason)
        outcome = "rejected" if why == REJECTED else "refused"
        self.decisions.record(candidate.name, candidate.version, rollout.digest, outcome, reason)
        self.refused(candidate, reason)
        life.say(self.events, candidate, "rollout_failed", agreement=round(rollout.agreement(), 4),
                         compared=rollout.compared, worst=worst, inputs=shapes, reason=reason)

    def _end(self, rollout: Rollout, reason: str, cancel: bool = False) -> None:
        """Unload the candidate; it stays listed as failed (or is forgotten when cancelled)."""
        with self._lock:
            rollout.decided = rollout.decided or "cancelled"
            self.by_model = {m: r for m, r in self.by_model.items() if r is not rollout}
        candidate = rollout.candidate
        self.registry.unload(candidate, self.registry.config.daemon.drain_timeout_s, reason="candidate refused"
                             if not cancel else "candidate cancelled")
        if cancel:  # its engine released first, as a refused one's (models/life.py)
            life.say(self.events, candidate, "rollout_cancelled", reason=reason)
            self.decisions.record(candidate.name, candidate.version, rollout.digest, "cancelled", reason)
        candidate.state, candidate.reason = State.FAILED, reason
        model = self.registry.model(candidate.name)
        if model is not None and model.candidate is candidate:
            model.candidate = None
        if model is not None and not cancel and candidate.version not in model.versions:
            # A refused new version stays listed among the versions, failed, saying why (whatever candidate
            # comes next); a refused file of a serving version is said by that version's reason (swapper),
            # and a cancelled candidate is forgotten. It is listed at the model's own placement, where it
            # would have served.
            candidate.config = rollout.own
            self.registry.put(candidate)

    def close(self) -> None:
        self._stopping = True
        self._bell.set()  # (a comparison under way is bounded by its timeout)

    # -- the frontend's side ------------------------------------------------------------------

    def wants(self, name: str) -> Rollout | None:
        """The rollout that takes a copy of this request of `name` now, if any (frontend thread)."""
        rollout = self.by_model.get(name)
        if rollout is None or rollout.decided:
            return None
        if len(rollout.queue) >= QUEUE:
            rollout.not_mirrored += 1
            return None
        return rollout

    def offer(self, rollout: Rollout, sample: Sample) -> None:
        rollout.queue.append(sample)
        self._bell.set()

    # -- the shadow thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            # Without a candidate there is nothing to look at: sleep until `start` (or `close`) rings.
            self._bell.wait(LOOK_S if self.by_model else None)
            self._bell.clear()
            for rollout in list(self.by_model.values()):
                try:
                    self._say_paused(rollout, self._busy(rollout))  # also while no request comes
                    self._mirror(rollout)
                except Exception:  # one candidate's trouble must not end shadowing for the others
                    log.exception("shadowing %s:%s failed; refusing it", rollout.name, rollout.candidate.version)
                    self._decide(rollout, passed=False, why="internal error while shadowing (logged)")

    def _mirror(self, rollout: Rollout) -> None:
        while rollout.queue and not rollout.decided and not self._stopping:
            if time.monotonic() < rollout.paced_until:  # the loop looks again within LOOK_S (no bell: no spin)
                return
            busy = self._busy(rollout)
            self._say_paused(rollout, busy)
            if busy:
                self._bell.set()  # look again at the next turn
                time.sleep(LOOK_S / 2)  # the waiting samples are old by then anyway: spare the GIL
                return
            sample = rollout.queue.popleft()
            computed = self._computed(rollout.candidate, sample.inputs)
            verdict = self._compare(rollout, sample, computed)
            # Agreed first: `start` may judge (its load's memory) from another thread, never mid-comparison.
            rollout.agreed += verdict.agree
            rollout.compared += 1
            # Not for a candidate cancelled or refused while this comparison computed (it is draining); under the
            # lock `decided` is set with before its draining is said, so "shadowing" never follows "draining".
            with self._lock:
                if rollout.compared == 1 and not rollout.decided and rollout.candidate.phase is life.Phase.CANDIDATE:
                    life.say(self.events, rollout.candidate, "shadowing",
                             shadow_requests=rollout.config.shadow_requests)
            if not verdict.agree and (rollout.worst is None or verdict.error > rollout.worst[0].error):
                rollout.worst = (verdict, _shapes(sample.inputs))
            rollout.measures.timed(sample.serving_us, computed.compute_us, computed.cpu_timed)
            _pace(rollout, sample.serving_us, computed.compute_us)
            rollout.measures.held(computed.memory_bytes)
            rollout.candidate.memory_bytes = max(rollout.candidate.memory_bytes, rollout.measures.memory_bytes)
            rollout.candidate.reason = rollout.progress()
            rollout.candidate.last_used = time.monotonic()
            self._judge(rollout)

    def _judge(self, rollout: Rollout) -> None:
        """Decide the candidate once it passed, or once it can no longer pass (swap/gate.py)."""
        judgement = judge(rollout.config, rollout.compared, rollout.agreed, rollout.measures)
        if judgement.outcome:
            why = f"rollout failed: {judgement.reason}" if judgement.reason else ""
            self._decide(rollout, passed=judgement.outcome == "passed", why=why)

    def _say_paused(self, rollout: Rollout, busy: str) -> None:
        """Every LOOK_S: whether mirroring is paused, from the last LOOKS looks, with an event when it changes."""
        now = time.monotonic()
        if now - rollout.looked < LOOK_S:
            return
        rollout.looked = now
        rollout.looks.append(busy)
        count = sum(1 for look in rollout.looks if look)
        if not rollout.paused and len(rollout.looks) == LOOKS and count >= PAUSE_AT:
            rollout.paused = Counter(look for look in rollout.looks if look).most_common(1)[0][0]
            rollout.told = now - rollout.said_paused >= PAUSE_EVENTS_S
            if rollout.told:  # else counted, and said with the next pause that is
                extra = {"pauses": rollout.unsaid + 1} if rollout.unsaid else {}
                self.events.emit("rollout_paused", rollout.name, rollout.candidate.version, reason=rollout.paused,
                                 **extra)
                rollout.said_paused, rollout.unsaid = now, 0
            else:
                rollout.unsaid += 1
        elif rollout.paused and count <= RESUME_AT:
            rollout.paused = ""
            if rollout.told:
                self.events.emit("rollout_resumed", rollout.name, rollout.candidate.version)
        else:
            return
        rollout.candidate.reason = rollout.progress()

    def _busy(self, rollout: Rollout) -> str:
        """Why mirroring should wait now ("" when it may go on): every context of the serving version is
        busy, or the CPUs are."""
        model = self.registry.model(rollout.name)
        serving = model.default() if model is not None else None
        placement = serving.placement if serving is not None else None
        if placement is None:
            return "no version serves"
        # What the frontend computes itself waits in the socket, where no queue shows it; and a
        # candidate's worker at nice 19 still takes a core the box may need, and the shadow thread the
        # lock to compare. So mirroring also waits while the CPUs have too little idle time to take it. The
        # CPUs are named first where both hold: min_idle_cpu is the operator's own knob, and a
        # serving version at its capacity comes and goes between requests.
        idle, needed = self._cpu.idle(), rollout.config.min_idle_cpu
        if idle < needed:
            return f"the CPUs are busy ({idle:.0%} idle, {needed:.0%} needed)"
        # The CPUs can be idle enough while the frontend, holding the interpreter lock, is the
        # bottleneck: a candidate computing then takes its lock turns from the clients. An operator
        # who set min_idle_cpu = 0 asked for mirroring whatever it costs: neither gate holds it.
        busy = self.frontend.share()
        if needed > 0 and busy > FRONTEND_BUSY:
            return f"the frontend is busy ({busy:.0%} of its time, {FRONTEND_BUSY:.0%} at most)"
        contexts = max(1, len(placement.contexts()))
        return "the serving version is busy (every context)" if placement.load() >= contexts else ""

    def _compare(self, rollout: Rollout, sample: Sample, computed: Computed) -> Verdict:
        if computed.error:
            return Verdict(False, math.inf, f"the candidate failed: {computed.error}")
        if rollout.config.compare == "iou":
            return compare_regions(rollout.rule(), _boxes(sample.outputs), _boxes(computed.outputs))
        return compare(rollout.rule(), sample.outputs, computed.outputs)

    def _computed(self, candidate: ModelVersion, inputs: dict[str, np.ndarray]) -> Computed:
        """The candidate's answer to `inputs`, computed by its worker process, with its compute time (at most
        the CPU the worker used meanwhile: it computes one request at a time) and the memory it held."""
        placement = candidate.placement
        if placement is None:
            return Computed({}, "it is not loaded")
        sink = StepCall()
        inputs = {name: np.ascontiguousarray(a) for name, a in inputs.items()}
        now = time.perf_counter_ns()
        # No deadline it could pass: a late job goes to the router, which would answer it from the
        # serving version (the fallback path); a stuck candidate is the sink's timeout below.
        job = Job(Internal(sink), Request(model=candidate.name, inputs=inputs), [], now, now + NO_DEADLINE_NS)
        job.target = candidate
        cpu = WorkerCpu(candidate)
        admission = placement.submit(job)
        if admission is not Admission.QUEUED:
            return Computed({}, f"it took no request ({admission.name.lower()})")
        memory = MemoryProbe(candidate)
        if not sink.wait(MIRROR_TIMEOUT_S + 1.0):
            return Computed({}, f"no answer within {MIRROR_TIMEOUT_S:.0f} s", memory_bytes=memory.held())
        try:
            reply = sink.answer(candidate.name, in_process=True)
        except StepFailed as exc:
            return Computed({}, f"status {exc.status}: {exc.message}", memory_bytes=memory.held())
        # Its compute time as the serving version's is measured (the worker's figure); the time from submit
        # to answer where it gave none; at most the CPU its process used (a nice-19 process waits on a busy box).
        spent = sink.outcome.compute_us if sink.outcome is not None else (time.perf_counter_ns() - now) // 1000
        used = cpu.used_us()
        return Computed({k: np.array(v) for k, v in reply.outputs.items()}, compute_us=min(spent, used)
                        if used is not None else spent, memory_bytes=memory.held(), cpu_timed=used is not None)


def _pace(rollout: Rollout, serving_us: int, compute_us: int) -> None:
    """After a request the candidate computed slower than the serving version, mirroring waits so that it
    computes at most PACE_SHARE of the time: the spare-CPU gates see the CPUs only between its requests."""
    rollout.computing_s += compute_us / 1e6
    if compute_us > max(serving_us, 0):
        rollout.paced_until = time.monotonic() + min(PACE_MAX_S, compute_us / 1e6 * (1 / PACE_SHARE - 1))


def _shapes(inputs: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{n} {a.dtype}[{','.join(map(str, a.shape))}]" for n, a in inputs.items())


def _boxes(outputs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """compare = "iou": the first output read as boxes, [..., 4 or more] with x0, y0, x1, y1 first."""
    first = next(iter(outputs.values()), None)
    if first is None or first.ndim == 0 or first.shape[-1] < 4:
        return []
    return [{"box": [float(v) for v in row[:4]]} for row in first.reshape(-1, first.shape[-1])]
