"""Cameras over RTSP: what decoding costs with each library, and (once the daemon reads cameras) what they get back.

    python tests/benchmarks/bench_cameras.py [--cameras 1] [--size 640x360 --size 1280x720] [--fps 15]
        [--seconds 8] [--warmup 2] [--rounds 2] [--decoders floor,pyav,ffmpeg,gstreamer] [--no-write]
    python tests/benchmarks/bench_cameras.py --daemon [--cameras 4] [--still] ...   # through the daemon's [[cameras]]
    python tests/benchmarks/bench_cameras.py --faults [silent,garbage,...] [--against REV] ...   # a faulty camera

The cameras are a real RTSP server (GStreamer's, tests/support/rtsp.py) serving an H.264 clip the script
encodes (moving shapes on a textured background with sensor noise; one IDR frame a second, no B-frames,
about 0.25 bit per pixel), paced at `fps` in real time; every reader is its own client over TCP.

Decoding (the default mode): for each size, N cameras are read at once by N processes of one kind, and
each measures its own user + system CPU time over `seconds` after `warmup` seconds of frames:

- floor: `ffmpeg -i URL -f null -` (decodes, converts nothing, writes nothing): the least decoding costs;
- pyav: PyAV in the reading process, each frame to a BGR array by `frame.to_ndarray(format=...)`: a new
  swscale context per frame, on as many threads as there are cores (what a camera process did first);
- pyav-yuv: the same, each frame's YUV 4:2:0 planes copied out unconverted (decoding's share of pyav);
- pyav-half: the same, each frame scaled to half its width and height and converted to BGR in one pass
  (a camera's `size`);
- pyav-sws1: the same as pyav through one swscale context kept across frames, on the decoding thread
  (what a camera process does, daemon/cameras/source.py);
- pyav-cv2: the same as pyav-yuv, then OpenCV's I420-to-BGR conversion on one thread (measured against
  pyav-sws1, not used: no cheaper);
- ffmpeg: `ffmpeg` as a child writing BGR frames to a pipe, read into one buffer (child + reader);
- gstreamer: rtspsrc ! rtph264depay ! h264parse ! avdec_h264 ! videoconvert ! appsink
  (tests/support/gst/decode.py under Debian's python3), each frame copied out once.

The kinds alternate over `--rounds`; the median round per kind is shown: ms of CPU per frame, its ratio
to the floor in the same run (the goal: <= 1.25 x), and cameras per core at `fps` (1 / (CPU per frame x fps)).
Writes "## Cameras: decoding" in RESULTS.md.

The daemon mode (`--daemon`, `daemon_run` below) runs N cameras through the daemon's [[cameras]] to the
tests' one-model camera pipeline, gate off then on, a moving scene or (`--still`) one where only the
sensor noise changes, and reports per camera the frames decoded and served a second, the capture-to-result
age p50, p95 and p99 (what the daemon keeps of it: `ctl cameras`), CPU per decoded frame of the daemon and its
camera processes, and cameras per core. Writes "## Cameras: through the daemon" (", still scene"). It
skips (exit 0, saying so) where this checkout has no infermux.cameras.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

# The readers (`--reader`, one process per camera) import only what they use: `support.rtsp` and
# `results` (pytest, infermux) are the parent's, imported where it needs them.

SECTION = "Cameras: decoding"
DAEMON_SECTION = "Cameras: through the daemon"
# A live stream's probe, as the cameras open one (daemon/cameras/source.py): FFmpeg's default reads
# seconds of the stream before its first frame.
PROBE = {"analyzeduration": "500000", "probesize": "1000000"}
KINDS = ("floor", "pyav", "pyav-yuv", "pyav-half", "pyav-sws1", "pyav-cv2", "ffmpeg", "gstreamer")
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Window:
    """What one reader measured over its window: frames, CPU seconds, wall seconds."""

    frames: int
    cpu_s: float
    wall_s: float


def proc_cpu_s(pid: int) -> float:
    """User + system seconds of process `pid` so far (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# -- the readers (each runs as `bench_cameras.py --reader KIND`, its own process) -------------------

def read_pyav(url: str, warmup: float, seconds: float, transport: str, out: str = "bgr") -> Window:
    """PyAV in this process: decode, each frame to a BGR array (`out` "bgr"), to one of half the width and
    height (scaled and converted in one pass, "half"), its YUV planes copied as they are ("yuv"), to BGR by
    one kept swscale context on this thread ("sws1"), or its I420 planes to BGR by OpenCV on this thread ("cv2")."""
    import av
    from av.video.reformatter import VideoReformatter

    reformatter = VideoReformatter()
    if out == "cv2":
        import cv2

        cv2.setNumThreads(1)

    with av.open(url, options={"rtsp_transport": transport, **PROBE}, timeout=10) as container:
        counter = _Counter(warmup, seconds, time.process_time)
        for frame in container.decode(video=0):
            if out == "yuv":
                frame.to_ndarray()
            elif out == "cv2":
                cv2.cvtColor(frame.to_ndarray(), cv2.COLOR_YUV2BGR_I420)
            elif out == "sws1":
                reformatter.reformat(frame, format="bgr24", threads=1).to_ndarray()
            else:
                scale = 2 if out == "half" else 1
                frame.to_ndarray(width=frame.width // scale, height=frame.height // scale, format="bgr24")
            if counter.tick():
                return counter.result()
    raise SystemExit(f"{url} ended")


def read_ffmpeg_pipe(url: str, warmup: float, seconds: float, transport: str, size: tuple[int, int]) -> Window:
    """`ffmpeg` as a child writing BGR frames to a pipe; this process reads them into one buffer."""
    cmd = ["ffmpeg", "-v", "error", "-rtsp_transport", transport, *_probe_flags(), "-i", url, "-f", "rawvideo",
           "-pix_fmt", "bgr24", "pipe:1"]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert child.stdout is not None
    buffer = memoryview(bytearray(size[0] * size[1] * 3))
    try:
        counter = _Counter(warmup, seconds, lambda: time.process_time() + proc_cpu_s(child.pid))
        while True:
            got = 0
            while got < len(buffer):
                n = child.stdout.readinto(buffer[got:])
                if not n:
                    raise SystemExit(f"ffmpeg ended: {url}")
                got += n
            if counter.tick():
                return counter.result()
    finally:
        child.kill()
        child.wait()


def _probe_flags() -> list[str]:
    return [arg for key, value in PROBE.items() for arg in (f"-{key}", value)]


def read_floor(url: str, warmup: float, seconds: float, transport: str) -> Window:
    """`ffmpeg -i URL -f null -`: its frame count from -progress, its CPU from /proc."""
    cmd = ["ffmpeg", "-v", "error", "-rtsp_transport", transport, *_probe_flags(), "-i", url, "-f", "null", "-",
           "-progress", "pipe:1", "-stats_period", "0.2"]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert child.stdout is not None
    try:
        marks: list[tuple[int, float, float]] = []  # (frames, cpu, time) at the window's two ends
        first = None
        for line in child.stdout:
            if not line.startswith("frame="):
                continue
            frames, now = int(line.split("=")[1]), time.monotonic()
            if frames == 0:
                continue
            first = first or now
            if (not marks and now - first >= warmup) or (marks and now - marks[0][2] >= seconds):
                marks.append((frames, proc_cpu_s(child.pid), now))
                if len(marks) == 2:
                    (f0, c0, t0), (f1, c1, t1) = marks
                    return Window(f1 - f0, c1 - c0, t1 - t0)
        raise SystemExit(f"ffmpeg ended: {url}")
    finally:
        child.kill()
        child.wait()


class _Counter:
    """Counts frames; opens the window after `warmup` seconds of them and closes it `seconds` later."""

    def __init__(self, warmup: float, seconds: float, cpu: object) -> None:
        self.warmup, self.seconds, self.cpu = warmup, seconds, cpu
        self.first: float | None = None
        self.start: tuple[float, float] | None = None
        self.frames = 0
        self.end: tuple[float, float] = (0.0, 0.0)

    def tick(self) -> bool:
        """One frame more; True once the window is complete."""
        now = time.monotonic()
        self.first = self.first or now
        if self.start is None:
            if now - self.first >= self.warmup:
                self.start = (now, self.cpu())  # type: ignore[operator]
            return False
        self.frames += 1
        if now - self.start[0] >= self.seconds:
            self.end = (now, self.cpu())  # type: ignore[operator]
            return True
        return False

    def result(self) -> Window:
        assert self.start is not None
        return Window(self.frames, self.end[1] - self.start[1], self.end[0] - self.start[0])


def reader_command(kind: str, url: str, args: argparse.Namespace, size: tuple[int, int]) -> list[str]:
    """The command line of one reader process of `kind`."""
    from support import rtsp

    common = ["--warmup", str(args.warmup), "--seconds", str(args.seconds), "--transport", args.transport]
    if kind == "gstreamer":
        return [rtsp.DEBIAN_PYTHON, str(rtsp.DECODE), "--url", url, *common]
    return [sys.executable, __file__, "--reader", kind, "--url", url, "--size", f"{size[0]}x{size[1]}", *common]


def run_reader(args: argparse.Namespace) -> None:
    """`--reader KIND`: measure one camera and print the window as one JSON line."""
    size = parse_size(args.size[0])
    readers = {"pyav": lambda: read_pyav(args.url, args.warmup, args.seconds, args.transport),
               "pyav-yuv": lambda: read_pyav(args.url, args.warmup, args.seconds, args.transport, "yuv"),
               "pyav-half": lambda: read_pyav(args.url, args.warmup, args.seconds, args.transport, "half"),
               "pyav-sws1": lambda: read_pyav(args.url, args.warmup, args.seconds, args.transport, "sws1"),
               "pyav-cv2": lambda: read_pyav(args.url, args.warmup, args.seconds, args.transport, "cv2"),
               "ffmpeg": lambda: read_ffmpeg_pipe(args.url, args.warmup, args.seconds, args.transport, size),
               "floor": lambda: read_floor(args.url, args.warmup, args.seconds, args.transport)}
    w = readers[args.reader]()
    print(json.dumps({"frames": w.frames, "cpu_s": w.cpu_s, "wall_s": w.wall_s}), flush=True)


# -- the decoding run ----------------------------------------------------------------------------

def parse_size(text: str) -> tuple[int, int]:
    """"640x360" -> (640, 360)."""
    width, height = text.lower().split("x")
    return int(width), int(height)


def one_round(kind: str, url: str, args: argparse.Namespace, size: tuple[int, int]) -> list[Window]:
    """N readers of `kind` at once, one per camera; each one's window."""
    procs = [subprocess.Popen(reader_command(kind, url, args, size), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True) for _ in range(args.cameras)]
    windows = []
    for proc in procs:
        out, err = proc.communicate(timeout=args.warmup + args.seconds + 60)
        if proc.returncode != 0:
            raise SystemExit(f"{kind} reader failed ({proc.returncode}): {err[-2000:]}")
        got = json.loads(out.strip().splitlines()[-1])
        windows.append(Window(got["frames"], got["cpu_s"], got["wall_s"]))
    return windows


def ms_per_frame(windows: list[Window]) -> float:
    """CPU milliseconds per frame over all the round's cameras."""
    return 1000 * sum(w.cpu_s for w in windows) / max(1, sum(w.frames for w in windows))


def floor_ratio(kind: str, ms: list[float], floors: list[list[Window]]) -> str:
    """The median per-round ratio of `ms` to the floor's CPU per frame; rounds whose floor used less CPU
    than /proc can count (one clock tick: a short window of small frames) are left out."""
    if kind == "floor":
        return "1.00 ×"
    ratios = [m / ms_per_frame(f) for m, f in zip(ms, floors) if ms_per_frame(f) > 0]
    return f"{statistics.median(ratios):.2f} ×" if ratios else "– (the floor's CPU was under one clock tick)"


def size_table(size: tuple[int, int], rounds: dict[str, list[list[Window]]], fps: int) -> list[list[str]]:
    """The rows for one size: per kind the median round's CPU per frame, its ratio to the floor, the slowest
    camera's frame rate and cameras per core at `fps`."""
    rows = []
    for kind, per_round in rounds.items():
        ms = [ms_per_frame(r) for r in per_round]
        ratio = floor_ratio(kind, ms, rounds["floor"]) if "floor" in rounds else "–"
        slowest = min(w.frames / w.wall_s for r in per_round for w in r)
        median = statistics.median(ms)
        # a CPU time under one clock tick gives no cameras-per-core figure rather than a division by zero
        per_core = f"{1000 / (median * fps):.0f}" if median > 0 else "–"
        rows.append([f"{size[0]}×{size[1]}", kind, f"{median:.2f}", f"{min(ms):.2f}–{max(ms):.2f}",
                     ratio, f"{slowest:.1f}", per_core])
    return rows


def decode_run(args: argparse.Namespace) -> None:
    """Each size: the RTSP server, every kind's readers over the rounds (kinds alternating), one table."""
    from results import markdown_table, print_and_write, stamp
    from support import rtsp

    check_packages(args.decoders)
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-cameras-") as tmp:
        for text in args.size:
            size = parse_size(text)
            clip = rtsp.make_clip(Path(tmp), *size, fps=args.fps, seconds=args.clip_seconds, moving=not args.still)
            rounds: dict[str, list[list[Window]]] = {kind: [] for kind in args.decoders}
            with rtsp.RtspServer(clip) as server:
                for n in range(args.rounds):
                    for kind in args.decoders:
                        rounds[kind].append(one_round(kind, server.url, args, size))
                        print(f"{text} round {n + 1} {kind}: {ms_per_frame(rounds[kind][-1]):.2f} ms/frame",
                              file=sys.stderr, flush=True)
            rows += size_table(size, rounds, args.fps)
    header = ["size", "decoder", "CPU ms / frame", "range", "÷ floor", "slowest camera fps", f"cameras / core at {args.fps} fps"]
    body = (f"{stamp()}\n\n`python tests/benchmarks/bench_cameras.py {' '.join(sys.argv[1:])}`: "
            f"{args.cameras} camera(s) at once, {args.fps} fps over RTSP/{args.transport.upper()} from "
            f"GStreamer's RTSP server on this box, {args.seconds:g} s measured after {args.warmup:g} s, median of "
            f"{args.rounds} round(s) (range: all rounds).\n\n" + markdown_table(header, rows))
    print_and_write(SECTION, body, write=args.write, titled=True)


def check_packages(kinds: list[str]) -> None:
    """Exit, naming the command, where this box lacks what the chosen readers need."""
    from support import rtsp, system_packages

    needs = {**rtsp.SERVER_PACKAGES, **(rtsp.FFMPEG_PACKAGES if {"floor", "ffmpeg"} & set(kinds) else {}),
             **(rtsp.CLIENT_PACKAGES if "gstreamer" in kinds else {})}
    missing = system_packages.missing(needs)
    if missing:
        raise SystemExit(f"{', '.join(missing)} missing: sudo apt-get install {' '.join(missing)}")
    if any(k.startswith("pyav") for k in kinds) and importlib.util.find_spec("av") is None:
        raise SystemExit("PyAV missing: pip install av")


# -- through the daemon --------------------------------------------------------------------------

# N cameras of one RTSP server, each to the tests' one-model camera pipeline (tests/support/pipelines.py:
# decode, resize to 64 x 64, normalize, the sample classifier of engines/); "gate on" adds [cameras.gate]
# with a keep-alive every second.
DAEMON_HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
watch = false

[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
"""
CAMERA = """
[[cameras]]
name = "cam{i}"
url = "{url}"
transport = "{transport}"
pipeline = "camera"
fps = {fps}
{gate}"""
GATE = "[cameras.gate]\nevery_s = 1.0\n"
AGES = ("p50", "p95", "p99")  # what the daemon keeps of a stream's capture-to-result age


@dataclass(frozen=True)
class DaemonRound:
    """One run of N cameras through the daemon: the ages of their results and the CPU it took."""

    gate: bool
    ages_ms: dict[str, float]  # capture-to-result age, the median over the cameras of each one's percentile
    cpu_s: float  # the daemon and its camera processes, over the window
    frames: int  # frames decoded by the cameras over the window
    served: int  # frames whose results came back over the window
    wall_s: float


def daemon_config(url: str, args: argparse.Namespace, gate: bool) -> str:
    """The daemon's configuration: the model, its pipeline, and `args.cameras` cameras of `url`."""
    from support.pipelines import camera_pipeline

    cameras = "".join(CAMERA.format(i=i, url=url, transport=args.transport, fps=args.fps, gate=GATE if gate else "")
                      for i in range(args.cameras))
    return (DAEMON_HEAD + camera_pipeline("camera")).format(engines=HERE.parents[1] / "engines") + cameras


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of process `pid` and its children (the camera processes), alive now."""
    # Each thread lists the children it started: the cameras are started by the daemon's supervisor thread.
    # A thread or a child may end while it is read (a camera restarted): what it took goes with it.
    children: list[str] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += (task / "children").read_text().split()
    total = proc_cpu_s(pid)
    for child in children:
        with contextlib.suppress(OSError):
            total += tree_cpu_s(int(child))
    return total


def camera_stats(admin: Any) -> dict[str, dict[str, Any]]:
    """Per camera, the admin command `cameras`' row: counters, state, capture_age_ms {p50, p95, p99}."""
    return {row["camera"]: row for row in admin.call("cameras")["cameras"]}


def daemon_round(url: str, args: argparse.Namespace, workdir: Path, gate: bool) -> DaemonRound:
    """Start a daemon with the cameras, wait for results for each, then measure over `args.seconds`."""
    from support.harness import Daemon
    from support.polling import eventually

    workdir.mkdir(parents=True, exist_ok=True)
    daemon = Daemon(workdir, daemon_config(url, args, gate)).start()
    try:
        with daemon.admin() as admin:
            eventually(lambda: all(s["served"] > 0 for s in camera_stats(admin).values()),
                       "results for every camera", timeout_s=60)
            time.sleep(args.warmup)  # past the cameras' start-up: the window measures steady state
            assert daemon.proc is not None
            before, cpu0, t0 = camera_stats(admin), tree_cpu_s(daemon.proc.pid), time.monotonic()
            time.sleep(args.seconds)
            after, cpu1, t1 = camera_stats(admin), tree_cpu_s(daemon.proc.pid), time.monotonic()
        for name, row in after.items():  # what each camera went through in the window, on stderr
            print(f"{name}: {row['state']} decoded {row['decoded'] - before[name]['decoded']} served "
                  f"{row['served'] - before[name]['served']} reconnects {row['reconnects'] - before[name]['reconnects']} "
                  f"restarts {row['restarts'] - before[name]['restarts']} {row['last_error'] or ''}", file=sys.stderr)
        frames = sum(after[c]["decoded"] - before[c]["decoded"] for c in after)
        served = sum(after[c]["served"] - before[c]["served"] for c in after)
        ages = {p: statistics.median(after[c]["capture_age_ms"][p] or 0.0 for c in after) for p in AGES}
        return DaemonRound(gate, ages, cpu1 - cpu0, frames, served, t1 - t0)
    finally:
        daemon.stop()


def daemon_run(args: argparse.Namespace) -> None:
    """`--daemon`: N cameras through the daemon, gate off then on; skipped without infermux.cameras.
    Cameras per core: how many cameras at `fps` one core's CPU time pays for, at the window's CPU per decoded
    frame (as in the decoding table; not the cameras over the cores used, which flatters a starved round)."""
    if importlib.util.find_spec("infermux.cameras") is None:
        print("skipped: this checkout has no infermux.cameras (the daemon does not read cameras yet)")
        return
    from results import markdown_table, print_and_write, stamp
    from support import rtsp

    check_packages([])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cameras-daemon-") as tmp:
        for text in args.size:
            size = parse_size(text)
            clip = rtsp.make_clip(Path(tmp), *size, fps=args.fps, seconds=args.clip_seconds, moving=not args.still)
            with rtsp.RtspServer(clip) as server:
                for gate in (False, True):
                    r = daemon_round(server.url, args, Path(tmp) / text / ("gate" if gate else "plain"), gate)
                    if not r.frames:  # no camera decoded in the window (stderr says what each went through)
                        rows.append([text, "on" if gate else "off", *["no frame in the window"] * 7])
                        continue
                    rows.append([text, "on" if gate else "off", f"{r.frames / r.wall_s / args.cameras:.1f}",
                                 f"{r.served / r.wall_s / args.cameras:.1f}", *(f"{r.ages_ms[p]:.1f}" for p in AGES),
                                 f"{1000 * r.cpu_s / r.frames:.2f}", f"{r.frames / (r.cpu_s * args.fps):.1f}"])
    header = ["size", "gate", "decoded fps / camera", "served fps / camera", "age p50 ms", "age p95 ms", "age p99 ms",
              "CPU ms / decoded frame", f"cameras / core at {args.fps} fps"]
    body = (f"{stamp()}\n\n`python tests/benchmarks/bench_cameras.py {' '.join(sys.argv[1:])}`: {args.cameras} "
            f"cameras of a {'still' if args.still else 'moving'} scene through the daemon's [[cameras]] to a "
            "one-model pipeline; age from capture to result (the median over the cameras of each one's "
            "percentile), CPU of the daemon and its camera processes.\n\n"
            + markdown_table(header, rows))
    print_and_write(DAEMON_SECTION + (", still scene" if args.still else ""), body, write=args.write, titled=True)


def main() -> None:
    """Parse the command line; run a reader, the decoding comparison or the daemon's cameras."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=1, help="cameras read at once")
    parser.add_argument("--size", action="append", help="WxH, repeatable (default 640x360 and 1280x720)")
    parser.add_argument("--fps", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=8.0, help="the measured window of each reader")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of frames before the window")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clip-seconds", type=float, default=4.0, help="the looped clip's length")
    parser.add_argument("--decoders", default=",".join(KINDS), help=f"a comma-separated subset of {','.join(KINDS)}")
    parser.add_argument("--transport", default="tcp", choices=("tcp", "udp"))
    parser.add_argument("--still", action="store_true", help="a scene that does not move (the gate's case)")
    parser.add_argument("--daemon", action="store_true", help="through the daemon's [[cameras]] (needs infermux.cameras)")
    parser.add_argument("--faults", nargs="?", const="all", help="one faulty camera beside a healthy one and a plain "
                        "client (camera_faults.py): all, or a comma-separated subset of its faults")
    parser.add_argument("--against", metavar="REV", help="--faults: also run the daemon at git revision REV, "
                        "pairs of rounds alternating")
    parser.add_argument("--no-write", dest="write", action="store_false", help="print only; leave RESULTS.md")
    parser.add_argument("--reader", choices=KINDS[:-1], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size = args.size or ["640x360", "1280x720"]
    args.decoders = [k for k in args.decoders.split(",") if k]
    unknown = set(args.decoders) - set(KINDS)
    if unknown:
        parser.error(f"unknown decoders {sorted(unknown)}: choose from {', '.join(KINDS)}")
    if args.reader:
        run_reader(args)
    elif args.faults:
        from camera_faults import FAULTS, faults_run

        args.faults = FAULTS if args.faults == "all" else args.faults.split(",")
        if set(args.faults) - set(FAULTS):
            parser.error(f"unknown faults {sorted(set(args.faults) - set(FAULTS))}: choose from {', '.join(FAULTS)}")
        faults_run(args)
    elif args.daemon:
        daemon_run(args)
    else:
        decode_run(args)


if __name__ == "__main__":
    main()
