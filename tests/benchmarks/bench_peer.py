"""infermux against Seldon MLServer 1.7.1, same model, same box, one run.

    python tests/benchmarks/bench_peer.py [--duration 3] [--rounds 3] [--no-write] [--venv DIR]

Serves the sample classifier (engines/classifier/1/model.onnx, one
[1,3,64,64] float32 image per request) with

  infermux   `infermux serve`, 2 contexts, over tcp://127.0.0.1 (the same
             loopback TCP MLServer gets) and over ipc (how it is meant to be
             used), driven by `infermux.cli.bench.run_load` (one DEALER socket,
             c requests in flight);
  MLServer   1.7.1 in its OWN virtual environment (made once under
             ~/.cache/infermux/bench-peer/, `pip install mlserver==1.7.1
             uvloop<0.22 onnxruntime==<ours>`), default settings (one
             parallel inference worker), over its HTTP V2 inference protocol
             (JSON tensors), driven by c threads with one keep-alive
             http.client connection each.

MLServer 1.7.1 ships no ONNX runtime package (its runtimes are sklearn,
xgboost, lightgbm, mlflow, huggingface, catboost, mllib, alibi), so it
runs the model through the documented route for other frameworks: a
custom `MLModel` runtime calling onnxruntime with one intra-op thread, as
infermux's contexts do. Both answers are checked against onnxruntime first.

Load generators run in their own process (no shared GIL), at concurrency 1
and 16. All traffic stays on 127.0.0.1. If MLServer cannot be installed or
started, the section says exactly why and still shows infermux's figures.
Writes "## Peer comparison: MLServer" in RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from support.harness import REPO, Daemon, free_port  # noqa: E402
from results import markdown_table, print_and_write, stamp  # noqa: E402

from infermux.cli.bench import BenchResult, run_load, wait_ready  # noqa: E402

SECTION = "Peer comparison: MLServer"
ENGINE = REPO / "engines" / "classifier" / "1" / "model.onnx"
MODEL = "classifier"
CONCURRENCY = (1, 16)
MLSERVER = "mlserver==1.7.1"
PACKAGES = [MLSERVER, "uvloop<0.22", f"onnxruntime=={ort.__version__}"]

DAEMON_TOML = """\
[daemon]
listen = ["ipc://infer.sock", "tcp://127.0.0.1:{port}"]
engine_dir = "{engines}"
watch = false             # serve exactly the classifier
allow_insecure_tcp = true   # loopback only, for this benchmark

