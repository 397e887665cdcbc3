"""A long fuzzing run against a live daemon.

    python tests/benchmarks/bench_fuzz.py [--messages 100000] [--seed 10] [--sockets 8] [--no-write]

Starts `infermux serve` on an ipc socket with the sample classifier and two
tiny test models, then sends `--messages` random and mutated messages from
tests/support/fuzz_messages.py (malformed ones of every family, valid ones between
them) over `--sockets` DEALER sockets in lockstep. Every message must get a
reply; every malformed one a 4xx with a reason; every valid one a 200 whose
outputs equal onnxruntime's run here; the daemon must still be alive, log
no traceback and exit 0 on SIGTERM. Writes the "## Fuzzing"
section of RESULTS.md (not with --no-write). Exit status 1 on any problem.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from support import models  # noqa: E402
from support.fuzz_messages import FUZZ_MODELS, FuzzReport, MessageFactory, fuzz_specs, run_fuzz  # noqa: E402
from support.harness import DAEMON_HEAD, REPO, Daemon  # noqa: E402
from results import markdown_table, print_and_write, stamp  # noqa: E402

SECTION = "Fuzzing"
# message kinds that share a first word are one family in the table
GROUPS = {"wrong": "wrong field types", "unicode": "unicode oddities", "number": "enormous numbers",
          "deep": "deep nesting", "limit": "over a limit"}


def make_engines(root: Path) -> Path:
    shutil.copytree(REPO / "engines" / "classifier", root / "classifier")
    models.add_one(root / "addone/1/model.onnx", offset=1.0)
    models.two_outputs(root / "pair/1/model.onnx")
    return root


def families(report: FuzzReport) -> str:
    per_kind: dict[str, Counter] = {}
    for (kind, status), n in report.by_kind.items():
        prefix = kind.split("_")[0]
        family = GROUPS.get(prefix, kind)
        per_kind.setdefault(family, Counter())[status] += n
    statuses = sorted({s for c in per_kind.values() for s in c})
    rows = [[kind, f"{sum(c.values()):,}", *[f"{c.get(s, 0):,}" for s in statuses]]
            for kind, c in sorted(per_kind.items(), key=lambda kv: -sum(kv[1].values()))]
    return markdown_table(["family", "messages", *map(str, statuses)], rows)


def body(report: FuzzReport, args: argparse.Namespace, exit_code: int) -> str:
    statuses = ", ".join(f"{code}: {n:,}" for code, n in sorted(report.by_status.items()))
    problems = ", ".join(f"{k}: {v}" for k, v in report.problems.items()) or "none"
    return "\n".join([
        stamp(), "",
        f"{report.sent:,} messages (seed {args.seed}) over {args.sockets} DEALER sockets in lockstep to one "
        f"`infermux serve` on ipc (classifier with batching, addone, pair with a fallback): "
        f"**{report.rate:,.0f} messages/s** over {report.elapsed_s:.1f} s.", "",
        markdown_table(["what", "count"], [
            ["messages sent / answered", f"{report.sent:,} / {report.answered:,}"],
            ["malformed / answered 4xx with a reason", f"{report.malformed:,} / {report.malformed_4xx:,}"],
            ["valid / 200 with outputs equal to onnxruntime", f"{report.valid:,} / {report.valid_ok:,}"],
            ["either way (mutations, zero rows, BOM, raw surrogates; 200s checked against onnxruntime)",
             f"{report.sent - report.malformed - report.valid:,}"],
            ["replies by status", statuses],
            ["problems (no reply, wrong status, wrong outputs, id not echoed)", problems],
            ["daemon died or hung / tracebacks in its log / exit code on SIGTERM",
             f"{report.problems.get('daemon died or hung', 0)} / {int(args.tracebacks)} / {exit_code}"],
        ]), "",
        "Replies by message family:", "",
        families(report), "",
        "Bugs this fuzzer (and the protocol property tests) found, fixed with regression tests in "
        "tests/daemon/test_fuzz_regressions.py: `[[[[…` a few thousand deep raised RecursionError out of the JSON "
        "parser and stopped the daemon; a lone surrogate (`\"\\ud800\"`) in an echoed `id` or `version` made "
        "the reply encoder raise (frontend or executor thread); `timeout_ms` of 10^310 overflowed a float on "
        "the fallback path (now capped at 2^31−1 ms); an unhashable `dtype` (`[\"float32\"]`) raised TypeError "
        "in the dtype lookup and stopped the daemon.",
        "Reproduce: `python tests/benchmarks/bench_fuzz.py`.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--sockets", type=int, default=8)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="infermux-fuzz-") as tmp:
        engines = make_engines(Path(tmp) / "engines")
        workdir = Path(tmp) / "daemon"
        workdir.mkdir()
        daemon = Daemon(workdir, (DAEMON_HEAD + FUZZ_MODELS).format(engines=engines)).start()
        try:
            factory = MessageFactory(fuzz_specs(engines), seed=args.seed)
            report = run_fuzz(daemon.endpoint, factory, args.messages, sockets=args.sockets, alive=daemon.alive,
                              progress=lambda r: print(f"\r{r.sent:,} sent, {r.rate:,.0f}/s, "
                                                       f"problems {sum(r.problems.values())}", end="",
                                                       file=sys.stderr))
            print(file=sys.stderr)
        finally:
            exit_code = daemon.stop()
        args.tracebacks = "Traceback" in daemon.log()
    print(report.summary())
    for line in report.failures:
        print("  " + line)
    text = body(report, args, exit_code)
    print_and_write(SECTION, text, write=not args.no_write)
    return 0 if report.clean and not args.tracebacks and exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
