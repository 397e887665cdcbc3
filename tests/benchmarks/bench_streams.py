"""Six cameras at twice what the box serves: the age of what they get back, and whether each is served.

    python engines/fetch_ppocr.py          # once: the OCR example's models, into engines/ppocr/
    python tests/benchmarks/bench_streams.py [--streams 6] [--seconds 12] [--ocr-seconds 40] [--rounds 2] [--no-write]

Two targets, each under `queue_policy = "fifo"` and `"newest_per_key"`:

- a model: a conv net on [1,3,112,112] (tests/support/models.py `conv`, ~5 ms a frame on one thread),
  one context, `max_queue = 64`;
- the OCR pipeline, etc/infermux/examples/ocr.toml as shipped (bar the policy).

For each target the single-request service time is measured first (one request at a time: the
daemon's receipt-to-reply time, median), then what the box serves with the 6 cameras sending one
frame at a time each (closed loop: frames per second, the best of three runs). Then `infermux bench --streams`'s open loop
(daemon/cli/benchstreams.py) sends 6 streams, each with its own key, at twice that in total, for
the round's seconds, once per policy; the policies alternate over `--rounds` and the median round
of each is shown. The policy is changed live between rounds (admin `set` for the model, a reload
of the file for the pipeline), on one daemon per target.

Per policy: the age of served frames (send to reply, over all streams) at p50 and p99, served
frames per stream (min / max, and the furthest from the mean), 409 and 429 counts, and whether the
daemon's own count of every stream adds up: received = served + superseded + refused (+ failed).
Goals: under newest_per_key, p99 age <= (streams + 2) x the service time, every stream served within
30 % of the mean, no 429; under fifo, equal senders served within 30 % of each other.
Writes "## Streams" in RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from support import models  # noqa: E402
from support.harness import Daemon  # noqa: E402
from results import markdown_table, print_and_write, stamp  # noqa: E402

from infermux.cli.bench import run_load  # noqa: E402
from infermux.cli.benchstreams import StreamsResult, run_streams, synthetic_frames  # noqa: E402
from infermux.execution.stats import percentiles  # noqa: E402

SECTION = "Streams"
ENGINES = REPO / "engines" / "ppocr"
POLICIES = ("fifo", "newest_per_key")
MODEL_CONFIG = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
max_message_bytes = 8388608
watch = false

[[models]]
name = "camnet"
engine = "camnet/1/model.onnx"
contexts = 1
max_queue = 64
timeout_ms = 10000
queue_policy = "fifo"
"""


@dataclass
class Round:
    """One open-loop round of one policy: the client's tallies and the daemon's count per stream."""

    policy: str
    result: StreamsResult
    daemon: dict[str, dict[str, Any]]  # key -> admin `streams` entry

    def figures(self) -> dict[str, Any]:
        streams = self.result.streams
        ages = [a for s in streams for a in s.ages_ms]
        p50, p99 = percentiles(ages, (50, 99))
        served = [s.served for s in streams]
        mean = statistics.mean(served) if served else 0.0
        adds_up = all(d["received"] == d["served"] + d["superseded"] + d["refused"] + d["failed"]
                      for d in self.daemon.values()) and len(self.daemon) == len(streams)
        matches = all(self.daemon[s.key]["received"] == s.sent and self.daemon[s.key]["served"] == s.served
                      for s in streams if s.key in self.daemon)
        daemon_p99 = [d["age_ms"]["p99"] for d in self.daemon.values() if d["age_ms"]["p99"] is not None]
        sent, got = sum(s.sent for s in streams), sum(served)
        return {"load": sent / got if got else float("inf"), "p50": p50 or 0.0, "p99": p99 or 0.0, "daemon_p99": max(daemon_p99, default=0.0),
                "min": min(served), "max": max(served), "mean": mean,
                "spread": max(abs(n - mean) for n in served) / mean if mean else 1.0,
                "sent": sent, "409": sum(s.superseded for s in streams),
                "refused": sum(self.daemon[s.key]["refused"] for s in streams if s.key in self.daemon),
                "other": sum(s.other for s in streams), "adds_up": adds_up and matches}


def service_ms(endpoint: str, model: str, inputs: Mapping[str, Any], count: int) -> float:
    """The median receipt-to-reply time of one request at a time, in the daemon (ms)."""
    from infermux.client import Client

    with Client(endpoint, timeout_s=60) as client:
        for _ in range(2):
            client.infer(model, inputs)  # warm-up
        totals = []
        for _ in range(count):
            reply = client.infer(model, inputs)
            assert reply.status == 200, reply.header
            timing = reply.header["timing_us"]
            totals.append(timing["total"] if "total" in timing else sum(timing.values()))
    return statistics.median(totals) / 1000


