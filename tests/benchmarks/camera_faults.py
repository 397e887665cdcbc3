"""`bench_cameras.py --faults`: what one faulty camera changes for a healthy camera and a plain model client.

Each round is a fresh daemon with three clients of its pipeline's model: the camera `hall` (a real RTSP
server, healthy throughout), a camera `spare` that is healthy in the rounds `none` and faulty in the
others, and a plain client sending the model a request after another (20 a second). The faults, one
per round: `silent` (a port that takes the connection and never answers), `garbage` (a port that
answers bytes that are not RTSP), `max_pixels` (a stream over the camera's limit), `ended` (a file
played once), `outage` (the spare's RTSP server stopped for the window), `sigkill` (its process killed
every 2 s) and `sigstop` (its process stopped: the daemon kills it as hung and starts it again).
Rounds alternate: none, each fault, none, each fault, ...; each measures `seconds` after `warmup`.

`--against REV` runs each pair of rounds with the daemon at git revision REV too (revision.py), the builds
alternating pair by pair, and reports each build's rows.

Reported per fault: hall's capture-to-result age p99 (the daemon's, over hall's frames served in this
round's daemon only) and the plain client's latency p99 (its own clock), the medians over its rounds,
and each as the median of its rounds' ratios to the `none` round just before each (the issue's goal:
within 1.5 x); the error statuses either got (goal: none); and the CPU the daemon and its camera processes
took in the window (processes that ended included: their reapers' children's time), the median over the rounds. Writes "## Cameras: a faulty camera beside the others" in RESULTS.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

FAULTS = ("silent", "garbage", "max_pixels", "ended", "outage", "sigkill", "sigstop")
SECTION = "Cameras: a faulty camera beside the others"
PLAIN_RATE = 20.0  # the plain client's requests a second (closed loop, paced)
GOAL = 1.5


@dataclass(frozen=True)
class FaultRound:
    """One round: hall's capture-to-result age p99 (ms), the plain client's latency p99 (ms), and what
    errors either saw (hall's frames answered other than 200, the plain client's statuses other than 200)."""

    fault: str
    build: str
    hall_p99_ms: float | None
    plain_p99_ms: float | None
    hall_failed: int
    plain_errors: int
    spare_state: str
    cpu_s: float


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of `pid`, of the children it reaped, and of its live descendants (the camera
    processes, their zygote, the workers), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # it ended while read (a camera killed): its reaper counts it
        return 0.0
    total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += sum(tree_cpu_s(int(child)) for child in (task / "children").read_text().split())
    return total


class PlainClient:
    """A client of the model alone, PLAIN_RATE requests a second, each timed."""

    def __init__(self, daemon: Any) -> None:
        self.daemon, self.latencies, self.errors = daemon, [], 0
        self.stop, self.measuring = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.run, name="plain-client", daemon=True)

    def run(self) -> None:
        image = np.zeros((1, 3, 64, 64), np.float32)
        with self.daemon.client() as client:
            while not self.stop.wait(1.0 / PLAIN_RATE):
                begin = time.perf_counter()
                status = client.infer("classifier", {"images": image}).status
                if self.measuring.is_set():
                    self.latencies.append((time.perf_counter() - begin) * 1e3)
                    self.errors += status != 200


def spare_entry(fault: str, urls: dict[str, Any]) -> str:
    """The `spare` camera's [[cameras]] entry for `fault`."""
    from support.camera_files import camera

    if fault == "silent":
        return camera("spare", urls["silent"], pipeline="camera")
    if fault == "garbage":
        return camera("spare", urls["garbage"], pipeline="camera")
    if fault == "max_pixels":
        return camera("spare", urls["spare"], pipeline="camera", max_pixels=1000)
    if fault == "ended":
        return camera("spare", urls["file"], pipeline="camera", loop=False)
    return camera("spare", urls["spare"], pipeline="camera")


