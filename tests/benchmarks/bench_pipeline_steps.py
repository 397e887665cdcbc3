"""What a pipeline's model steps cost: a pipeline of N model steps against the bare pipeline.

    python tests/benchmarks/bench_pipeline_steps.py [--seconds 2] [--rounds 5] [--against REV]
                                                    [--no-ocr] [--ocr-frames 8] [--no-write]

The bare pipeline is the same work in one thread of this process: the same
processors (decode, resize, normalize: the pipeline's own step objects,
pipelines/spec.py) and the same models, one onnxruntime context each, called
one after the other, on the same frame. The daemon serves `p1` (one model
step) and `p3` (three: the test classifier under three names, so each step is
its own model), and one camera sends it that frame in a closed loop. Rounds
alternate (bare, daemon, and with `--against REV` the daemon at revision REV,
in turn, each case `--seconds` long) and the table gives each case's median
frames/s over the rounds and the median of the per-round ratios to the bare
pipeline, two ways: frames over the whole loop, and at the loop's median
frame time (one frame over its median time: on a box shared with other
work, a loop's throughput counts the time the scheduler gave its threads to
others, and the median frame does not). From the 1- and 3-step figures, the cost of one model step beyond
its compute: the median time of p3's steps in the pipeline's own statistics
(the step's admission, compute and answer) less the model's call alone.

Those are closed loops: one frame in flight, so every frame pays the socket
round trip and the hand-offs between threads. A camera keeps sending, so
the windowed case keeps WINDOW frames of one stream in flight (a new one
as each reply comes; none dropped) and compares the daemon's frames a
second with the bare pipeline in one thread and in WINDOW threads; and the
socket floor is the round trip of the model m1 called alone over the same
socket, which no frame sent over a socket can take less than.

Then the OCR example (etc/infermux/examples/ocr.toml) at 1 and 4 cameras
against rapidocr in one process, as bench_pipeline.py measures it (its
functions), for this checkout and REV: skipped without engines/ppocr/
(`python engines/fetch_ppocr.py`) or with --no-ocr.
Writes "## Pipeline steps" in RESULTS.md unless --no-write.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from support.harness import Daemon  # noqa: E402
from results import markdown_table, print_and_write, process_cpu_s, stamp  # noqa: E402
from revision import package_env  # noqa: E402

from infermux import config as cfg  # noqa: E402
from infermux.pipelines import spec  # noqa: E402
from infermux.pipelines.wire import encode_frame, send_frame  # noqa: E402
from infermux.protocol import decode_reply, encode_request  # noqa: E402
from infermux.plugins.processors.base import Sample  # noqa: E402

SECTION = "Pipeline steps"
CLASSIFIER = REPO / "engines/classifier/1/model.onnx"
STEPS = (1, 3)
WINDOW = 2  # a camera's frames in flight in the windowed case: as many as the pipeline has threads
SIZE = (320, 240)  # a small camera frame, JPEG


def config_text() -> str:
    """Three copies of the classifier, and pipelines of 1 and 3 model steps over them."""
    text = '[daemon]\nlisten = ["ipc://infer.sock"]\n'
    text += "".join(f'[[models]]\nname = "m{i}"\nengine = "{CLASSIFIER}"\n' for i in range(1, 4))
    for n in STEPS:
        text += (f'[[pipelines]]\nname = "p{n}"\n[[pipelines.steps]]\nprocessor = "decode"\n'
                 '[[pipelines.steps]]\nprocessor = "resize"\noptions = { size = [64, 64] }\n'
                 '[[pipelines.steps]]\nprocessor = "normalize"\n')
        text += "".join(f'[[pipelines.steps]]\nmodel = "m{i}"\n' for i in range(1, n + 1))
    return text


def frame() -> bytes:
    rng = np.random.default_rng(7)
    width, height = SIZE
    image = np.clip(np.linspace(0, 255, width)[None, :, None] + rng.normal(0, 12, (height, width, 3)), 0, 255)
    return cv2.imencode(".jpg", image.astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()


def bare(text: str, steps: int) -> Callable[[bytes], None]:
    """The bare pipeline of `steps` model steps: the pipeline's own processors, the models' contexts."""
    from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend

    config = cfg.parse(text, Path(tempfile.gettempdir()) / "bench_pipeline_steps.toml")
    pipeline = next(p for p in config.pipelines if p.name == f"p{steps}")
    engine = OnnxRuntimeBackend().load(CLASSIFIER, {})  # the daemon's defaults: 1 intra-op thread
    contexts = {m.name: engine.create_context() for m in config.models}
    built = [step for stage in spec.stages(pipeline) for step in stage.steps]

    def run(data: bytes) -> None:
        sample = Sample(data=np.frombuffer(data, np.uint8), format="jpeg")
        for step in built:
            if isinstance(step, spec.ModelStep):
                sample.outputs = dict(contexts[step.model].infer({"images": sample.tensor}))
            else:
                step.processor(sample)
    return run


@dataclass(frozen=True)
class Loop:
    """One case's round: frames a second over the whole loop, and at its median frame time."""

    fps: float
    median_fps: float


