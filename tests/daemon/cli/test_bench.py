"""Behaviour of the load generator (infermux.cli.bench) against the bare-loop baseline server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from infermux.cli import bench
from infermux.cli.bench import BenchResult, run_load, wait_ready
from infermux.protocol import encode_request

ROOT = Path(__file__).resolve().parents[3]
BASELINES = ROOT / "tests" / "benchmarks" / "baselines.py"
CLASSIFIER = ROOT / "engines" / "classifier" / "1" / "model.onnx"
IMAGES = {"images": np.zeros((1, 3, 64, 64), np.float32)}


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """A bare ROUTER + onnxruntime loop serving the sample classifier."""
    path = tmp_path_factory.mktemp("bench") / "bare.sock"
    address = f"ipc://{path}"
    server = subprocess.Popen([sys.executable, str(BASELINES), "bare", address, str(CLASSIFIER)])
    try:
        assert wait_ready(address, "classifier", IMAGES, timeout_s=30).ok
        yield address
    finally:
        server.terminate()
        server.wait(10)


def test_a_counted_run_measures_every_request(endpoint):
    result = run_load(endpoint, "classifier", IMAGES, concurrency=4, count=300, warmup=20)
    assert (result.requests, result.ok, result.errors) == (300, 300, 0)
    assert result.by_status == {200: 300}
    assert 0 < result.p50_us <= result.p90_us <= result.p99_us <= result.max_us
    assert result.qps == pytest.approx(300 / result.duration_s)


def test_a_timed_run_stops_after_its_duration_and_reports_progress(endpoint):
    seen = []
    result = run_load(endpoint, "classifier", IMAGES, concurrency=2, duration_s=1.2,
                      progress=lambda done, elapsed: seen.append((done, elapsed)))
    assert 1.2 <= result.duration_s < 2.5
    assert result.requests > 0 and result.errors == 0
    assert seen and seen[0][1] >= 1.0


def test_rejected_requests_are_counted_by_status(endpoint):
    wrong = {"images": np.zeros((1, 3, 32, 32), np.float32)}
    result = run_load(endpoint, "classifier", wrong, count=20)
    assert result.by_status == {400: 20} and result.errors == 20 and result.ok == 0


def test_a_silent_endpoint_times_out(tmp_path):
    with pytest.raises(TimeoutError):
        run_load(f"ipc://{tmp_path}/nobody.sock", "classifier", IMAGES, count=1, timeout_s=0.2)


def test_exactly_one_stop_condition_is_required(endpoint):
    with pytest.raises(ValueError):
        run_load(endpoint, "classifier", IMAGES)
    with pytest.raises(ValueError):
        run_load(endpoint, "classifier", IMAGES, count=1, duration_s=1)


def test_the_command_prints_json_and_exits_zero_when_all_served(endpoint, capsys):
    code = bench.main(["--endpoint", endpoint, "--model", "classifier", "--shape", "images=1x3x64x64",
                       "--concurrency", "2", "-n", "50", "--warmup", "5", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["requests"] == 50 and doc["by_status"] == {"200": 50} and doc["concurrency"] == 2


def test_the_command_exits_one_when_replies_fail(endpoint, capsys):
    code = bench.main(["--endpoint", endpoint, "--model", "classifier", "--shape", "images=1x3x8x8",
                       "-n", "5", "--warmup", "0"])
    assert code == 1
    assert "400: 5" in capsys.readouterr().out


def test_the_command_reads_inputs_from_npy_files(endpoint, tmp_path, capsys):
    np.save(tmp_path / "x.npy", IMAGES["images"])
    code = bench.main(["--endpoint", endpoint, "--model", "classifier", "--input", f"images={tmp_path / 'x.npy'}",
                       "-n", "5", "--warmup", "0", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["ok"] == 5


def test_the_command_needs_inputs():
    with pytest.raises(SystemExit, match="--shape"):
        bench.main(["--endpoint", "ipc:///nowhere", "--model", "classifier"])


def test_the_command_takes_its_endpoint_from_a_config(endpoint, tmp_path, capsys):
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nlisten = ["{endpoint}"]\n')
    code = bench.main(["--config", str(config), "--model", "classifier", "--shape", "images=1x3x64x64",
                       "-n", "5", "--warmup", "0", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["endpoint"] == endpoint


def test_a_missing_config_is_reported(tmp_path, capsys):
    code = bench.main(["--config", str(tmp_path / "none.toml"), "--model", "m", "--shape", "x=1"])
    assert code == 2 and "no endpoint" in capsys.readouterr().err


def test_result_json_round_trips():
    result = BenchResult("ipc://x", "m", 1, 2, 1.0, 2.0, 1, 10.0, 20.0, 30.0, 40.0, 15.0, {200: 1, 429: 1})
    doc = json.loads(json.dumps(result.as_json()))
    assert doc["errors"] == 1 and doc["by_status"] == {"200": 1, "429": 1}
    assert "p99 0.030 ms" in result.summary()


def test_an_admin_socket_that_is_not_there_is_not_asked(endpoint, monkeypatch, capsys):
    import infermux.client

    asked = []

    class Recording(infermux.client.AdminClient):
        def __init__(self, address: str, **kwargs) -> None:
            asked.append(address)
            super().__init__(address, **kwargs)

    monkeypatch.setattr(infermux.client, "AdminClient", Recording)
    code = bench.main(["--endpoint", endpoint, "--model", "classifier", "--shape", "images=1x3x64x64",
                       "-n", "5", "--warmup", "0", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["ok"] == 5
    assert asked == []  # beside bare.sock there is no admin.sock: asking it was a 5 s wait for nothing


def test_an_admin_socket_that_is_there_is_asked_whether_the_model_is_a_pipeline(endpoint, monkeypatch, capsys):
    import infermux.client

    asked = []

    class Answering:
        def __init__(self, address: str, **kwargs) -> None:
            asked.append(address)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def call(self, command: str) -> dict:
            return {"pipelines": []}

    admin = Path(endpoint[len("ipc://"):]).with_name("admin.sock")
    admin.touch()
    try:
        monkeypatch.setattr(infermux.client, "AdminClient", Answering)
        code = bench.main(["--endpoint", endpoint, "--model", "classifier", "--shape", "images=1x3x64x64",
                           "-n", "5", "--warmup", "0", "--json"])
    finally:
        admin.unlink()
    assert code == 0 and json.loads(capsys.readouterr().out)["ok"] == 5
    assert asked == [f"ipc://{admin}"]


NOBODY = 65534


def as_nobody(check: Callable[[], str]) -> str:
    """`check()` run in a forked child that has become `nobody` (no exec: the interpreter may live
    where nobody cannot read, as under /root)."""
    import os

    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, answer, and leave without running the parent's cleanups
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(writer, check().encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        out = answer.read()
    os.waitpid(pid, 0)
    return out


def test_an_admin_socket_outside_the_users_group_is_not_asked_by_a_user_who_is_not_root():
    """As `nobody`: a socket file it may not write is not asked (the answer would be a timeout);
    one it may write, and an endpoint that is not a file, are."""
    import os
    import shutil
    import tempfile

    from infermux.cli.bench import _may_connect

    if os.geteuid() != 0:
        pytest.skip("needs root to run the check as another user")
    folder = Path(tempfile.mkdtemp(prefix="infermux-may-connect-"))  # pytest's own folders may be 0700
    try:
        if not all(parent.stat().st_mode & 0o001 for parent in folder.parents):
            pytest.skip(f"a folder above {folder} is closed to other users")
        folder.chmod(0o755)
        endpoints = []
        for name, mode in (("open.sock", 0o666), ("group.sock", 0o660)):
            (folder / name).touch()
            (folder / name).chmod(mode)
            endpoints.append(f"ipc://{folder / name}")
        endpoints.append("tcp://127.0.0.1:5555")
        as_user = as_nobody(lambda: " ".join(str(_may_connect(e)) for e in endpoints)).split()
        assert as_user == ["True", "False", "True"]
        assert [_may_connect(e) for e in endpoints] == [True, True, True]  # root may write anything
    finally:
        shutil.rmtree(folder)


def test_wait_covers_a_server_that_has_not_made_its_socket_yet(tmp_path):
    address = f"ipc://{tmp_path}/late.sock"
    bench_run = subprocess.Popen([sys.executable, "-m", "infermux", "bench", "classifier", "-e", address,
                                  "--shape", "images=1x3x64x64", "-n", "5", "--wait", "60", "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # bench is waiting: the socket file does not exist yet
        assert bench_run.poll() is None, bench_run.communicate()
        server = subprocess.Popen([sys.executable, str(BASELINES), "bare", address, str(CLASSIFIER)])
        try:
            out, err = bench_run.communicate(timeout=60)
        finally:
            server.terminate()
            server.wait(10)
    finally:
        if bench_run.poll() is None:
            bench_run.kill()
    assert bench_run.returncode == 0, err
    assert json.loads(out)["ok"] == 5


def test_wait_covers_a_model_still_loading_when_its_inputs_are_asked(make_daemon, capsys):
    d = make_daemon('[[models]]\nname = "late"\nengine = "addone/1/model.onnx"\nbackend = "slow_load:SlowLoadBackend"\n'
                    "[models.options]\nload_delay_s = 1.5\n", wait_ready=False)
    # No --shape: bench asks the daemon for the inputs, which a loading version cannot say yet.
    code = bench.main(["late", "--endpoint", d.endpoint, "--admin", d.admin_endpoint, "-n", "5", "--warmup", "0",
                       "--wait", "60", "--json"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["ok"] == 5


@pytest.mark.parametrize("fields", [{}, {"version": "2", "timeout_ms": 50, "key": "cam-1"}, {"outputs": ["id"]}])
def test_each_requests_header_is_what_json_makes_of_it_with_its_id(fields):
    frames = encode_request("classifier", IMAGES, id=0, **fields)
    header = json.loads(frames[0])
    slot = bench.id_slot(json.dumps(header, separators=(",", ":")).encode())
    assert slot is not None
    for ident in (0, 7, 10, 123_456_789, -3):
        assert b"%s%d%s" % (slot[0], ident, slot[1]) == json.dumps({**header, "id": ident}, separators=(",", ":")).encode()


@pytest.mark.parametrize("header", [b'{"model":"m","x":{"id":0},"id":0}', b'{"model":"m","id":01}', b'{"model":"m"}'])
def test_a_header_whose_id_cannot_be_cut_out_once_is_encoded_whole(header):
    assert bench.id_slot(header) is None