def inject(fault: str, daemon: Any, servers: dict[str, Any], stop: threading.Event) -> None:
    """The fault that happens during the window (the others are in the spare's configuration)."""
    from support.camera_files import cameras

    if fault == "outage":
        servers["spare"].stop()
        stop.wait()
        servers["spare"].start()
        return
    if fault not in ("sigkill", "sigstop"):
        return
    while not stop.is_set():
        pid = cameras(daemon)["spare"].get("pid")
        if pid:
            os.kill(pid, signal.SIGKILL if fault == "sigkill" else signal.SIGSTOP)
        stop.wait(2.0 if fault == "sigkill" else 30.0)  # a stopped one is the daemon's to find (HANG_S)


def one_round(fault: str, build: tuple[str, dict[str, str] | None], config: Callable[[str], str],
              servers: dict[str, Any], workdir: Path, args: Any) -> FaultRound:
    """A fresh daemon with hall, spare as `fault` makes it, and the plain client; measured over the window."""
    from support.camera_files import cameras
    from support.harness import Daemon
    from support.polling import eventually

    workdir.mkdir(parents=True, exist_ok=True)
    daemon = Daemon(workdir, config(fault), env=build[1]).start()
    plain = PlainClient(daemon)
    try:
        eventually(lambda: cameras(daemon)["hall"]["served"] > 0, "hall served", timeout_s=60)
        plain.thread.start()
        time.sleep(args.warmup)
        before, stop = cameras(daemon)["hall"], threading.Event()
        injector = threading.Thread(target=inject, args=(fault, daemon, servers, stop), daemon=True)
        assert daemon.proc is not None
        cpu = tree_cpu_s(daemon.proc.pid)
        plain.measuring.set()
        injector.start()
        time.sleep(args.seconds)
        plain.measuring.clear()
        cpu = tree_cpu_s(daemon.proc.pid) - cpu
        stop.set()
        injector.join(30)
        after = cameras(daemon)
        latencies = sorted(plain.latencies)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
        return FaultRound(fault, build[0], after["hall"]["capture_age_ms"].get("p99"), p99,
                          after["hall"]["failed"] - before["failed"], plain.errors, after["spare"]["state"], cpu)
    finally:
        plain.stop.set()
        if plain.thread.is_alive():
            plain.thread.join(10)
        daemon.stop()


@dataclass
class Fixtures:
    """The RTSP servers, ports and file the rounds' cameras read."""

    servers: dict[str, Any]
    urls: dict[str, Any]


@contextlib.contextmanager
def fixtures(tmp: Path, args: Any) -> Iterator[Fixtures]:
    """hall's and spare's RTSP servers, a silent and a garbage port, and a short file."""
    from support import rtsp
    from support.camera_files import write_clip

    clip = rtsp.make_clip(tmp, 320, 180, fps=args.fps, seconds=args.clip_seconds)
    with (rtsp.RtspServer(clip, path="/hall") as hall, rtsp.RtspServer(clip, path="/spare") as spare,
          rtsp.silent() as mute, rtsp.garbage() as junk):
        urls = {"hall": hall.url, "spare": spare.url, "silent": f"rtsp://127.0.0.1:{mute}/cam",
                "garbage": f"rtsp://127.0.0.1:{junk}/cam", "file": str(write_clip(tmp / "once.mp4", frames=15))}
        yield Fixtures({"hall": hall, "spare": spare}, urls)


def paired(rounds: list[FaultRound], fault: str, what: str) -> list[float]:
    """`what` of each round of `fault` over that of the `none` round just before it (the rounds alternate):
    the box's load drifts between rounds far more than within a pair."""
    ratios = []
    for before, this in zip(rounds, rounds[1:]):
        base, value = getattr(before, what), getattr(this, what)
        if this.fault == fault and before.fault == "none" and base and value is not None:
            ratios.append(value / base)
    return ratios


def ratio(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f} ×" if ratios else "-"