def closed_loop(seconds: float, one: Callable[[], None]) -> Loop:
    """`one()` called back to back for `seconds`."""
    for _ in range(3):
        one()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    return Loop(len(times) / (time.perf_counter() - start), 1 / statistics.median(times))


def daemon_case(d: Daemon, data: bytes, steps: int) -> Callable[[], None]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.endpoint)

    def one() -> None:
        reply = send_frame(sock, f"p{steps}", data, "jpeg", timeout_s=30)
        assert reply.status == 200, reply.header
    return one


def socket_floor(d: Daemon) -> Callable[[], None]:
    """One request of the classifier m1 itself on the pipeline's tensor, over the same socket: the
    round trip any frame pays (the client's encode and decode, both processes' ZeroMQ, the
    frontend's read and parse) plus the model's call alone."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.endpoint)
    request = [b"", *encode_request("m1", {"images": np.zeros((1, 3, 64, 64), np.float32)})]

    def one() -> None:
        sock.send_multipart(request)
        if not sock.poll(30_000):
            raise TimeoutError("no reply from the daemon within 30 s")
        assert decode_reply(sock.recv_multipart()[1:]).status == 200
    return one


@dataclass(frozen=True)
class Windowed:
    """One windowed round: frames a second with WINDOW in flight, and the daemon's CPU s per frame."""

    fps: float
    cpu_ms: float