[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
contexts = 2
"""

RUNTIME = '''\
"""An MLServer custom runtime for ONNX models (MLServer 1.7.1 has no ONNX package)."""
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # as infermux runs each context
        self._session = ort.InferenceSession(await get_model_uri(self._settings), options,
                                             providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        results = self._session.run(self._outputs, feeds)
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output(name, value) for name, value in zip(self._outputs, results)])
'''


def image() -> np.ndarray:
    return np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)


def reference() -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(ENGINE), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"images": image()})[0]


# -- MLServer: install, configure, start ---------------------------------------------

class Unavailable(Exception):
    """MLServer could not be measured; the message says why."""


def ensure_venv(folder: Path) -> Path:
    """A virtual environment with MLServer, made once and reused; returns its `mlserver` script."""
    marker = folder / "infermux-packages.txt"
    script = folder / "bin" / "mlserver"
    if script.exists() and marker.exists() and marker.read_text() == "\n".join(PACKAGES):
        return script
    shutil.rmtree(folder, ignore_errors=True)
    print(f"installing {' '.join(PACKAGES)} into {folder} (once) ...", file=sys.stderr)
    made = subprocess.run([sys.executable, "-m", "venv", str(folder)], capture_output=True, text=True)
    if made.returncode != 0:
        raise Unavailable(f"`python -m venv` failed: {made.stderr.strip()[-500:]}")
    pip = subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", *PACKAGES],
                         capture_output=True, text=True, timeout=900)
    if pip.returncode != 0:
        lines = [line for line in pip.stderr.splitlines() if "WARNING: Location" not in line]
        raise Unavailable(f"`pip install {' '.join(PACKAGES)}` failed: {' '.join(lines)[-800:]}")
    marker.write_text("\n".join(PACKAGES))
    return script


def model_repository(root: Path, port: int) -> Path:
    """settings.json, the custom runtime and the model, as `mlserver start` wants them."""
    folder = root / "mlserver"
    (folder / MODEL).mkdir(parents=True)
    shutil.copy(ENGINE, folder / MODEL / "model.onnx")
    (folder / "onnx_runtime.py").write_text(RUNTIME)
    (folder / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": port, "grpc_port": free_port(), "metrics_port": free_port(),
        "debug": False}))
    (folder / MODEL / "model-settings.json").write_text(json.dumps({
        "name": MODEL, "implementation": "onnx_runtime.OnnxRuntime", "parameters": {"uri": "./model.onnx"}}))
    return folder


def v2_body() -> bytes:
    x = image()
    return json.dumps({"inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()


def start_mlserver(script: Path, folder: Path, port: int, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    env.pop("VIRTUAL_ENV", None)
    log = open(log_path, "wb")
    process = subprocess.Popen([str(script), "start", str(folder)], cwd=folder, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    url = f"http://127.0.0.1:{port}/v2/models/{MODEL}/ready"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-1500:]
            raise Unavailable(f"`mlserver start` exited with {process.returncode}: {tail}")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return process
        except OSError:
            pass
        time.sleep(0.5)
    stop(process)
    raise Unavailable(f"MLServer not ready after 120 s: {log_path.read_text(errors='replace')[-1500:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def check_mlserver(port: int, want: np.ndarray) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer", data=v2_body(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        output = json.loads(reply.read())["outputs"][0]
    got = np.asarray(output["data"], np.float32).reshape(output["shape"])
    if not np.allclose(got, want, rtol=1e-4, atol=1e-6):
        raise Unavailable(f"MLServer's answer differs from onnxruntime's by {np.abs(got - want).max()}")


# -- load generators (each runs in the generator process) -----------------------------------

def http_load(port: int, concurrency: int, duration_s: float, warmup: int) -> BenchResult:
    """c threads, one keep-alive HTTP/1.1 connection each, closed loop on the V2 infer endpoint."""
    import http.client

    body = v2_body()
    path = f"/v2/models/{MODEL}/infer"
    headers = {"Content-Type": "application/json"}
    latencies: list[list[int]] = [[] for _ in range(concurrency)]
    statuses: list[dict[int, int]] = [{} for _ in range(concurrency)]
    start_line = threading.Barrier(concurrency + 1)
    stop_at = [0]

    def work(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

        def once() -> tuple[int, int]:
            t0 = time.perf_counter_ns()
            conn.request("POST", path, body, headers)
            reply = conn.getresponse()
            reply.read()
            return reply.status, time.perf_counter_ns() - t0

        for _ in range(max(1, warmup // concurrency)):
            once()
        start_line.wait()
        while time.perf_counter_ns() < stop_at[0]:
            status, took = once()
            latencies[i].append(took)
            statuses[i][status] = statuses[i].get(status, 0) + 1
        conn.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter_ns() + 10**12  # no one stops before the start line
    start_line.wait()
    start = time.perf_counter_ns()
    stop_at[0] = start + int(duration_s * 1e9)
    for t in threads:
        t.join()
    by_status: dict[int, int] = {}
    for s in statuses:
        for code, n in s.items():
            by_status[code] = by_status.get(code, 0) + n
    return BenchResult.from_latencies(f"http://127.0.0.1:{port}", MODEL, concurrency,
                                      [v for out in latencies for v in out], by_status,
                                      (time.perf_counter_ns() - start) / 1e9)


def zmq_load(endpoint: str, concurrency: int, duration_s: float, warmup: int) -> BenchResult:
    return run_load(endpoint, MODEL, {"images": image()}, concurrency=concurrency, duration_s=duration_s,
                    warmup=warmup)


# -- the run -------------------------------------------------------------------------

def start_infermux(tmp: Path, want: np.ndarray) -> tuple[Daemon, str]:
    """The daemon, checked against onnxruntime; returns it and its tcp endpoint."""
    port = free_port()
    workdir = tmp / "infermux"
    workdir.mkdir()
    daemon = Daemon(workdir, DAEMON_TOML.format(port=port, engines=REPO / "engines")).start()
    tcp = f"tcp://127.0.0.1:{port}"
    reply = wait_ready(tcp, MODEL, {"images": image()})
    if not reply.ok or not np.allclose(reply.outputs["probs"], want, rtol=1e-4, atol=1e-6):
        daemon.stop()
        raise RuntimeError(f"infermux answered {reply.status} {reply.error}, or not what onnxruntime says")
    return daemon, tcp


def start_peer(tmp: Path, args: argparse.Namespace, want: np.ndarray) -> tuple[subprocess.Popen, int]:
    """MLServer, installed if needed and checked against onnxruntime; raises Unavailable with the reason."""
    script = ensure_venv(Path(args.venv).expanduser())
    port = free_port()
    process = start_mlserver(script, model_repository(tmp, port), port, tmp / "mlserver.log")
    try:
        check_mlserver(port, want)
    except Exception:
        stop(process)
        raise
    return process, port


def measure(generator: ProcessPoolExecutor, cases: dict[str, tuple], args: argparse.Namespace
            ) -> dict[tuple[str, int], list[BenchResult]]:
    """Every case at every concurrency, rounds interleaved so load from elsewhere hits all alike."""
    rounds: dict[tuple[str, int], list[BenchResult]] = {}
    for r in range(args.rounds):
        for c in CONCURRENCY:
            for name, (load, target) in cases.items():
                print(f"round {r + 1}/{args.rounds}: {name} c={c} ...", file=sys.stderr)
                result = generator.submit(load, target, c, args.duration, args.warmup).result()
                rounds.setdefault((name, c), []).append(result)
    return rounds


def median(results: list[BenchResult]) -> BenchResult:
    ordered = sorted(results, key=lambda r: r.qps)
    return ordered[(len(ordered) - 1) // 2]


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value / 1000:.2f}"


def report(rounds: dict[tuple[str, int], list[BenchResult]], mlserver_note: str, args: argparse.Namespace,
           load: tuple[float, float]) -> str:
    results = {key: median(rs) for key, rs in rounds.items()}
    rows = []
    for c in CONCURRENCY:
        for name in ("infermux tcp", "infermux ipc", "MLServer http"):
            r = results.get((name, c))
            if r is not None:
                per_round = " / ".join(f"{x.qps:,.0f}" for x in rounds[(name, c)])
                rows.append([name, str(c), f"{r.qps:,.0f}", ms(r.p50_us), ms(r.p99_us), str(r.errors), per_round])
    lines = [stamp(),
             f"1-min load average {load[0]:.2f} before the run, {load[1]:.2f} after; the box is shared, so other "
             "work can skew single rounds.", "",
             f"Sample classifier, one [1,3,64,64] float32 image per request (48 KiB of tensor). {args.rounds} rounds "
             f"× {args.duration:g} s per case after {args.warmup} warm-up requests, cases interleaved, both servers up "
             "throughout; median round shown (by QPS). Load generator in its own process. Latency is the client's "
             "round trip, in ms.", "",
             markdown_table(["server", "c", "QPS", "p50 ms", "p99 ms", "errors", "QPS per round"], rows), ""]
    ratios = []
    for c in CONCURRENCY:
        ours, theirs = results.get(("infermux tcp", c)), results.get(("MLServer http", c))
        if ours and theirs and theirs.qps:
            ratios.append(f"c={c}: **{ours.qps / theirs.qps:.1f}×** QPS, p99 {ms(ours.p99_us)} vs "
                          f"{ms(theirs.p99_us)} ms")
    if ratios:
        lines += ["infermux (tcp) / MLServer: " + "; ".join(ratios) + ".", ""]
    lines += [
        f"MLServer: {mlserver_note}",
        "",
        "infermux: `infermux serve`, 2 contexts, 1 intra-op thread each, raw tensor frames over ZeroMQ; "
        "driven by `infermux.cli.bench.run_load` (one DEALER socket, c in flight). MLServer: default settings "
        "(`parallel_workers` 1: requests go through one inference worker process), HTTP V2 inference protocol "
        "with the tensor as a JSON list (its standard REST encoding), custom runtime calling onnxruntime with "
        "1 intra-op thread; driven by c threads with a keep-alive `http.client` connection each. Both answers "
        "were checked against onnxruntime before measuring. All traffic on 127.0.0.1 / ipc.",
        "Reproduce: `python tests/benchmarks/bench_peer.py`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per case and round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured requests per case (default 100)")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "infermux" / "bench-peer"
    parser.add_argument("--venv", default=str(cache / "mlserver-1.7.1"),
                        help="MLServer's own virtual environment (made if missing)")
    parser.add_argument("--skip-mlserver", action="store_true", help="measure infermux only")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    want = reference()
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no GIL shared with anything here
    with tempfile.TemporaryDirectory(prefix="infermux-peer-") as name, \
            ProcessPoolExecutor(1, mp_context=ctx) as generator:
        tmp = Path(name)
        peer = None
        note = "not measured (--skip-mlserver)."
        if not args.skip_mlserver:
            try:
                peer = start_peer(tmp, args, want)
                note = (f"`{MLSERVER}` with `uvloop<0.22` and onnxruntime {ort.__version__} in its own virtual "
                        f"environment.")
            except (Unavailable, OSError, subprocess.SubprocessError) as exc:
                note = f"**not measured**: {exc}"
                print(f"MLServer not measured: {exc}", file=sys.stderr)
        daemon, tcp = start_infermux(tmp, want)
        cases: dict[str, tuple] = {"infermux tcp": (zmq_load, tcp), "infermux ipc": (zmq_load, daemon.endpoint)}
        if peer is not None:
            cases["MLServer http"] = (http_load, peer[1])
        load_before = os.getloadavg()[0]
        try:
            rounds = measure(generator, cases, args)
        finally:
            load_after = os.getloadavg()[0]
            if peer is not None:
                stop(peer[0])
            code = daemon.stop()
        if code != 0:
            print(daemon.log()[-3000:], file=sys.stderr)
            return 1
    text = report(rounds, note, args, (load_before, load_after))
    print_and_write(SECTION, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