def table(rounds: list[FaultRound], builds: bool = False) -> tuple[list[str], list[list[str]]]:
    """The header and rows: per fault, the medians of its rounds, and the median of its rounds' ratios to
    the `none` round before each (`rounds` of one build; `builds`: a column names it)."""
    rows = []
    for fault in ("none", *FAULTS):
        mine = [r for r in rounds if r.fault == fault]
        if not mine:
            continue
        hall = [r.hall_p99_ms for r in mine if r.hall_p99_ms is not None]
        plain = [r.plain_p99_ms for r in mine if r.plain_p99_ms is not None]
        ratios = {what: paired(rounds, fault, what) for what in ("hall_p99_ms", "plain_p99_ms")}
        within = all(r and statistics.median(r) <= GOAL for r in ratios.values())
        errors = sum(r.hall_failed + r.plain_errors for r in mine)
        rows.append([*([mine[0].build] if builds else []), fault,
                     f"{statistics.median(hall):.1f}" if hall else "-",
                     "-" if fault == "none" else ratio(ratios["hall_p99_ms"]),
                     f"{statistics.median(plain):.1f}" if plain else "-",
                     "-" if fault == "none" else ratio(ratios["plain_p99_ms"]), str(errors),
                     ", ".join(sorted({r.spare_state for r in mine})),
                     f"{statistics.median(r.cpu_s for r in mine):.2f}",
                     "-" if fault == "none" else ("yes" if within and not errors else "no")])
    header = [*(["daemon"] if builds else []), "spare camera", "hall age p99 ms", "vs none", "plain client p99 ms",
              "vs none", "error statuses",
              "spare's state at the end", "CPU s, daemon and cameras", f"within {GOAL} ×, no error"]
    return header, rows


def faults_run(args: Any) -> None:
    """`--faults`: the rounds, alternating, and the table."""
    import tempfile

    from results import markdown_table, print_and_write, stamp
    from support.harness import DAEMON_HEAD
    from support.pipelines import camera_pipeline

    from revision import describe, package_env

    engines = Path(__file__).resolve().parents[2] / "engines"
    rounds: list[FaultRound] = []
    with tempfile.TemporaryDirectory(prefix="bench-camera-faults-") as tmp, fixtures(Path(tmp), args) as fx:
        builds: list[tuple[str, dict[str, str] | None]] = [("this checkout", None)]
        if args.against:
            builds.append((describe(args.against).split()[0], package_env(args.against, Path(tmp) / "against")))
        models = '[[models]]\nname = "classifier"\nengine = "classifier/1/model.onnx"\n'

        def config(fault: str) -> str:
            from support.camera_files import camera

            head = (DAEMON_HEAD + models + camera_pipeline("camera")).format(engines=engines)
            hall = camera("hall", fx.urls["hall"], pipeline="camera", fps=args.fps)
            return head + (hall + spare_entry(fault, fx.urls)).format()

        for n in range(args.rounds):
            for fault in [f for f in FAULTS if f in args.faults]:
                for b, build in enumerate(builds):
                    for name in ("none", fault):
                        r = one_round(name, build, config, fx.servers, Path(tmp) / f"{n}-{fault}-{b}-{name}", args)
                        print(r, file=sys.stderr)
                        rounds.append(r)
    header: list[str] = []
    rows: list[list[str]] = []
    for label, _env in builds:
        header, mine = table([r for r in rounds if r.build == label], builds=len(builds) > 1)
        rows += mine
    body = (f"{stamp()}\n\n`python tests/benchmarks/bench_cameras.py {' '.join(sys.argv[1:])}`: per round a fresh "
            f"daemon; the camera `hall` (320×180 H.264 over RTSP at {args.fps} fps) and a plain client of the "
            f"model ({PLAIN_RATE:.0f} requests a second) beside a camera `spare`, healthy (`none`) or faulty; "
            f"{args.seconds:g} s measured after {args.warmup:g} s, rounds alternating none and each fault; p99s: "
            "medians over the rounds; vs none: the median of each round's ratio to the none round just before "
            "it" + (f"; the daemon at {describe(args.against)} in the same run, pairs of rounds alternating with this "
                    "checkout's" if len(builds) > 1 else "") + ".\n\n" + markdown_table(header, rows))
    print_and_write(SECTION, body, write=args.write, titled=True)
