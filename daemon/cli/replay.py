"""`infermux replay DIR --engine FILE`: judge an engine on recorded traffic, in this process.

    infermux replay ~/rec/det-v3 --engine det-4-int8.plan --min-agreement 0.99 --rtol 1e-2 --atol 1e-3
    infermux replay ~/rec/cls --engine cls-5.onnx --compare argmax

Each recorded request's inputs go through the engine (loaded here, with
--backend and --option as a model's `backend` and `[models.options]`), and
its outputs are compared with what the serving version answered
(models/agreement.py: `allclose` within --rtol/--atol, or `argmax`, the
top-1 class of the first output). Prints the agreement, the worst cases
with their inputs' shapes, and the engine's latency per request.

Exit codes: 0 agreement >= --min-agreement, 1 below it (or the engine does
not load, or the recording cannot be read), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from infermux.cli.common import USAGE, CliError

PROGRESS_S = 1.0
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="a recording (`infermux record ... --out DIR`)")
    parser.add_argument("--engine", "-e", required=True, metavar="FILE", help="the engine to judge (.plan, .onnx)")
    parser.add_argument("--backend", default="", help="backend name or module:Class (default: by the suffix)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a backend option, as in [models.options] (value parsed as JSON, else text)")
    parser.add_argument("--compare", choices=("allclose", "argmax"), default="allclose",
                        help="allclose: every output within --rtol/--atol (default); argmax: the same top-1 "
                        "class in the first output")
    parser.add_argument("--rtol", type=float, help=f"relative tolerance of allclose (default {DEFAULT_RTOL:g})")
    parser.add_argument("--atol", type=float, help=f"absolute tolerance of allclose (default {DEFAULT_ATOL:g})")
    parser.add_argument("--min-agreement", type=float, default=0.99,
                        help="the share of requests that must agree (default 0.99)")
    parser.add_argument("--worst", type=int, default=5, help="how many of the worst cases to print")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--max-request-mb", type=float, default=256.0,
                        help="the most one recorded request's arrays may take once read (default 256)")


def _rule(args: argparse.Namespace) -> Any:
    from infermux.models.agreement import Rule

    if args.compare == "argmax" and (args.rtol is not None or args.atol is not None):
        raise CliError("infermux replay: --rtol and --atol belong to --compare allclose, not argmax", USAGE)
    for name in ("rtol", "atol"):
        if (getattr(args, name) or 0) < 0:
            raise CliError(f"infermux replay: --{name} must be >= 0", USAGE)
    if not 0 <= args.min_agreement <= 1:
        raise CliError("infermux replay: --min-agreement is a share between 0 and 1 (0.99 is 99 %)", USAGE)
    return Rule(args.compare, DEFAULT_RTOL if args.rtol is None else args.rtol,
                DEFAULT_ATOL if args.atol is None else args.atol)


def _options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"infermux replay: --option {pair!r}: write KEY=VALUE", USAGE)
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def run(args: argparse.Namespace) -> int:
    from infermux.client.recording import RecordingError, read_manifest

    rule = _rule(args)
    if not args.max_request_mb > 0:
        raise CliError("infermux replay: --max-request-mb must be more than 0", USAGE)
    options = _options(args.option)
    folder, engine_path = Path(args.dir).expanduser(), Path(args.engine).expanduser()
    try:
        manifest = read_manifest(folder)
    except RecordingError as exc:
        raise CliError(f"infermux replay: {exc}", USAGE) from None
    if not engine_path.is_file():
        raise CliError(f"infermux replay: engine {engine_path} is not a file", USAGE)
    engine, backend = _load(engine_path, args.backend, options)
    try:
        result = _replay(folder, manifest, engine, rule, int(args.max_request_mb * 2**20))
    finally:
        engine.close()
    result.update(engine=str(engine_path), backend=backend, model=manifest.get("model", ""),
                  recorded_versions=manifest.get("versions", []), compare=rule.describe(),
                  min_agreement=args.min_agreement)
    passed = result["requests"] > 0 and result["agreement"] >= args.min_agreement
    result["passed"] = passed
    print(json.dumps(result, indent=1) if args.json else _report(result, args.worst))
    return 0 if passed else 1


def _load(path: Path, backend_name: str, options: dict[str, Any]) -> tuple[Any, str]:
    from infermux.plugins import backends

    try:
        backend = backends.for_path(path, backend_name or None)
        return backend.load(path, options), backend.name
    except Exception as exc:  # whatever the backend raises: one line, exit 1
        raise CliError(f"infermux replay: {path} does not load: {exc}") from None


def _replay(folder: Path, manifest: dict[str, Any], engine: Any, rule: Any, max_bytes: int) -> dict[str, Any]:
    """Run every recorded request; the agreement, the verdicts (worst first) and latencies."""
    import numpy as np

    from infermux.client.recording import RecordingError, entries
    from infermux.models.agreement import Verdict, compare

    context = engine.create_context()
    total = len(manifest["requests"])
    verdicts: list[tuple[Verdict, str, str]] = []
    latencies: list[float] = []
    recorded: list[int] = []
    shown = started = time.monotonic()
    try:
        for entry in entries(folder, manifest, max_bytes):
            begin = time.perf_counter()
            try:
                outputs = context.infer(entry.inputs)
                verdict = compare(rule, entry.outputs, {k: np.asarray(v) for k, v in outputs.items()})
            except Exception as exc:  # the engine refused these inputs: a disagreement, said once
                verdict = Verdict(False, float("inf"), f"the engine failed: {str(exc).splitlines()[0][:200]}")
            latencies.append((time.perf_counter() - begin) * 1e6)
            recorded.append(entry.latency_us)
            verdicts.append((verdict, entry.file, entry.shapes()))
            if time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                agreed = sum(v.agree for v, _, _ in verdicts)
                print(f"replayed {len(verdicts)}/{total}, {agreed / len(verdicts):.2%} agree so far", file=sys.stderr)
    except RecordingError as exc:
        raise CliError(f"infermux replay: {exc}") from None
    finally:
        context.close()
    agreed = sum(v.agree for v, _, _ in verdicts)
    worst = sorted(verdicts, key=lambda item: -item[0].error)
    return {"requests": len(verdicts), "agreed": agreed, "agreement": agreed / len(verdicts) if verdicts else 0.0,
            "seconds": round(time.monotonic() - started, 3),
            "latency_us": _percentiles(latencies), "recorded_latency_us": _percentiles(recorded),
            "worst": [{"file": f, "agree": v.agree, "error": v.error, "detail": v.detail, "inputs": shapes}
                      for v, f, shapes in worst if not v.agree or v.error > 0]}


def _percentiles(values: list[float] | list[int]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {}
    p50, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50, 99])
    return {"p50": round(float(p50), 1), "p99": round(float(p99), 1)}


def _report(result: dict[str, Any], worst: int) -> str:
    from infermux import format as fmt

    verdict = "PASS" if result["passed"] else "FAIL"
    versions = ", ".join(result["recorded_versions"]) or "?"
    lines = [f"replayed {result['requests']} requests of {result['model']} (answered by version {versions}) "
             f"through {result['engine']} ({result['backend']}) in {result['seconds']:.1f} s",
             f"agreement {result['agreed']}/{result['requests']} = {result['agreement']:.2%} ({result['compare']}); "
             f"needed {result['min_agreement']:.2%}: {verdict}"]
    mine, theirs = result["latency_us"], result["recorded_latency_us"]
    if mine:
        lines.append(f"latency per request here: p50 {fmt.us(mine['p50'])}, p99 {fmt.us(mine['p99'])}"
                     + (f" (the daemon's, receipt to reply: p50 {fmt.us(theirs['p50'])}, p99 "
                        f"{fmt.us(theirs['p99'])})" if theirs else ""))
    shown = [w for w in result["worst"] if not w["agree"]][:worst] or result["worst"][:worst]
    if shown:
        lines.append("worst:" if any(not w["agree"] for w in shown) else "closest to the tolerance (all agree):")
        lines += [f"  {w['file']}  {w['detail']}  inputs {w['inputs']}" for w in shown]
    return "\n".join(lines)
