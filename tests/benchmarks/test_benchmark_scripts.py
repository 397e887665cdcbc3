"""The benchmark scripts' plumbing: RESULTS.md sections and a tiny run of the core benchmark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

from results import print_and_write, write_section  # noqa: E402
from revision import ROOT, package_env  # noqa: E402


def test_a_section_is_replaced_and_the_others_are_kept(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\n## A\n\nold a\n\n## B\n\nold b\n")
    write_section("A", "new a\nsecond line", path)
    write_section("C", "new c", path)
    assert path.read_text() == ("# Benchmark results\n\n## A\n\nnew a\nsecond line\n\n"
                                "## B\n\nold b\n\n## C\n\nnew c\n")


def test_a_missing_file_is_created(tmp_path):
    path = tmp_path / "RESULTS.md"
    write_section("Only", "body", path)
    assert path.read_text() == "# Benchmark results\n\n## Only\n\nbody\n"


def test_a_run_prints_its_section_and_writes_it_unless_told_not_to(tmp_path, capsys):
    path = tmp_path / "RESULTS.md"
    print_and_write("A", "table", write=False, path=path)
    assert capsys.readouterr().out == "table\n" and not path.exists()  # --no-write
    print_and_write("A", "table", write=True, titled=True, path=path)
    assert capsys.readouterr().out == "\n## A\n\ntable\n"
    assert path.read_text() == "# Benchmark results\n\n## A\n\ntable\n"

def test_a_revision_run_beside_this_checkout_gets_the_extension_this_checkout_built(tmp_path):
    if not list((ROOT / "daemon").rglob("_wire*.so")):
        pytest.skip("this checkout has no compiled socket calls to carry (no C compiler at install)")
    env = {**os.environ, **package_env("HEAD", tmp_path)}
    probe = "import infermux; from infermux.transport.wire import choose; print(infermux.__file__, choose().kind)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    where, kind = out.stdout.split()
    assert where.startswith(str(tmp_path)) and kind == "compiled", out.stderr


@pytest.mark.slow
def test_the_core_benchmark_runs_every_case(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_core.py"), "--no-write",
                          "--duration", "0.3", "--rounds", "1", "--warmup", "10", "--no-ocr"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for case in ("a backend", "b echo", "c bare", "d daemon", "d1 daemon"):
        assert f"| {case} | 1 |" in out.stdout and f"| {case} | 16 |" in out.stdout
    assert "Daemon (2 contexts) / bare loop, per-round ratios (median and range of 1 rounds): c=1: QPS" in out.stdout
    assert "Daemon (1 context, as the bare loop) / bare loop: c=1:" in out.stdout
    assert "Server CPU time per request" in out.stdout and "d1 ÷ c c=16: **" in out.stdout


@pytest.mark.slow
def test_the_handling_benchmark_measures_both_backends():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_handling.py"), "--no-write",
                          "--calls", "50", "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| with onnxruntime |" in out.stdout and "| instant backend |" in out.stdout


@pytest.mark.slow
def test_the_batching_benchmark_runs_every_case(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_batching.py"), "--no-write",
                          "--duration", "0.3", "--fair-duration", "0.5", "--rounds", "1", "--warmup", "10"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    for model in ("mlp", "mlp_unbatched", "classifier", "classifier_unbatched"):
        assert f"| {model} | 16 |" in out.stdout and f"| {model} | 32 |" in out.stdout
    for scenario in ("cameras alone", "+ flood, keyed", "+ flood, no keys"):
        assert f"| {scenario} |" in out.stdout
    assert "Batched / unbatched QPS (medians): mlp c=16:" in out.stdout
    assert "Cameras' p99 with the flood / alone: keyed" in out.stdout


@pytest.mark.slow
def test_the_streams_benchmark_compares_both_policies():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_streams.py"), "--no-write", "--skip-ocr",
                          "--seconds", "1.5", "--rounds", "1"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| `fifo` |" in out.stdout and "| `newest_per_key` |" in out.stdout
    assert "**no**" not in out.stdout  # every stream's received = served + superseded + refused
    assert "Model (conv net, 1 context, max_queue 64), newest_per_key: p99 age" in out.stdout


@pytest.mark.slow
def test_the_gate_benchmark_measures_each_detector_on_every_clip():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_gate.py"), "--no-write", "--rounds", "1",
                          "--frames", "15"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for detector in ("background", "mog2", "framediff"):
        assert out.stdout.count(f"| {detector} | ") == 2, out.stdout  # the test's clips and the harder ones
    assert out.stdout.count("Goals for `background`") == 2 and "ms hot p50" in out.stdout


@pytest.mark.slow
def test_the_tracking_benchmark_scores_every_sequence():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_tracking.py"), "--no-write", "--rounds", "1",
                          "--frames", "15"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for seq in ("crossing", "pillar", "crowd", "stop_and_go"):
        assert f"| {seq} | " in out.stdout and "detector pipeline" in out.stdout
    assert "track µs p50" in out.stdout and "reinfer_every = 5" in out.stdout


@pytest.mark.slow
def test_the_rollout_benchmark_compares_a_shadowed_daemon_with_a_plain_one():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_rollout.py"), "--no-write", "--duration", "0.3",
                          "--rounds", "1", "--warmup", "10"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    for case in ("shadowed", "forced", "plain"):
        assert f"| {case} | 1 |" in out.stdout and f"| {case} | 16 |" in out.stdout
    assert "- shadowed / plain: c=1: p99 per round median" in out.stdout and "- forced / plain:" in out.stdout
    assert "Goal p99 shadowed ≤ 1.1× plain at c=16" in out.stdout


@pytest.mark.slow
def test_the_system_call_count_prints_each_servers_calls_per_request(tmp_path):
    import shutil

    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt install strace)")
    out = subprocess.run(["bash", str(BENCHMARKS / "syscalls_per_request.sh"), "1", "200"],
                         capture_output=True, text=True, timeout=180)
    if "strace could not attach" in out.stderr:
        pytest.skip(out.stderr.strip())
    assert out.returncode == 0, out.stderr[-2000:]
    for server in ("daemon", "bare"):
        block = out.stdout.split(f"== {server}: system calls per request (c=1, 200 requests)")[1].split("==")[0]
        total = float(block.split("all")[1].split()[0])
        assert total > 1, block  # at least a receive and a send per request


@pytest.mark.slow
def test_the_budget_benchmark_charges_each_process_its_cpu():
    # 1 s a server: the ZeroMQ I/O thread's CPU is read in clock ticks (10 ms), and 0.3 s of light
    # traffic once left it under one tick, read as none.
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_budget.py"), "--no-write", "--duration", "1.0",
                          "--rounds", "1", "--warmup", "10", "--concurrency", "8", "--target", "1000"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    servers = ["echo", "bare loop", "daemon", "daemon, batched"] + (["C echo", "C bare loop"] if shutil.which("cc")
                                                                   else [])
    for server in servers:
        row = next(line for line in out.stdout.splitlines() if line.startswith(f"| {server} |"))
        assert row.endswith("| 0 |"), row  # every request answered 200
        server_us, busiest_us, io_us = (float(cell.replace(",", "")) for cell in row.split("|")[3:6])
        # The busiest thread is one of the process's threads, and every server here talks through ZeroMQ.
        assert 0 < busiest_us <= server_us and 0 < io_us < server_us, row
    if not shutil.which("cc"):
        assert "C echo left out: no C compiler (cc)" in out.stdout
    assert "Budget: 1,000 QPS (--target) on" in out.stdout
    assert "no thread may spend more than **1000 µs** a request" in out.stdout


def test_the_compiled_echo_answers_as_the_python_one_does(tmp_path):
    import zmq
    from baselines import echo_handler
    from compiled import build_echo

    from infermux.cli.infer import parse_inputs
    from infermux.protocol import encode_request

    built = build_echo(tmp_path)
    if built.path is None:
        pytest.skip(f"the compiled echo cannot be built here: {built.missing}")
    endpoint = f"ipc://{tmp_path}/echo.sock"
    server = subprocess.Popen([str(built.path), endpoint])
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.RCVTIMEO, 10_000)
    client.connect(endpoint)
    try:
        images = parse_inputs([], ["images=1x3x64x64"], "float32")
        for ident in (7, "cam-1", 123456789):
            request = encode_request("classifier", images, id=ident)
            client.send_multipart([b"", *request])
            delimiter, *reply = client.recv_multipart()
            expected = echo_handler("probs=1x10")([memoryview(f) for f in request])
            assert delimiter == b"" and reply[0] == expected[0]  # the same header, this request's id
            assert len(reply[1]) == len(expected[1]) == 40  # float32 [1,10]
    finally:
        client.close(0)
        server.kill()
        server.wait()


def test_the_compiled_bare_loop_answers_what_onnxruntime_computes_and_refuses_bad_requests(tmp_path):
    import numpy as np
    import zmq
    from bench_core import ENGINE
    from compiled import build_bare

    from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend
    from infermux.protocol import encode_request, parse_header

    built = build_bare(tmp_path)
    if built.path is None:
        pytest.skip(f"the compiled bare loop cannot be built here: {built.missing}")
    endpoint = f"ipc://{tmp_path}/bare.sock"
    server = subprocess.Popen([sys.executable, str(BENCHMARKS / "baselines.py"), "compiled-bare", endpoint,
                               str(ENGINE), str(built.path)])
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.RCVTIMEO, 30_000)
    client.connect(endpoint)

    def ask(frames: list) -> tuple[dict, list[bytes]]:
        client.send_multipart([b"", *frames])
        delimiter, header, *tensors = client.recv_multipart()
        return parse_header(header), tensors

    try:
        images = np.random.default_rng(7).random((1, 3, 64, 64), dtype=np.float32)
        expected = OnnxRuntimeBackend().load(ENGINE, {"intra_op_num_threads": 1}).create_context().infer(
            {"images": images})
        assert ask(encode_request("classifier", {"images": images}, id=2**70))[0]["id"] == 2**70  # past 64 bits
        header, tensors = ask(encode_request("classifier", {"images": images}, id="cam \"1\""))
        assert header["id"] == 'cam "1"' and header["status"] == 200 and header["model"] == "classifier"
        (meta,) = header["outputs"]
        assert (meta["name"], meta["dtype"]) == ("probs", "float32")
        got = np.frombuffer(tensors[0], dtype=np.float32).reshape(meta["shape"])
        np.testing.assert_allclose(got, expected["probs"], rtol=1e-6)
        short = encode_request("classifier", {"images": images}, id=2)
        short[1] = bytes(short[1])[:-4]  # one float missing
        assert ask(short)[0] == {"id": 2, "status": 400, "error": "a tensor frame does not match its shape"}
        assert ask([b"not json"])[0]["status"] == 400
        assert ask(encode_request("classifier", {"images": images}, id=3))[0]["status"] == 200  # still serving
    finally:
        client.close(0)
        server.kill()
        server.wait()


def test_a_daemon_config_with_extra_keys_holds_them_in_its_model_table(tmp_path):
    from bench_core import MODEL, daemon_command
    from bench_pytriton import CONFIGURATIONS

    batching = CONFIGURATIONS[-1][2]  # what bench_pytriton and bench_budget pass for their batched daemon
    command, endpoint = daemon_command(tmp_path, "batched", contexts=2, extra=batching)
    config = tmp_path / "batched.toml"
    assert command[command.index("--config") + 1] == str(config)
    assert endpoint == f"ipc://{tmp_path}/run-batched/infer.sock"
    text = config.read_text()
    assert batching and text.endswith(batching)
    (model,) = tomllib.loads(text)["models"]
    assert (model["name"], model["contexts"], model["max_batch"], model["batch_delay_us"]) == (MODEL, 2, 16, 200)
    daemon_command(tmp_path, "plain", contexts=1)
    (plain,) = tomllib.loads((tmp_path / "plain.toml").read_text())["models"]
    assert plain["contexts"] == 1 and "max_batch" not in plain


def test_the_budget_reads_pytritons_figure_from_the_peer_table(tmp_path):
    from bench_budget import peer_qps

    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Peer comparison: PyTriton\n\nMeasured.\n\n"
                       "| c | best infermux | PyTriton QPS | errors |\n|---|---:|---:|---:|\n"
                       "| 1 | 2 contexts | 288 | 0 |\n| 64 | 1 context | 2,442 | 0 |\n\n## Next\n\n| 16 | x | 9 | 0 |\n")
    assert peer_qps(64, results) == 2442
    assert peer_qps(16, results) is None  # a row of another section is not PyTriton's
    assert peer_qps(64, tmp_path / "missing.md") is None


def test_the_pytriton_table_shows_the_compiled_loop_or_says_why_it_is_missing():
    import argparse

    from bench_pytriton import COMPILED, CONFIGURATIONS, report

    def runs(*qps: float) -> list[dict]:
        return [{"qps": q, "p50_us": 100.0, "p99_us": 200.0, "errors": 0} for q in qps]

    rows = {}
    for c in (1, 16, 64):
        rows["pytriton", c] = runs(100, 200)
        rows["echo", c], rows["bare loop", c] = runs(3000, 3000), runs(1000, 1000)
        for case, _, _ in CONFIGURATIONS:
            rows[case, c] = runs(500, 800)
    args = argparse.Namespace(rounds=2, duration=1.0, warmup=10)
    without = report(rows, args, "no C compiler (cc) on this machine")
    assert "C bare loop left out: no C compiler (cc) on this machine." in without
    assert "| 64 | 1 context | 650 | 650 | 650 | 150 | 1,000 | 3,000 | 0.75 / 0.25 | **4.50×** (4.00–5.00) | – | – |" \
        in without
    rows.update({(COMPILED, c): runs(1200, 1400) for c in (1, 16, 64)})
    assert "| **4.50×** (4.00–5.00) | 1,300 | **9.50×** (7.00–12.00) |" in report(rows, args)


def test_each_thread_is_charged_its_own_cpu_and_a_new_thread_all_of_its_own():
    from bench_budget import thread_split
    from results import thread_cpu_s

    before = {1: ("python", 1.0), 2: ("ZMQbg/IO/0", 0.5), 3: ("ZMQbg/Reaper", 0.1)}
    after = {1: ("python", 1.3), 2: ("ZMQbg/IO/0", 0.6), 3: ("ZMQbg/Reaper", 0.1), 4: ("python", 0.2)}
    split = thread_split(before, after, requests=1000)
    assert split.busiest_us == pytest.approx(300)  # the first thread, not the new one's 200
    assert split.io_us == pytest.approx(100)
    mine = thread_cpu_s(os.getpid())
    assert threading.get_native_id() in mine and all(cpu >= 0 for _, cpu in mine.values())


@pytest.mark.slow
def test_the_ladder_answers_every_request_on_every_rung():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_ladder.py"), "--no-write", "--duration", "0.3",
                          "--rounds", "1", "--warmup", "300", "--concurrency", "8"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    from bench_ladder import RUNGS

    for rung in RUNGS:
        row = next(line for line in out.stdout.splitlines() if line.startswith(f"| {rung} |"))
        assert row.endswith("| 0 |"), row  # every request answered 200, cut-down rungs included


@pytest.mark.slow
def test_the_pipeline_steps_benchmark_compares_each_pipeline_with_the_bare_one():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_pipeline_steps.py"), "--no-write", "--no-ocr",
                          "--seconds", "0.2", "--rounds", "1"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    for steps in (1, 3):
        assert f"| bare | {steps} |" in out.stdout and f"| daemon | {steps} |" in out.stdout
    assert "- daemon: p3's model steps m1, m2, m3 take" in out.stdout
    # The steps took the in-process path: p3's last step counted its calls there, none via the frontend.
    assert "Calls by the way they went: {'in_process':" in out.stdout and "'via_frontend': 0} (m3)" in out.stdout

def test_the_idle_benchmark_measures_every_mode():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_idle.py"), "--no-write", "--models", "1,2",
                          "--seconds", "1", "--settle", "0", "--scrape-every", "0.5"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| this checkout | 1 |" in out.stdout and "| this checkout | 2 |" in out.stdout
    assert "wakeups/s idle | wakeups/s console | wakeups/s scrape | threads |" in out.stdout


@pytest.mark.slow
def test_the_cameras_benchmark_measures_every_decoder_against_the_floor():
    from support import rtsp, system_packages

    pytest.importorskip("av")
    rtsp.require_server()
    system_packages.require({**rtsp.FFMPEG_PACKAGES, **rtsp.CLIENT_PACKAGES})
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_cameras.py"), "--no-write", "--size", "320x180",
                          "--seconds", "0.3", "--warmup", "0.1", "--rounds", "1", "--clip-seconds", "1",
                          "--decoders", "floor,pyav,ffmpeg,gstreamer"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for kind in ("floor", "pyav", "ffmpeg", "gstreamer"):
        assert f"| 320×180 | {kind} |" in out.stdout, out.stdout
    assert "| 320×180 | floor |" in out.stdout and "| 1.00 × |" in out.stdout


@pytest.mark.slow
def test_the_cameras_benchmark_through_the_daemon_reports_the_capture_age_p50_p95_and_p99():
    from support import rtsp

    pytest.importorskip("av")
    pytest.importorskip("cv2")
    rtsp.require_server()
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_cameras.py"), "--daemon", "--no-write", "--size",
                          "160x120", "--seconds", "1", "--warmup", "0.2", "--clip-seconds", "1"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| age p50 ms | age p95 ms | age p99 ms |" in out.stdout, out.stdout
    assert "| 160x120 | off |" in out.stdout and "| 160x120 | on |" in out.stdout, out.stdout


@pytest.mark.slow
def test_the_cameras_benchmark_measures_a_faulty_camera_against_a_healthy_one():
    from support import rtsp

    pytest.importorskip("av")
    pytest.importorskip("cv2")
    rtsp.require_server()
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_cameras.py"), "--faults", "garbage", "--no-write",
                          "--seconds", "1", "--warmup", "0.2", "--rounds", "1", "--clip-seconds", "1"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| spare camera | hall age p99 ms | vs none |" in out.stdout, out.stdout
    assert "| none |" in out.stdout and "| garbage |" in out.stdout, out.stdout