def capacity_fps(endpoint: str, model: str, inputs: Mapping[str, Any], streams: int, seconds: float,
                 tries: int = 3) -> float:
    """Frames per second the box serves with `streams` senders one frame at a time each (closed loop).

    The best of `tries` runs: other work on a shared box only ever lowers it, and an open loop
    sent at twice a low figure would not overload the box at all."""
    best = 0.0
    for _ in range(tries):
        result = run_load(endpoint, model, inputs, concurrency=streams, duration_s=seconds / tries,
                          warmup=streams, timeout_s=120)
        best = max(best, result.ok / result.duration_s)
    return best


def daemon_streams(d: Daemon, model: str, prefix: str) -> dict[str, dict[str, Any]]:
    with d.admin() as admin:
        return {s["key"]: s for s in admin.call("streams", model=model)["streams"] if s["key"].startswith(prefix)}


def rounds(d: Daemon, model: str, inputs: Callable[[int, int], Mapping[str, Any]], set_policy: Callable[[str], None],
           streams: int, fps: float, seconds: float, count: int) -> dict[str, list[Round]]:
    """`count` rounds per policy, alternating; each with keys of its own."""
    done: dict[str, list[Round]] = {p: [] for p in POLICIES}
    for n in range(count):
        for policy in POLICIES:
            set_policy(policy)
            prefix = f"{policy}{n}-cam"
            result = run_streams(d.endpoint, model, inputs, streams=streams, fps=fps, duration_s=seconds,
                                 key_prefix=prefix, timeout_s=120)
            time.sleep(0.5)  # the daemon counts the last answers as it sends them
            done[policy].append(Round(policy, result, daemon_streams(d, model, prefix)))
            f = done[policy][-1].figures()
            print(f"  {model} {policy} round {n + 1}: sent/served {f['load']:.1f}, p50 {f['p50']:.0f} ms p99 {f['p99']:.0f} ms, served per "
                  f"stream {f['min']}-{f['max']}, 409 {f['409']}, refused {f['refused']}", flush=True)
    return done