def windowed(d: Daemon, data: bytes, steps: int, seconds: float) -> Windowed:
    """A camera that keeps sending: WINDOW frames of one stream in flight, a new one sent as each
    reply comes (nothing dropped, so every frame is computed)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.endpoint)
    request = [b"", *encode_frame(f"p{steps}", data, "jpeg", key="cam")]
    try:
        for _ in range(WINDOW):
            sock.send_multipart(request)
        done, cpu, start = 0, process_cpu_s(d.proc.pid), time.perf_counter()
        while time.perf_counter() - start < seconds:
            if not sock.poll(30_000):
                raise TimeoutError("no reply from the daemon within 30 s")
            assert decode_reply(sock.recv_multipart()[1:]).status == 200
            done += 1
            sock.send_multipart(request)
        took, cpu = time.perf_counter() - start, process_cpu_s(d.proc.pid) - cpu
        for _ in range(WINDOW):  # the frames still in flight, so the next case starts with none
            if sock.poll(30_000):
                sock.recv_multipart()
        return Windowed(done / took, cpu / max(done, 1) * 1000)
    finally:
        sock.close()


def p3_steps(d: Daemon) -> dict[str, Any]:
    """p3's steps as the pipeline's statistics show them."""
    with d.admin() as admin:
        view = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "p3")
    return dict(view["steps"])


def model_call_us(calls: int = 2000) -> float:
    """The median µs of one call of the classifier's context on the pipeline's tensor ([1,3,64,64])."""
    from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend

    context = OnnxRuntimeBackend().load(CLASSIFIER, {}).create_context()
    x = np.random.default_rng(3).random((1, 3, 64, 64), dtype=np.float32)
    times = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        context.infer({"images": x})
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1000


def step_lines(steps: dict[str, dict[str, Any]], alone_us: float) -> str:
    """Each daemon's model steps' median time (the step's own: admission, compute, answer) against the
    model's call alone, and this checkout's calls by the way they went."""
    lines = []
    for name, view in steps.items():
        p50 = [view[m]["p50_us"] for m in ("m1", "m2", "m3")]
        beyond = statistics.median(p50) - alone_us
        lines.append(f"- {name}: p3's model steps m1, m2, m3 take {', '.join(f'{v:,.0f}' for v in p50)} µs "
                     f"(p50, the pipeline's own step statistics), the classifier's call alone {alone_us:,.0f} µs: "
                     f"**{beyond:,.0f} µs** a step beyond the model's call."
                     + (f" Calls by the way they went: {view['m3']['calls']} (m3)." if "calls" in view["m3"] else ""))
    return "\n".join(lines)


def steps_rounds(args: argparse.Namespace, daemons: dict[str, Daemon],
                 steps: dict[str, dict[str, Any]]) -> dict[tuple[str, int], list[Loop]]:
    """Case -> frames/s per round, the cases in turn within each round (each starting one later); each
    daemon's p3 steps (`p3_steps`) into `steps`, as they were after its last p3 round."""
    data, text = frame(), config_text()
    cases: dict[tuple[str, int], Callable[[], None]] = {}
    for n in STEPS:
        run = bare(text, n)
        cases["bare", n] = lambda run=run: run(data)
        for name, d in daemons.items():
            cases[name, n] = daemon_case(d, data, n)
    fps: dict[tuple[str, int], list[Loop]] = {case: [] for case in cases}
    order = list(cases)
    for r in range(args.rounds):
        for case in order[r % len(order):] + order[:r % len(order)]:
            fps[case].append(closed_loop(args.seconds, cases[case]))
            if case[0] in daemons and case[1] == 3:  # read at once: the statistics cover the last seconds only
                steps[case[0]] = p3_steps(daemons[case[0]])
        print(f"round {r + 1}: " + ", ".join(f"{name}/{n} {fps[name, n][-1].fps:.0f} ({fps[name, n][-1].median_fps:.0f})"
                                             for name, n in order), flush=True)
    return fps


def ratio(mine: list[float], bare_fps: list[float]) -> str:
    ratios = [a / b for a, b in zip(mine, bare_fps)]
    return f"{statistics.median(ratios):.3f}× ({min(ratios):.3f}-{max(ratios):.3f})"


def steps_table(fps: dict[tuple[str, int], list[Loop]], names: list[str]) -> str:
    rows = []
    median_us: dict[tuple[str, int], float] = {}
    for n in STEPS:
        bare_loop = [r.fps for r in fps["bare", n]]
        bare_median = [r.median_fps for r in fps["bare", n]]
        for name in ["bare", *names]:
            loop, at_median = [r.fps for r in fps[name, n]], [r.median_fps for r in fps[name, n]]
            median_us[name, n] = 1e6 / statistics.median(at_median)
            rows.append([name, str(n), f"{statistics.median(loop):,.0f}", ratio(loop, bare_loop),
                         f"{statistics.median(at_median):,.0f}", f"{median_us[name, n]:,.0f}",
                         ratio(at_median, bare_median)])
    table = markdown_table(["pipeline", "model steps", "frames/s (loop)", "÷ bare, per round: median (range)",
                            "frames/s at the median frame", "µs, median frame", "÷ bare, per round"], rows)
    return table


def windowed_rounds(args: argparse.Namespace, daemons: dict[str, Daemon]) -> str:
    """The camera that keeps sending, p3 only: each daemon with WINDOW frames in flight against the
    bare pipeline in one thread and in WINDOW threads; and each daemon's socket floor. Cases in turn
    within each round, as `steps_rounds`."""
    data, text = frame(), config_text()
    bares = [bare(text, 3) for _ in range(WINDOW)]
    cases: dict[str, Callable[[], Any]] = {
        "bare, 1 thread": lambda: bare_threads(bares[:1], data, args.seconds),
        f"bare, {WINDOW} threads": lambda: bare_threads(bares, data, args.seconds)}
    for name, d in daemons.items():
        cases[f"{name}, {WINDOW} in flight"] = lambda d=d: windowed(d, data, 3, args.seconds)
        floor = socket_floor(d)
        cases[f"{name}: m1 alone over the socket"] = lambda floor=floor: closed_loop(args.seconds, floor)
    got: dict[str, list[Any]] = {case: [] for case in cases}
    order = list(cases)
    for r in range(args.rounds):
        for case in order[r % len(order):] + order[:r % len(order)]:
            got[case].append(cases[case]())
        print(f"windowed round {r + 1}: " + ", ".join(f"{c} {_fps(got[c][-1]):.0f}" for c in order), flush=True)
    base = got["bare, 1 thread"]
    rows = []
    for case in order:
        if "over the socket" in case:
            continue
        fps = [_fps(x) for x in got[case]]
        cpu = [x.cpu_ms for x in got[case] if isinstance(x, Windowed)]
        rows.append([case, f"{statistics.median(fps):,.0f}", ratio(fps, base),
                     f"{statistics.median(cpu):.2f}" if cpu else ""])
    table = markdown_table(["p3 (3 model steps), one stream", "frames/s", "÷ bare in 1 thread, per round: median (range)",
                            "daemon CPU ms per frame"], rows)
    floors = [f"{name}: {1e6 / statistics.median(x.median_fps for x in got[case]):,.0f} µs"
              for case in order if "over the socket" in case for name in [case.split(":")[0]]]
    return (table + f"\n\nThe socket floor (m1 alone over the socket, its median round trip, the model's call "
            f"included): {'; '.join(floors)}.")


def bare_threads(runs: list[Callable[[bytes], None]], data: bytes, seconds: float) -> float:
    """Frames a second of the bare pipelines in `runs`, one thread each, side by side."""
    counts = [0] * len(runs)
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        while time.perf_counter() < stop:
            runs[i](data)
            counts[i] += 1
    started = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(len(runs))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - started)


def _fps(x: Any) -> float:
    return float(x) if isinstance(x, float) else x.fps


