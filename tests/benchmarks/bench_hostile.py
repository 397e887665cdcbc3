"""Hostile clients against one daemon while well-behaved clients keep measuring.

    python tests/benchmarks/bench_hostile.py [--seconds 4] [--rounds 3] [--only TEXT] [--no-write]

One daemon runs under `prlimit --nofile=1024:2700` (systemd's default
soft limit, which the daemon raises to the hard one; 2700 leaves room
for the connection guard's lead, docs/security.md) with a metrics port,
its engine_dir watched, a `decode` pipeline and, where OpenCV, Pillow
and rapidocr-onnxruntime are installed, the OCR example pipeline. Each
scenario starts an attacker, and two well-behaved clients send requests
meanwhile; their answered share and p99 are compared with a run without
attacker just before it (the box is shared: a baseline taken once
drifts). The daemon's peak RSS (VmHWM, reset before each scenario) and
its most open descriptors (sampled every 50 ms) are read around each, and
the peak is compared with the quiet run's. Goal: 100 % answered, p99
within 2x of the baseline, peak RSS within 256 MiB of the quiet run.
Writes the "Hostile clients" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, process_cpu_s, stamp  # noqa: E402

from support.harness import Daemon  # noqa: E402
from support.models import box_echo_pipeline  # noqa: E402
from infermux.client import Client  # noqa: E402

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
watch_settle_s = 0.2
watch_rescan_s = 1.0
metrics_port = {port}

[[models]]
name = "fast512"
engine = "fast512/1/model.onnx"
max_queue = 100000

[[models]]
name = "cold"
engine = "fast512/1/model.onnx"
mode = "multiproc"  # placement = "cold" by its old name, which --against revisions before it read too
preload = true
max_queue = 1000
idle_unload_s = 86400   # the scenarios before its own take longer than the default 300 s

[[models]]
name = "tile"
engine = "tile/1/model.onnx"
max_queue = 64
options = {{ cpu_arena = false }}   # onnxruntime's arena would keep the outputs' high-water mark
"""
FRAMES = """
[[pipelines]]
name = "frames"
[[pipelines.steps]]
processor = "decode"
"""
# The keys' scenarios: a `track` pipeline (its default max_keys, 256 streams) and a re-inferred classifier
# within max_calls_per_s, behind tests/support/models.py's brightness map as the detector; `nice = 10`
# on them as on the OCR example's (a box that also serves small models gives them the CPU first).
KEYED = """
[[models]]
name = "det"
engine = "det/1/model.onnx"
nice = 10

[[models]]
name = "cls"
engine = "{classifier}"
max_batch = 32
nice = 10
"""
# A "detector" that echoes its frame's pixels as boxes (tests/support/models.py's box_echo): a raw gray
# frame of a few bytes, scaled, is a box of any size ("boxes") or one of infinite corners ("infinite").
BOXES = '\n[[models]]\nname = "echo"\nengine = "echo/1/model.onnx"\n' + "".join(
    (box_echo_pipeline("boxes", "200.0"), box_echo_pipeline("infinite", "1e38", track=True)))
X = np.ones((1, 512), np.float32)
CLIENTS = 2


class Stop(Protocol):
    """When an attacker stops: a multiprocessing.Event, since each attacker is a process."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def well_behaved(endpoint: str, stop: threading.Event, latencies: list[float], failures: list[int]) -> None:
    """One client in a loop: each request answered 200 within 5 s counts, with its latency."""
    with Client(endpoint, timeout_s=5) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                ok = client.infer("fast512", {"x": X}).status == 200
            except TimeoutError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - start)
            else:
                failures.append(1)


def measure(endpoint: str, seconds: float, attack: Callable[[Stop], None] | None, pid: int = 0) -> dict:
    stop = threading.Event()
    most_fds = [0]
    sampler = threading.Thread(target=sample_fds, args=(pid, stop, most_fds), daemon=True) if pid else None
    if sampler:
        sampler.start()
    latencies: list[float] = []
    failures: list[int] = []
    threads = [threading.Thread(target=well_behaved, args=(endpoint, stop, latencies, failures))
               for _ in range(CLIENTS)]
    # The attacker is a process of its own, as on a real box: a thread here would also take
    # the GIL from the well-behaved clients' timing, which is this process's fault, not the daemon's.
    forked = multiprocessing.get_context("fork")
    attacker_stop = forked.Event()
    attacker = forked.Process(target=attack, args=(attacker_stop,), daemon=True) if attack else None
    if attacker:
        attacker.start()
    for t in threads:
        t.start()
    time.sleep(seconds)
    attacker_cpu = process_cpu_s(attacker.pid) / seconds if attacker and attacker.pid else 0.0
    stop.set()
    attacker_stop.set()
    for t in threads:
        t.join()
    if attacker:
        attacker.join(30)
        if attacker.is_alive():
            attacker.kill()
    total = len(latencies) + len(failures)
    return {"answered": 100.0 * len(latencies) / max(1, total), "requests": total, "attacker_cpu": attacker_cpu,
            "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else float("nan"),
            "most_fds": most_fds[0]}


def sample_fds(pid: int, stop: threading.Event, most: list[int]) -> None:
    """The most descriptors `pid` holds while the window runs (every 50 ms)."""
    while not stop.wait(0.05):
        try:
            most[0] = max(most[0], len(os.listdir(f"/proc/{pid}/fd")))
        except OSError:
            return


def proc_facts(pid: int) -> tuple[float, int]:
    return status_mib(pid, "VmRSS"), len(os.listdir(f"/proc/{pid}/fd"))


def status_mib(pid: int, field: str) -> float:
    """A /proc/PID/status figure (VmRSS, VmHWM) in MiB."""
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith(field + ":")) / 1024


def reset_peak(pid: int) -> None:
    """VmHWM starts again from the RSS now (Linux 4.0+; the owner or root)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