def median_round(done: list[Round]) -> Round:
    ordered = sorted(done, key=lambda r: r.figures()["p99"])
    return ordered[len(ordered) // 2]


def table(target: str, service: float, fps: float, streams: int, done: dict[str, list[Round]]) -> tuple[str, list[str]]:
    rows, verdicts = [], []
    goal_ms = (streams + 2) * service
    for policy in POLICIES:
        r = median_round(done[policy])
        f = r.figures()
        p99s = " / ".join(f"{x.figures()['p99']:,.0f}" for x in done[policy])
        loads = " / ".join(f"{x.figures()['load']:.1f}" for x in done[policy])
        rows.append([f"`{policy}`", loads, f"{f['p50']:,.0f}", f"{f['p99']:,.0f}", p99s, f"{f['daemon_p99']:,.0f}",
                     f"{f['min']} / {f['max']}",
                     f"{100 * f['spread']:.0f} %", f"{f['409']}", f"{f['refused']}", f"{f['sent']}",
                     "yes" if f["adds_up"] else "**no**"])
        fair = f["spread"] <= 0.3
        if policy == "newest_per_key":
            verdicts.append(f"{target}, newest_per_key: p99 age {f['p99']:,.0f} ms at the cameras, "
                            f"{f['daemon_p99']:,.0f} ms in the daemon (receipt to reply, the worst stream's), "
                            f"against the goal (streams + 2) × {service:.1f} ms = {goal_ms:,.0f} ms: "
                            f"{'met' if f['daemon_p99'] <= goal_ms else '**not met**'} in the daemon, "
                            f"{'met' if f['p99'] <= goal_ms else '**not met**'} at the cameras; served per stream within "
                            f"{100 * f['spread']:.0f} % of the mean ({'met' if fair else '**not met**'}); "
                            f"refused (429, 503, 504): {f['refused']} ({'met' if not f['refused'] else '**not met**'}).")
        else:
            verdicts.append(f"{target}, fifo: served per stream within {100 * f['spread']:.0f} % of the mean "
                            f"({'met' if fair else '**not met**'}).")
    head = (f"**{target}**: single-request service time {service:.1f} ms (median, in the daemon); the box "
            f"serves {fps:.1f} frames/s with the {streams} cameras sending one frame at a time each; open loop at "
            f"{2 * fps:.1f} frames/s in total ({2 * fps / streams:.2f} per camera).\n\n")
    body = head + markdown_table(
        ["policy", "sent ÷ served per round", "age p50 ms", "age p99 ms", "p99 per round", "daemon's age p99 ms", "served per stream min / max",
         "furthest from the mean", "409", "refused (429, 503, 504)", "frames sent",
         "received = served + superseded + refused"], rows)
    return body, verdicts


def model_target(work: Path, args: argparse.Namespace) -> tuple[str, list[str]]:
    engines = work / "engines"
    models.conv(engines / "camnet" / "1" / "model.onnx")
    (work / "model").mkdir()
    d = Daemon(work / "model", MODEL_CONFIG.format(engines=engines)).start(timeout=60)
    try:
        rng = np.random.default_rng(0)
        frames = [{"images": rng.random((1, 3, 112, 112), dtype=np.float32)} for _ in range(8)]
        service = service_ms(d.endpoint, "camnet", frames[0], 50)
        fps = capacity_fps(d.endpoint, "camnet", frames[0], args.streams, 6.0)
        print(f"camnet: service {service:.1f} ms, capacity {fps:.0f} fps", flush=True)

        def set_policy(policy: str) -> None:
            with d.admin() as admin:
                admin.call("set", model="camnet", queue_policy=policy)

        done = rounds(d, "camnet", lambda s, n: frames[(s + n) % len(frames)], set_policy, args.streams,
                      2 * fps / args.streams, args.seconds, args.rounds)
    finally:
        d.stop()
    return table("Model (conv net, 1 context, max_queue 64)", service, fps, args.streams, done)


def ocr_target(work: Path, args: argparse.Namespace) -> tuple[str, list[str]]:
    shipped = (REPO / "etc/infermux/examples/ocr.toml").read_text().replace(
        'engine_dir = "../../../engines/ppocr"', f'engine_dir = "{ENGINES}"')
    (work / "ocr").mkdir()
    d = Daemon(work / "ocr", shipped).start(timeout=180)
    try:
        make = synthetic_frames(args.streams, 640, 480)
        frames = lambda s, n: {"image": make(s, n)}  # noqa: E731
        service = service_ms(d.endpoint, "ocr", frames(0, 0), 10)
        fps = capacity_fps(d.endpoint, "ocr", frames(0, 0), args.streams, 24.0)
        print(f"ocr: service {service:.0f} ms, capacity {fps:.2f} fps", flush=True)

        def set_policy(policy: str) -> None:
            text = d.config_path.read_text()
            for other in POLICIES:
                text = text.replace(f'queue_policy = "{other}"', f'queue_policy = "{policy}"')
            d.config_path.write_text(text)
            with d.admin(timeout_s=120) as admin:
                admin.call("reload")

        done = rounds(d, "ocr", frames, set_policy, args.streams, 2 * fps / args.streams, args.ocr_seconds,
                      args.rounds)
    finally:
        d.stop()
    return table("OCR pipeline (etc/infermux/examples/ocr.toml)", service, fps, args.streams, done)


def commit() -> str:
    """The tree measured: its commit, and whether files differed from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=12.0, help="each model round")
    parser.add_argument("--ocr-seconds", type=float, default=40.0, help="each OCR round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per policy, alternating")
    parser.add_argument("--skip-ocr", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    load, measured = os.getloadavg()[0], commit()  # the tree as it was when the run began
    parts, verdicts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        body, said = model_target(Path(tmp), args)
        parts.append(body)
        verdicts += said
        if not args.skip_ocr:
            if not (ENGINES / "rec.onnx").is_file():
                sys.exit("bench_streams: run `python engines/fetch_ppocr.py` first (or --skip-ocr)")
            body, said = ocr_target(Path(tmp), args)
            parts.append(body)
            verdicts += said
    command = " ".join(["python tests/benchmarks/bench_streams.py", *sys.argv[1:]])
    text = (f"{stamp()}\nCommit {measured}, `{command}`.\n"
            f"1-min load average {load:.2f} before the run, {os.getloadavg()[0]:.2f} after (the box is "
            "shared, so figures are noisy; compare the policies within one run).\n\n"
            + "\n\n".join(parts) + "\n\n" + "\n".join(f"- {v}" for v in verdicts)
            + "\n\nSent ÷ served: the overload each round achieved (2 is the plan; less means the box served "
            "more than it had when its capacity was measured). "
            f"Age: from a frame's send to its reply at the camera (the bench client), over every served frame of "
            f"the {args.streams} streams; the daemon's: receipt to reply as admin `streams` reports it, over each stream's "
            "last 256 served frames, the worst stream's p99; "
            "\"furthest from the mean\": the stream whose served count is furthest from the streams' mean, as a share "
            "of the mean; refused as the daemon counted them (admin `streams`); the last column checks, for "
            "every stream, the daemon's received = served + superseded + refused + failed, and that it received what "
            "the client sent and served what the client got. Reproduce: `python engines/fetch_ppocr.py && flock /tmp/infermux-heavy.lock python "
            "tests/benchmarks/bench_streams.py`; one stream table by hand: `infermux bench ocr --streams 6 --fps F`.")
    print_and_write(SECTION, text, write=not args.no_write)


if __name__ == "__main__":
    main()