def ocr(args: argparse.Namespace, envs: dict[str, dict[str, str]], tmp: Path) -> str:
    """The OCR example against rapidocr, for each daemon in `envs` (bench_pipeline.py's runs), in
    alternating rounds: rapidocr, then each daemon at 1 and 4 cameras; each ratio is to its round's rapidocr."""
    import bench_pipeline as bp

    frames = bp.jpegs(args.ocr_frames, (640, 360))
    config = (REPO / "etc/infermux/examples/ocr.toml").read_text().replace(
        'engine_dir = "../../../engines/ppocr"', f'engine_dir = "{bp.ENGINES}"')
    daemons = {name: Daemon(made(tmp / f"ocr-{name}"), config, env=env) for name, env in envs.items()}
    runs: dict[str, list[Any]] = {}
    try:
        for d in daemons.values():
            d.start(timeout=120)
        for _ in range(args.ocr_rounds):
            results: dict[str, Any] = {"rapidocr, one process, one frame at a time": bp.rapidocr_run(frames)}
            bp.progress(results)
            for name, d in daemons.items():
                for cameras in (1, 4):
                    results[f"{name}: `ocr` pipeline, {cameras} camera{'s' if cameras > 1 else ''}"] = \
                        bp.cameras_run(d, frames, cameras)
                    bp.progress(results)
            for case, run in results.items():
                runs.setdefault(case, []).append(run)
    finally:
        for d in daemons.values():
            d.stop()
    base = runs["rapidocr, one process, one frame at a time"]
    rows = []
    for case, got in runs.items():
        ratios = [r.fps / b.fps for r, b in zip(got, base)]
        rows.append([case, f"{statistics.median(r.fps for r in got):.2f}",
                     f"{statistics.median(r.p50_ms for r in got):,.0f}", f"{statistics.median(r.cpu_s for r in got):.2f}",
                     f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}-{max(ratios):.2f})"])
    return (markdown_table(["run", "fps (median)", "p50 ms", "CPU s per frame", "× rapidocr, per round: median (range)"],
                           rows)
            + f"\n\n{args.ocr_frames} generated 640x360 JPEG frames per camera after 2 warm-up frames, "
            f"{args.ocr_rounds} round(s).")


def head() -> str:
    """This checkout's commit, with "+changes" where its tracked files differ from it."""
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "daemon", "plugins"], cwd=REPO).returncode
    return rev.strip() + (" +changes" if dirty else "")


def made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="each case's closed loop, per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", metavar="REV", help="also run the daemon at git revision REV")
    parser.add_argument("--no-ocr", action="store_true", help="leave the OCR example out")
    parser.add_argument("--ocr-frames", type=int, default=6, help="OCR frames per camera")
    parser.add_argument("--ocr-rounds", type=int, default=3, help="OCR rounds (rapidocr, then each daemon)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        envs: dict[str, dict[str, str]] = {"daemon": {}}
        if args.against:
            envs[f"daemon@{args.against}"] = package_env(args.against, tmp / "against")
        daemons = {n: Daemon(made(tmp / n), config_text(), env=env) for n, env in envs.items()}
        try:
            for d in daemons.values():
                d.start(timeout=60)
            steps: dict[str, dict[str, Any]] = {}
            fps = steps_rounds(args, daemons, steps)
            window = windowed_rounds(args, daemons)
        finally:
            for d in daemons.values():
                d.stop()
        body = (f"{stamp()} This checkout at {head()}"
                + (f", against {args.against}" if args.against else "") + ".\n\n" + steps_table(fps, list(daemons))
                + f"\n\nOne camera, a {SIZE[0]}x{SIZE[1]} JPEG, {args.rounds} rounds of {args.seconds:g} s per case.\n\n"
                + step_lines(steps, model_call_us())
                + f"\n\nA camera that keeps sending (p3, {WINDOW} frames in flight, a new one sent as each reply "
                f"comes, nothing dropped), against the bare pipeline in one thread and in {WINDOW}, "
                f"{args.rounds} rounds of {args.seconds:g} s:\n\n" + window)
        ocr_ready = (REPO / "engines/ppocr/rec.onnx").is_file()
        if not args.no_ocr and ocr_ready:
            body += "\n\n" + ocr(args, envs, tmp)
        elif not args.no_ocr:
            body += "\n\nOCR left out: run `python engines/fetch_ppocr.py` first."
    body += (f"\n\nCommand: `python tests/benchmarks/bench_pipeline_steps.py --rounds {args.rounds} "
             f"--seconds {args.seconds:g}" + (f" --against {args.against}" if args.against else "")
             + ("" if args.no_ocr else f" --ocr-frames {args.ocr_frames} --ocr-rounds {args.ocr_rounds}") + "`.")
    print_and_write(SECTION, body, write=not args.no_write, titled=True)


if __name__ == "__main__":
    main()
