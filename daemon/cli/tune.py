"""`infermux tune MODEL`: how many execution contexts a model should run.

    infermux tune classifier --shape images=1x3x64x64
    infermux tune det_v2 --version 2.1 --input images=frame.npy --duration 5 --apply

The sizing rule (docs/architecture.md#sizing-contexts): measure one context
(QPS, p99), add contexts one at a time, and stop when QPS grows by less
than 30 % while p99 grows by more than 20 %; the count before that step is
the recommendation. If no step trips the rule up to --max-contexts, the
count with the highest QPS is recommended. Each step also says how busy
the daemon's frontend thread was: near a full core, that one thread limits
the QPS whatever the count (docs/operating.md, "Sizing"), and the
recommendation says so. Contexts are changed through the
admin socket (`set contexts=N`); the original count is restored at the end
unless --apply leaves the recommended one set (the configuration file is
not changed: put `contexts = N` there to keep it across restarts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from infermux.admin.threadload import SATURATED

QPS_GAIN = 0.30    # a new context must add at least this much QPS...
P99_GROWTH = 0.20  # ...or else cost no more than this much p99


@dataclass(frozen=True)
class Step:
    """One measurement: `contexts` contexts gave `qps` at `p99_us`."""

    contexts: int
    qps: float
    p99_us: float
    errors: int = 0
    frontend_busy: float | None = None  # the share of a core the frontend thread used (None: not reported)


@dataclass(frozen=True)
class Verdict:
    """What one more context did, against the previous step."""

    qps_growth: float
    p99_growth: float
    stop: bool


@dataclass(frozen=True)
class Recommendation:
    contexts: int
    reason: str


def judge(previous: Step, current: Step, qps_gain: float = QPS_GAIN, p99_growth: float = P99_GROWTH) -> Verdict:
    """The sizing rule for one step: stop when QPS grew < 30 % while p99 grew > 20 %."""
    qps = current.qps / previous.qps - 1 if previous.qps > 0 else float("inf")
    p99 = current.p99_us / previous.p99_us - 1 if previous.p99_us > 0 else 0.0
    return Verdict(qps, p99, qps < qps_gain and p99 > p99_growth)


def recommend(steps: Sequence[Step], qps_gain: float = QPS_GAIN, p99_growth: float = P99_GROWTH) -> Recommendation:
    """The context count `steps` (1, 2, 3, ... in order) argue for."""
    if not steps:
        raise ValueError("no measurements")
    for previous, current in zip(steps, steps[1:]):
        v = judge(previous, current, qps_gain, p99_growth)
        if v.stop:
            return Recommendation(previous.contexts, (
                f"going from {previous.contexts} to {current.contexts} contexts added {v.qps_growth:+.0%} QPS "
                f"(< {qps_gain:.0%}) for {v.p99_growth:+.0%} p99 (> {p99_growth:.0%})"))
    best = max(steps, key=lambda s: (s.qps, -s.contexts))
    return Recommendation(best.contexts, (
        f"no step up to {steps[-1].contexts} contexts tripped the rule; {best.contexts} gave the most QPS"))


def frontend_note(steps: Sequence[Step], choice: Recommendation) -> str:
    """A sentence when the frontend thread was near a full core at the recommended count, else ""."""
    step = next((s for s in steps if s.contexts == choice.contexts), None)
    if step is None or step.frontend_busy is None or step.frontend_busy < SATURATED:
        return ""
    return (f"; the frontend thread was {step.frontend_busy:.0%} busy there: that one thread, not the contexts, "
            "limits the QPS (docs/operating.md, Sizing)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from infermux.transport import curve
    from infermux.cli.common import add_endpoint_arguments, add_input_arguments, add_model_arguments

    add_model_arguments(parser)
    add_endpoint_arguments(parser)
    add_input_arguments(parser)
    parser.add_argument("--duration", "-d", type=float, default=3.0, help="seconds measured per step (default 3)")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured requests per step (default 100)")
    parser.add_argument("--concurrency", type=int, help="requests in flight (default: 2 x --max-contexts)")
    parser.add_argument("--max-contexts", type=int, default=8, help="stop adding contexts here (default 8)")
    parser.add_argument("--apply", action="store_true", help="leave the recommended count set (default: restore)")
    parser.add_argument("--json", action="store_true", help="print the measurements and the decision as JSON")
    curve.add_arguments(parser)


@dataclass
class _Target:
    """The model version being tuned, and how to reach the daemon."""

    endpoint: str
    admin: Any
    model: str
    version: str | None
    inputs: dict[str, Any]
    curve: Any

    def set_contexts(self, n: int) -> None:
        self.admin.call("set", model=self.model, contexts=n,
                        **({"version": self.version} if self.version else {}))

    def frontend_cpu_s(self) -> float | None:
        """The daemon's frontend thread's CPU seconds so far (admin/threadload.py); None where not reported."""
        load = self.admin.call("status")["daemon"].get("frontend_thread") or {}
        return load.get("cpu_s")

    def current_contexts(self) -> tuple[str, int]:
        """(version, contexts) of the version `set` acts on."""
        rows = [m for m in self.admin.call("models")["models"] if m["name"] == self.model]
        if not rows:
            raise ValueError(f"the daemon serves no model {self.model!r}")
        row = next((m for m in rows if m["version"] == self.version), None) if self.version else \
            next((m for m in rows if m.get("default")), rows[-1])
        if row is None:
            raise ValueError(f"model {self.model!r} has no version {self.version!r}")
        return row["version"], int(row["contexts"])


def measure(target: _Target, contexts: int, args: argparse.Namespace, concurrency: int) -> Step:
    from infermux.cli.bench import run_load

    target.set_contexts(contexts)
    cpu, start = target.frontend_cpu_s(), time.monotonic()
    result = run_load(target.endpoint, target.model, target.inputs, concurrency=concurrency,
                      duration_s=args.duration, warmup=args.warmup, curve=target.curve,
                      fields={"version": target.version})
    cpu_after, elapsed = target.frontend_cpu_s(), time.monotonic() - start
    if result.p99_us is None:
        raise RuntimeError(f"no replies with {contexts} contexts")
    busy = (cpu_after - cpu) / elapsed if cpu is not None and cpu_after is not None and elapsed > 0 else None
    return Step(contexts, result.qps, result.p99_us, result.errors, busy)


def sweep(target: _Target, args: argparse.Namespace, concurrency: int,
          show: Callable[[Step, Verdict | None], None]) -> list[Step]:
    """Measure 1, 2, ... contexts until the rule says stop or --max-contexts."""
    steps: list[Step] = []
    for n in range(1, args.max_contexts + 1):
        print(f"measuring {n} context{'s' if n > 1 else ''} for {args.duration:g} s ...", file=sys.stderr)
        step = measure(target, n, args, concurrency)
        verdict = judge(steps[-1], step) if steps else None
        steps.append(step)
        show(step, verdict)
        if verdict is not None and verdict.stop:
            break
    return steps


def _row(step: Step, verdict: Verdict | None) -> str:
    growth = "" if verdict is None else f"{verdict.qps_growth:>+8.0%} {verdict.p99_growth:>+8.0%}"
    frontend = "-" if step.frontend_busy is None else f"{step.frontend_busy:.0%}"
    mark = "  stop" if verdict is not None and verdict.stop else ""
    errors = f"  ({step.errors} errors)" if step.errors else ""
    return (f"{step.contexts:>8} {step.qps:>10,.0f} {step.p99_us / 1000:>9.2f} {frontend:>9} {growth:>17}"
            f"{mark}{errors}")


def run(args: argparse.Namespace) -> int:
    from infermux.transport import curve
    from infermux.cli.bench import wait_ready
    from infermux.client import AdminClient, AdminError
    from infermux.config import ConfigError
    from infermux.cli.infer import endpoint_from, inputs_for

    inputs = inputs_for(args)
    if args.max_contexts < 1 or args.duration <= 0:
        print("infermux tune: --max-contexts must be >= 1 and --duration > 0", file=sys.stderr)
        return 2
    try:
        endpoint = endpoint_from(args)
        admin_endpoint = endpoint_from(args, "admin")
        keys = curve.options_from(args)
    except TimeoutError:  # NoDaemon, an OSError too: exit 3, not a configuration problem
        raise
    except (ConfigError, OSError, curve.CurveError) as exc:
        print(f"infermux tune: {exc} (give --endpoint and --admin, or --config)", file=sys.stderr)
        return 2
    concurrency = args.concurrency or 2 * args.max_contexts
    with AdminClient(admin_endpoint, timeout_s=120) as admin:
        target = _Target(endpoint, admin, args.model, args.version, inputs, keys)
        try:
            version, original = target.current_contexts()
            target.version = version
            first = wait_ready(endpoint, args.model, inputs, fields={"version": version}, curve=keys)
            if not first.ok:
                raise ValueError(f"{first.status} {first.error}")
        except (ValueError, TimeoutError, AdminError) as exc:
            print(f"infermux tune: {exc}", file=sys.stderr)
            return 3 if isinstance(exc, TimeoutError) else 2
        return _tune(target, args, concurrency, original)


def _tune(target: _Target, args: argparse.Namespace, concurrency: int, original: int) -> int:
    from infermux.client import AdminError

    out = sys.stderr if args.json else sys.stdout
    print(f"tuning {target.model}:{target.version} at concurrency {concurrency}, {args.duration:g} s a step "
          f"(now {original} context{'s' if original != 1 else ''})", file=out)
    print(f"{'contexts':>8} {'QPS':>10} {'p99 ms':>9} {'frontend':>9} {'ΔQPS':>8} {'Δp99':>8}", file=out)
    steps: list[Step] = []
    final = original
    try:
        steps = sweep(target, args, concurrency, lambda s, v: print(_row(s, v), file=out, flush=True))
        choice = recommend(steps)
        final = choice.contexts if args.apply else original
    except (RuntimeError, TimeoutError, AdminError) as exc:
        print(f"infermux tune: {exc}; contexts go back to {original}", file=sys.stderr)
        return 1
    finally:
        target.set_contexts(final)
    if args.json:
        print(json.dumps({"model": target.model, "version": target.version, "concurrency": concurrency,
                          "steps": [asdict(s) for s in steps], "recommended": choice.contexts,
                          "reason": choice.reason + frontend_note(steps, choice), "original": original,
                          "contexts_now": final}, indent=2))
    else:
        print(f"recommend {choice.contexts} context{'s' if choice.contexts > 1 else ''}: {choice.reason}"
              f"{frontend_note(steps, choice)}")
        print(f"left at {final} (--apply)" if args.apply else
              f"restored {original}; `infermux tune --apply` or `infermux ctl set {target.model} "
              f"contexts={choice.contexts}` sets it, `contexts = {choice.contexts}` in the config keeps it")
    return 0