# -- attackers -------------------------------------------------------------------------

def non_reader(endpoint: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        sock = zmq.Context().socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.RCVHWM, 1), (zmq.RCVBUF, 4096), (zmq.SNDHWM, 0)):
            sock.setsockopt(option, value)
        sock.connect(endpoint)
        header = json.dumps({"model": "fast512", "id": 0,
                             "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512]}]}).encode()
        for _ in range(30000):
            sock.send_multipart([b"", header, X.tobytes()])
        stop.wait()
        sock.close()
    return attack


def connection_flood(path: str, count: int = 1100) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        conns = []
        for _ in range(count):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(path)
            except OSError:
                conn.close()
                continue
            conns.append(conn)
        stop.wait()
        for conn in conns:
            conn.close()
    return attack


def metrics_flood(port: int, count: int = 1100) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        conns = []
        for _ in range(count):
            conn = socket.socket()
            conn.setblocking(False)
            conn.connect_ex(("127.0.0.1", port))
            conns.append(conn)
        stop.wait()
        for conn in conns:
            conn.close()
    return attack


def empty_packets(path: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        while not stop.is_set():
            fds = [os.memfd_create("x") for _ in range(4)]
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.connect(path)
                socket.send_fds(sock, [b""], fds)
                sock.recv(16)
            for fd in fds:
                os.close(fd)
    return attack


def nested_admin(endpoint: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        sock = zmq.Context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        while not stop.is_set():
            sock.send_multipart([b"", b'{"cmd": ' + b"[" * 20000 + b"]" * 20000 + b"}"])
            sock.poll(5000)
            if sock.poll(0):
                sock.recv_multipart()
        sock.close()
    return attack


def many_frames(endpoint: str) -> Callable[[Stop], None]:
    """One message of 40 frames of 1 MB each after another: each is read whole, then refused."""
    def attack(stop: Stop) -> None:
        sock = zmq.Context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        header = json.dumps({"model": "fast512", "id": 0,
                             "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512]}]}).encode()
        frame = bytes(1_000_000)
        while not stop.is_set():
            sock.send_multipart([b"", header, *([frame] * 40)])
            if sock.poll(5000):
                sock.recv_multipart()
        sock.close()
    return attack


def cpu_hog() -> Callable[[Stop], None]:
    """Not a client at all: a process that only burns a core. What any local process can do to the
    others' p99 on a 2-core box; the reference for the attackers' own CPU use."""
    def attack(stop: Stop) -> None:
        while not stop.is_set():
            for _ in range(100_000):
                pass
    return attack


def stopped_worker(daemon: Daemon) -> Callable[[Stop], None]:
    """The cold model's worker SIGSTOPped while requests with a 300 ms deadline keep coming for it."""
    def attack(stop: Stop) -> None:
        with Client(daemon.endpoint, timeout_s=30) as client:  # its worker runs (a request starts it)
            while client.infer("cold", {"x": X}).status != 200:
                time.sleep(0.1)
        with daemon.admin() as admin:
            pid = next(m for m in admin.call("models")["models"] if m["name"] == "cold")["worker"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            with Client(daemon.endpoint, timeout_s=5) as client:
                while not stop.is_set():
                    try:
                        client.infer("cold", {"x": X}, timeout_ms=300)  # 504 at its deadline
                    except TimeoutError:
                        pass
        finally:
            os.kill(pid, signal.SIGCONT)
    return attack


# -- round two: frames, engine folders, probes and sockets -------------------------------------------

def _dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _ask(sock: zmq.Socket, frames: list, timeout_ms: int = 30000) -> None:
    """Send one request and wait for its reply (or give up): one at a time, as a client would."""
    sock.send_multipart([b"", *frames])
    if sock.poll(timeout_ms):
        sock.recv_multipart()


def frame_bombs(endpoint: str) -> Callable[[Stop], None]:
    """The lying JPEGs and PNGs (hostile_files.py) to a `decode` pipeline, one after another."""
    def attack(stop: Stop) -> None:
        from support import hostile_files as hf
        from infermux.pipelines.wire import encode_frame
        bombs = [(hf.jpeg_with_fill_byte(), "jpeg"), (hf.jpeg_with_big_app_segment(), "jpeg"),
                 (hf.png_with_a_chunk_before_ihdr(), "png"), (hf.ppm_named_jpeg(), "jpeg")]
        sock = _dealer(endpoint)
        while not stop.is_set():
            for data, fmt in bombs:
                _ask(sock, encode_frame("frames", data, fmt, id=1))
        sock.close()
    return attack


def ocr_bombs(endpoint: str, vary: bool = False) -> Callable[[Stop], None]:
    """1,000 tiny tokens, a long thin line, a blank 8192 x 8192 PNG, in turn, to the OCR example;
    with `vary`, each sent with a text chunk of its own, so that no two sends are the same bytes
    (the pipeline remembers the frames it refused, not their pixels)."""
    def attack(stop: Stop) -> None:
        from support import hostile_files as hf
        from infermux.pipelines.wire import encode_frame
        bombs = [hf.drawn(25, 40), hf.drawn(3, 4, line=150), hf.blank_png(8192, 8192)]
        sock = _dealer(endpoint)
        sent, own = 0, os.urandom(8).hex()  # each round's attacker is a new process: its texts its own too
        while not stop.is_set():
            for data in bombs:
                sent += 1
                _ask(sock, encode_frame("ocr", _png_text(data, f"{own}-{sent}") if vary else data, "png", id=1))
        sock.close()
    return attack


def _png_text(png: bytes, text: str) -> bytes:
    """`png` with a tEXt chunk after its header: other bytes, the same image."""
    import struct
    import zlib
    body = b"tEXt" + b"n\0" + text.encode()
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    return png[:33] + chunk + png[33:]  # the 8-byte signature and the 25-byte IHDR chunk come first


def module_path_backends(engines: Path, source: Path) -> Callable[[Stop], None]:
    """A model folder whose model.toml names `backend = "os:abort"`, published and removed in a loop
    (the watcher sees each; it used to kill the daemon)."""
    def attack(stop: Stop) -> None:
        i = 0
        while not stop.is_set():
            folder = engines / f"evil{i}"
            (folder / "1").mkdir(parents=True)
            shutil.copy(source, folder / "1/model.onnx")
            (folder / "model.toml").write_text('backend = "os:abort"\n')
            stop.wait(0.5)
            shutil.rmtree(folder)
            i += 1
    return attack


def metrics_drip(port: int, count: int = 16) -> Callable[[Stop], None]:
    """`count` connections to the metrics port each sending a byte of a request every second, never
    ending it (reopened when closed), and 4 scrapes whose replies are never read."""
    def attack(stop: Stop) -> None:
        def connect() -> socket.socket | None:
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=1)
            except OSError:
                return None
        drips = [connect() for _ in range(count)]
        held = []
        for _ in range(4):
            conn = socket.socket()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            conn.connect(("127.0.0.1", port))
            conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            held.append(conn)
        while not stop.wait(1.0):
            for i, conn in enumerate(drips):
                try:
                    if conn is None:
                        raise OSError
                    conn.send(b"a")
                except OSError:
                    if conn is not None:
                        conn.close()
                    drips[i] = connect()
        for conn in [*drips, *held]:
            if conn is not None:
                conn.close()
    return attack


def regions_idle(path: str, count: int = 64) -> Callable[[Stop], None]:
    """`count` connections to regions.sock that never send a packet (reopened when closed)."""
    def attack(stop: Stop) -> None:
        def connect() -> socket.socket:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(path)
            conn.setblocking(False)
            return conn
        conns = [connect() for _ in range(count)]
        while not stop.wait(0.5):
            for i, conn in enumerate(conns):
                try:
                    if conn.recv(4096) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                conn.close()
                conns[i] = connect()
        for conn in conns:
            conn.close()
    return attack


def regions_bad_packets(path: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(path)
            while not stop.is_set():
                sock.send(b"[not json")
                sock.recv(4096)
    return attack


def regions_register_loop(path: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        fd = os.memfd_create("loop", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 4096)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(path)
            while not stop.is_set():
                socket.send_fds(sock, [b'{"op": "register", "name": "loop"}'], [fd])
                token = json.loads(sock.recv(4096))["region"]
                sock.send(json.dumps({"op": "unregister", "region": token}).encode())
                sock.recv(4096)
        os.close(fd)
    return attack


def sparse_inputs(endpoint: str, path: str) -> Callable[[Stop], None]:
    """Requests pointing into a 2 GiB memfd the client never wrote: 512 MiB (over
    max_shared_input_bytes) and 64 MiB (within it, on pages never written), in turn."""
    def attack(stop: Stop) -> None:
        fd = os.memfd_create("sparse", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 2 << 30)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as reg:
            reg.connect(path)
            socket.send_fds(reg, [b'{"op": "register", "name": "sparse"}'], [fd])
            token = json.loads(reg.recv(4096))["region"]
            sock = _dealer(endpoint)
            while not stop.is_set():
                for rows in (1 << 18, 1 << 15):
                    header = {"model": "fast512", "id": 1, "inputs": [
                        {"name": "x", "dtype": "float32", "shape": [rows, 512], "region": token, "offset": 0}]}
                    _ask(sock, [json.dumps(header).encode()])
            sock.close()
        os.close(fd)
    return attack


def huge_sets(endpoint: str) -> Callable[[Stop], None]:
    """`set` with weights of 10**400 and contexts=1024, refused, in a loop."""
    def attack(stop: Stop) -> None:
        from infermux.client import AdminClient
        with AdminClient(endpoint, timeout_s=10) as admin:
            while not stop.is_set():
                admin.call("set", check=False, model="fast512", weights={"1": 10**400})
                admin.call("set", check=False, model="fast512", contexts=1024)
    return attack


def huge_replies(endpoint: str) -> Callable[[Stop], None]:
    """A 4 MiB input to a model that tiles it 32 times: a 128 MiB reply, over max_reply_bytes (64 MiB)."""
    def attack(stop: Stop) -> None:
        x = np.ones((2000, 512), np.float32)
        repeats = np.array([32, 1], np.int64)
        with Client(endpoint, timeout_s=30) as client:
            while not stop.is_set():
                try:
                    client.infer("tile", {"x": x, "repeats": repeats})
                except TimeoutError:
                    pass
    return attack


def _echoed(*boxes: tuple[int, ...]) -> np.ndarray:
    """The one-row gray frame the echo model reads as `boxes` (cx, cy, w, h, score: a byte each)."""
    return np.array(boxes, np.uint8).T.reshape(1, -1)


def giant_boxes(endpoint: str) -> Callable[[Stop], None]:
    """One 40,000 x 40,000 box from a 10-byte frame, each send other bytes (a second box, scored 0)."""
    def attack(stop: Stop) -> None:
        from infermux.pipelines.wire import encode_frame
        sock, sent = _dealer(endpoint), 0
        while not stop.is_set():
            sent += 1
            frame = _echoed((100, 100, 200, 200, 1), (sent % 256, sent // 256 % 256, 0, 0, 0))
            _ask(sock, encode_frame("boxes", frame, "gray", width=10, height=1, id=1))
        sock.close()
    return attack


def nan_boxes(endpoint: str) -> Callable[[Stop], None]:
    """A NaN box beside a good one, through `track` into `crop`, each send another key's."""
    def attack(stop: Stop) -> None:
        from infermux.pipelines.wire import encode_frame
        sock, sent = _dealer(endpoint), 0
        frame = _echoed((255, 0, 255, 0, 1), (0, 0, 0, 0, 1))
        while not stop.is_set():
            sent += 1
            _ask(sock, encode_frame("infinite", frame, "gray", width=10, height=1, id=1, key=f"cam-{sent % 64}"))
        sock.close()
    return attack


def scan_bombs(endpoint: str) -> Callable[[Stop], None]:
    """A 1 MB progressive 2048 x 2048 JPEG of 100,000 empty scans to a `decode` step, each send with a
    comment segment of its own (other bytes, the same image)."""
    def attack(stop: Stop) -> None:
        from support import hostile_files as hf
        from infermux.pipelines.wire import encode_frame
        bomb = hf.progressive_jpeg_with_scans(2048, 100_000)
        sock, sent = _dealer(endpoint), 0
        while not stop.is_set():
            sent += 1
            comment = str(sent).encode()
            data = bomb[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + bomb[2:]
            _ask(sock, encode_frame("frames", data, "jpeg", id=1, timeout_ms=10_000))
        sock.close()
    return attack


# -- client text and budgets per stream ----------------------------------------------------------

def keyed_config(engines: Path) -> str:
    """KEYED's models (the detector written into `engines`) and its two pipelines."""
    from support import models
    from support.tracking import classifying, detecting
    models.brightness_map(engines / "det/1/model.onnx")
    classifier = HERE.parent.parent / "engines/classifier/1/model.onnx"
    pipelines = detecting("tracks") + classifying("budget", "cls", "max_calls_per_s = 20")
    for name in ("tracks", "budget"):
        pipelines = pipelines.replace(f'name = "{name}"\n', f'name = "{name}"\nnice = 10\n', 1)
    return KEYED.format(classifier=classifier) + pipelines


def keyed_scenarios(daemon: Daemon, port: int) -> list[tuple[str, Callable[[Stop], None]]]:
    """The keys' scenarios, each named "keys: ..." (`--only "keys:"` runs them alone)."""
    return [
        ("keys: lone surrogates and 60 KB keys to a model and a pipeline, /metrics scraped each second",
         bad_keys(daemon.endpoint, port)),
        ("keys: 256-byte keys cycling through a track step, 4 frames in flight", cycling_keys(daemon.endpoint)),
        ("keys: 150 new keys a second, each sending twice then silent", silent_keys(daemon.endpoint)),
        ("keys: one camera flooding a max_calls_per_s step, 4 frames in flight", flooding_key(daemon.endpoint)),
    ]


def _crowd_frames(count: int = 8) -> list[bytes]:
    from support import tracking
    seq = tracking.crowd()
    return [tracking.png(seq.frame(i)) for i in range(count)]


def _in_flight(sock: zmq.Socket, stop: Stop, make: Callable[[int], list], depth: int = 4) -> None:
    """Requests `make(n)` with `depth` of them in flight until `stop`."""
    sent = 0
    for _ in range(depth):
        sock.send_multipart([b"", *make(sent)])
        sent += 1
    while not stop.is_set():
        if sock.poll(1000):
            sock.recv_multipart()
            sock.send_multipart([b"", *make(sent)])
            sent += 1


def bad_keys(endpoint: str, port: int) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        from infermux.pipelines.wire import encode_frame
        frame = _crowd_frames(1)[0]
        sock = _dealer(endpoint)
        model = {"model": "fast512", "id": 1, "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512]}]}
        image = json.loads(encode_frame("tracks", frame, "png", id=2)[0])
        n, scraped = 0, 0.0
        while not stop.is_set():
            key = "cam\ud800" if n % 2 else "k" * 60_000
            _ask(sock, [json.dumps({**model, "key": key}).encode(), X.tobytes()])
            _ask(sock, [json.dumps({**image, "key": key}).encode(), frame])
            if time.monotonic() - scraped >= 1.0:  # as Prometheus would (its scrapes: another scenario's)
                scraped = time.monotonic()
                with socket.create_connection(("127.0.0.1", port), timeout=5) as http:
                    http.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    while http.recv(65536):
                        pass
            n += 1
        sock.close()
    return attack


def cycling_keys(endpoint: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        from infermux.pipelines.wire import encode_frame
        frames, sock = _crowd_frames(), _dealer(endpoint)
        _in_flight(sock, stop, lambda n: encode_frame("tracks", frames[n % len(frames)], "png", id=n,
                                                      key=f"{os.getpid()}-{n:08d}".ljust(256, "c")))
        sock.close()
    return attack


def silent_keys(endpoint: str, per_s: float = 150.0) -> Callable[[Stop], None]:
    """New keys at `per_s` (few enough that the stream table, 1024 keys, keeps each until it is silent)."""
    def attack(stop: Stop) -> None:
        sock = _dealer(endpoint)
        header = {"model": "fast512", "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 512]}]}
        start, n = time.monotonic(), 0
        while not stop.is_set():
            for _ in range(2):
                _ask(sock, [json.dumps({**header, "id": n, "key": f"{os.getpid()}-gone-{n}"}).encode(), X.tobytes()])
            n += 1
            stop.wait(max(0.0, start + n / per_s - time.monotonic()))
        sock.close()
    return attack


def flooding_key(endpoint: str) -> Callable[[Stop], None]:
    def attack(stop: Stop) -> None:
        from infermux.pipelines.wire import encode_frame
        frames, sock = _crowd_frames(), _dealer(endpoint)
        _in_flight(sock, stop, lambda n: encode_frame("budget", frames[n % len(frames)], "png", id=n, key="flood"))
        sock.close()
    return attack


def churning_slowloris(port: int) -> Callable[[Stop], None]:
    """64 slowloris connections from 127.0.0.2-9 (8 each) to the metrics port, each re-opened within
    0.5 s of being dropped; a kubelet-like probe of /healthz (timeout 1 s) every 0.2 s meanwhile, whose
    answers the attacker process prints ("victim: ...")."""
    def attack(stop: Stop) -> None:
        from support.churn import ChurningSlowloris
        churn = ChurningSlowloris(port).start()
        ok = total = 0
        while not stop.wait(0.2):
            total += 1
            ok += _probe_ok(port)
        churn.stop()
        print(f"victim: {ok} of {total} /healthz probes answered 200 within 1 s; {churn.dropped} attacker "
              "connections dropped and re-opened", flush=True)
    return attack


def _probe_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.settimeout(1)
            conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            return conn.recv(64).startswith(b"HTTP/1.0 200")
    except OSError:
        return False


def chatty_region_peers(path: str) -> Callable[[Stop], None]:
    """64 connections to regions.sock each sending a packet it refuses every 0.3 s (re-opened when
    closed); a client registering a region every 0.2 s meanwhile: how many got in within 1 s."""
    def attack(stop: Stop) -> None:
        from infermux.client import SharedMemory
        from support.churn import ChattyRegionPeers
        peers = ChattyRegionPeers(path).start()
        ok = total = 0
        while not stop.wait(0.2):
            total += 1
            start = time.monotonic()
            try:
                with SharedMemory(path, 4096, name="camera"):
                    ok += time.monotonic() - start < 1.0
            except (ConnectionError, OSError):
                pass
        peers.stop()
        print(f"victim: {ok} of {total} registrations within 1 s; {peers.dropped} attacker connections "
              "closed by the daemon and re-opened", flush=True)
    return attack


HIJACKED = "cold"  # a worker's queue: a camera's frames wait there, where another's may replace them


def key_hijack(daemon: Daemon, bound: bool) -> Callable[[Stop], None]:
    """A camera streaming frames of its key to the cold model (queue_policy newest_per_key for the scenario)
    at 200 a second without waiting for replies, as a camera does; once its first is answered, another
    client sends bursts of 4 larger frames (4 MiB) with that key as fast as they are answered (a key of its own each round: the last
    round's holder would still hold it). Under `stream_keys = "bound"`
    (reloaded in for the scenario) or the default "open". The camera's outcomes are printed: a 409
    whose `superseded_by` is the other's is the attack's doing (its own newer frames replace its
    older ones too: the policy working)."""
    endpoint, admin_endpoint, path = daemon.endpoint, daemon.admin_endpoint, daemon.config_path

    def attack(stop: Stop) -> None:
        from infermux.client import AdminClient
        original = path.read_text()
        with AdminClient(admin_endpoint) as admin:
            admin.call("set", model=HIJACKED, queue_policy="newest_per_key")
            if bound:
                path.write_text(original.replace("[daemon]\n", '[daemon]\nstream_keys = "bound"\n', 1))
                admin.call("reload")
        outcomes = _camera(endpoint, stop)
        with AdminClient(admin_endpoint) as admin:
            admin.call("set", model=HIJACKED, queue_policy="fifo")
            if bound:
                path.write_text(original)
                admin.call("reload")
        print(f"victim ({'bound' if bound else 'open'}): camera's frames {outcomes}", flush=True)
    return attack


def _hijacker(endpoint: str, key: str, stop: threading.Event) -> None:
    from infermux.protocol import encode_request
    sock = _dealer(endpoint)
    ident = 1_000_000  # the camera's are small: a 409's superseded_by tells whose frame replaced it
    big = np.ones((2048, 512), np.float32)  # milliseconds each in the worker: the camera's frame waits meanwhile
    while not stop.is_set():  # bursts of 4, as fast as they are answered: the next replaces the camera's
        for _ in range(4):
            ident += 1
            sock.send_multipart([b"", *encode_request(HIJACKED, {"x": big}, id=ident, key=key)])
        for _ in range(4):
            if sock.poll(5000):
                sock.recv_multipart()
    sock.close()


def _camera(endpoint: str, stop: Stop) -> dict[str, int]:
    from infermux.protocol import decode_reply, encode_request
    outcomes = {"sent": 0, "200": 0, "409 by its own": 0, "409 by the other": 0, "other": 0}
    sock, done, ident, key = _dealer(endpoint), threading.Event(), 0, f"cam-{os.getpid()}"
    other = threading.Thread(target=_hijacker, args=(endpoint, key, done), daemon=True)
    while not stop.wait(0.005):
        ident += 1
        sock.send_multipart([b"", *encode_request(HIJACKED, {"x": X}, id=ident, key=key)])
        while sock.poll(0 if other.is_alive() or ident > 1 else 5000):
            _tally(outcomes, decode_reply(sock.recv_multipart()[1:]))
            if not other.is_alive():  # the camera's first frame is in: the key is its own
                other.start()
    outcomes["sent"] = ident
    while sum(outcomes.values()) - ident < ident and sock.poll(5000):
        _tally(outcomes, decode_reply(sock.recv_multipart()[1:]))
    done.set()
    other.join()
    sock.close()
    return outcomes


def _tally(outcomes: dict[str, int], reply: Any) -> None:
    superseded_by = reply.superseded_by if reply.status == 409 else None
    kind = "200" if reply.status == 200 else "other" if superseded_by is None else \
        "409 by the other" if int(superseded_by) >= 1_000_000 else "409 by its own"
    outcomes[kind] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--no-write", action="store_true", help="print the table, leave RESULTS.md alone")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of windows per scenario (the median is shown)")
    parser.add_argument("--only", default="", help="run only the scenarios whose name contains this")
    parser.add_argument("--skip-ocr", action="store_true", help="leave the OCR pipeline (and its scenarios) out")
    args = parser.parse_args()
    from support import models

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models.add_one(work / "engines/fast512/1/model.onnx", width=512, offset=0.0)
        models.tiler(work / "engines/tile/1/model.onnx")
        models.box_echo(work / "engines/echo/1/model.onnx")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (work / "d").mkdir()
        config, notes = HEAD.format(engines=work / "engines", port=port), []
        if pipelines_usable():
            config += FRAMES + BOXES + keyed_config(work / "engines")
            ocr = None if args.skip_ocr else ocr_config(work / "ppocr")
            config += ocr or ""
            if not ocr:
                notes.append("The OCR scenarios were left out: " + ("--skip-ocr." if args.skip_ocr else
                             "rapidocr-onnxruntime (its models) is not installed."))
        else:
            notes.append("The frame and OCR scenarios were left out: OpenCV or Pillow is not installed.")
        daemon = Daemon(work / "d", config, prefix=["prlimit", "--nofile=1024:2700", "--"]).start(timeout=180)
        try:
            rows = run_scenarios(daemon, port, work / "engines", args.seconds, args.only, args.rounds)
        finally:
            daemon.stop()
    table = markdown_table(["scenario", "answered %", "p99 ms", "p99 ms, none just before", "p99 vs none (median)",
                            "each round's ratio", "attacker's own CPU, cores", "peak RSS MiB (vs the quiet run)",
                            "RSS MiB before → after", "most fds (before → after)",
                            "log growth KiB/min attacked"], rows)
    body = "\n".join([stamp(), "", "Daemon under `prlimit --nofile=1024:2700` (soft raised to hard at start); 2 well-behaved clients, "
                      f"{args.seconds:g} s with the attacker, each after {args.seconds:g} s without it "
                      f"(the \"none just before\" column, what its ratio is against), {args.rounds} such "
                      "rounds per scenario: the row is the round with the median ratio. Each attacker is a "
                      "process of its own; its CPU use is its own column. Peak RSS: the daemon's VmHWM over "
                      "the scenario's rounds (reset before them), against the quiet run's (the first row; "
                      "before it the OCR pipeline read four ordinary 1080p pages, warming each context as "
                      "a serving daemon's are); "
                      "most fds: the most open descriptors sampled every 50 ms. On the 2-core box "
                      "(figures noisy).", *notes, "", table])
    print_and_write("Hostile clients", body, write=not args.no_write)
    return 0


def pipelines_usable() -> bool:
    try:
        import cv2  # noqa: F401
        import PIL  # noqa: F401
    except ImportError:
        return False
    return True


def ocr_config(into: Path) -> str | None:
    """The OCR example's models and pipeline (etc/infermux/examples/ocr.toml, its bounds as shipped)
    with their files in `into`, or None when rapidocr-onnxruntime is not there to take them from.
    The example's commented `nice = 10` lines are taken, as its comment says for a box that also
    serves small models: the well-behaved clients here are such a model's."""
    out = subprocess.run([sys.executable, str(HERE.parent.parent / "engines/fetch_ppocr.py"), "--into", str(into)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return None
    text = (HERE.parent.parent / "etc/infermux/examples/ocr.toml").read_text()
    text = text[text.index("[[models]]"):].replace("# nice = 10", "nice = 10")
    for name in ("det.onnx", "cls.onnx", "rec.onnx", "keys.txt", "cls_labels.txt"):
        text = text.replace(f'"{name}"', f'"{into / name}"')
    return "\n" + text


def run_scenarios(daemon: Daemon, port: int, engines: Path, seconds: float, only: str = "",
                  rounds: int = 3) -> list[list[str]]:
    regions = str(daemon.run_dir / "regions.sock")
    config = daemon.config_path.read_text()
    scenarios: list[tuple[str, Callable[[Stop], None] | None]] = [
        ("none (baseline)", None),
        ("reference: a process that only burns one core", cpu_hog()),
        ("30,000 pipelined requests, replies never read", non_reader(daemon.endpoint)),
        ("1,100 idle connections to infer.sock", connection_flood(daemon.endpoint[len("ipc://"):])),
        ("1,100 idle connections to the metrics port", metrics_flood(port)),
        ("empty packets with 4 fds on regions.sock", empty_packets(regions)),
        ("nested-JSON admin requests", nested_admin(daemon.admin_endpoint)),
        ("40 × 1 MB frames per message, in a loop", many_frames(daemon.endpoint)),
        ("cold model's worker SIGSTOPped, 300 ms requests to it", stopped_worker(daemon)),
        # round two
        *([("JPEG/PNG bombs to a decode step (fill byte, SOF past 64 KiB, chunk before IHDR, PPM)",
            frame_bombs(daemon.endpoint))] if 'name = "frames"' in config else []),
        *([("OCR bombs: 1,000 tokens, a long thin line, a blank 8192² PNG", ocr_bombs(daemon.endpoint)),
           ("OCR bombs, each send other bytes (a PNG text chunk of its own)", ocr_bombs(daemon.endpoint, vary=True))]
          if 'name = "ocr"' in config else []),
        ("model.toml with backend = \"os:abort\" published and removed in a loop",
         module_path_backends(engines, engines / "fast512/1/model.onnx")),
        ("16 slow-drip connections and 4 unread scrapes on the metrics port", metrics_drip(port)),
        ("64 idle connections to regions.sock", regions_idle(regions)),
        ("bad packets on regions.sock in a loop", regions_bad_packets(regions)),
        # round three: probes and sockets, stream keys
        ("64 slowloris connections from 127.0.0.2-9 re-opened within 0.5 s; probes meanwhile",
         churning_slowloris(port)),
        ("64 regions.sock peers each sending a refused packet every 0.3 s; registrations meanwhile",
         chatty_region_peers(regions)),
        ("another client sending a camera's stream key, stream_keys = \"open\"", key_hijack(daemon, bound=False)),
        ("another client sending a camera's stream key, stream_keys = \"bound\"", key_hijack(daemon, bound=True)),
        ("register/unregister on regions.sock in a loop", regions_register_loop(regions)),
        ("512 MiB and 64 MiB inputs in a sparse 2 GiB memfd", sparse_inputs(daemon.endpoint, regions)),
        ("set weights=10**400 and contexts=1024 in a loop", huge_sets(daemon.admin_endpoint)),
        ("128 MiB replies from a 4 MiB input (over max_reply_bytes)", huge_replies(daemon.endpoint)),
        *(keyed_scenarios(daemon, port) if 'name = "tracks"' in config else []),
        # round three
        *([("a 40,000 × 40,000 box echoed from a 10-byte frame into crop, other bytes each send",
            giant_boxes(daemon.endpoint)),
           ("a NaN box beside a good one, through track into crop, each send another of 64 keys",
            nan_boxes(daemon.endpoint)),
           ("a 1 MB progressive 2048² JPEG of 100,000 scans, other bytes each send", scan_bombs(daemon.endpoint))]
          if 'name = "boxes"' in config else []),
    ]
    warm_pipelines(daemon.endpoint, config)
    measure(daemon.endpoint, seconds, None)  # warm-up: the first seconds' p99 is the caches', not the daemon's
    rows, quiet = [], None
    for name, attack in scenarios:
        if only in name or attack is None:
            row, peak = one_scenario(daemon, name, attack, seconds, rounds, quiet)
            quiet = quiet if quiet is not None else peak
            rows.append(row)
    return rows


def warm_pipelines(endpoint: str, config: str) -> None:
    """Before the quiet run: the OCR pipeline reads ordinary 1080p pages, each of its models' two
    contexts at least once, so that the quiet run's memory is a serving daemon's (each context's
    onnxruntime arena grows to its working set on its first frames, from 160 MiB to 2 GiB in all,
    and keeps it) and the scenarios are compared with that."""
    if 'name = "ocr"' not in config:
        return
    from support import hostile_files as hf
    from infermux.pipelines.wire import encode_frame
    sock = _dealer(endpoint)
    for frame in (hf.drawn(4, 10), hf.drawn(6, 30)) * 2:  # 40 and 180 text lines on a 1920 x 1080 page
        _ask(sock, encode_frame("ocr", frame, "png", id=1), timeout_ms=120_000)
    sock.close()


def one_scenario(daemon: Daemon, name: str, attack: Callable[[Stop], None] | None, seconds: float,
                 rounds: int, quiet: float | None) -> tuple[list[str], float]:
    """`rounds` pairs of (without attacker, with it): the box is shared, so each attacked window is
    compared with one just before it; the row shows the round with the median ratio. Returns the row
    and the daemon's peak RSS over the scenario."""
    assert daemon.proc is not None
    pid = daemon.proc.pid
    rss0, fds0 = proc_facts(pid)
    log0, attacked_s = log_bytes(daemon), 0.0
    reset_peak(pid)
    pairs, most_fds = [], fds0
    for _ in range(rounds if attack else 1):
        base = measure(daemon.endpoint, seconds, None) if attack else None
        result = measure(daemon.endpoint, seconds, attack, pid)
        attacked_s += seconds
        if not daemon.alive():
            raise SystemExit(f"the daemon died in scenario {name!r}:\n{daemon.log()[-3000:]}")
        base = base or result
        most_fds = max(most_fds, result["most_fds"])
        pairs.append((result["p99_ms"] / base["p99_ms"] if base["p99_ms"] else float("nan"), base, result))
    time.sleep(0.5)  # let the daemon close what the attacker left, for the "after" figures
    rss1, fds1 = proc_facts(pid)
    peak = status_mib(pid, "VmHWM")
    ratios = sorted(ratio for ratio, _, _ in pairs)
    ratio, base, result = sorted(pairs, key=lambda pair: pair[0])[len(pairs) // 2]
    answered = min(r["answered"] for _, _, r in pairs)
    requests = sum(r["requests"] for _, _, r in pairs)
    versus = "quiet run" if quiet is None else f"{peak - quiet:+.0f}"
    return [name, f"{answered:.1f} ({requests})", f"{result['p99_ms']:.2f}", f"{base['p99_ms']:.2f}",
            f"{ratio:.2f}x", " / ".join(f"{r:.2f}" for r in ratios), f"{result['attacker_cpu']:.2f}",
            f"{peak:.0f} ({versus})", f"{rss0:.0f} → {rss1:.0f}", f"{most_fds} ({fds0} → {fds1})",
            f"{(log_bytes(daemon) - log0) / 1024 / (attacked_s / 60):.0f}"], peak


def log_bytes(daemon: Daemon) -> int:
    """The daemon's log so far, in bytes (its growth over a scenario, per minute attacked, is a column)."""
    return daemon.log_path.stat().st_size if daemon.log_path.exists() else 0


if __name__ == "__main__":
    sys.exit(main())
