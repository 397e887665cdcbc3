"""Clients: plain pyzmq from docs/protocol.md alone, the blocking client, the pipelined one, the CLI, and the
client examples of the README and docs/protocol.md run as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import zmq

from support import models
from support.harness import REPO, Daemon, exchange


def test_a_plain_pyzmq_req_client_written_from_the_design_doc(daemon: Daemon) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    req = zmq.Context.instance().socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(daemon.endpoint)
    header = {"model": "addone", "version": "1", "id": "cam0-17",
              "inputs": [{"name": "x", "dtype": "float32", "shape": [3, 4]}]}
    try:
        req.send_multipart([json.dumps(header).encode(), x.tobytes()])
        assert req.poll(5000)
        frames = req.recv_multipart()
    finally:
        req.close()
    reply = json.loads(frames[0])
    assert reply["status"] == 200 and reply["id"] == "cam0-17"
    assert reply["outputs"] == [{"name": "y", "dtype": "float32", "shape": [3, 4]}]
    y = np.frombuffer(frames[1], dtype="<f4").reshape(3, 4)
    np.testing.assert_array_equal(y, x + 1)


def test_an_unknown_header_field_is_a_400_naming_it_not_a_200(daemon: Daemon) -> None:
    # `deadline_ms: 5` was served as if absent: a client never learnt its deadline was not one.
    header = {"model": "addone", "version": "1", "id": 12, "deadline_ms": 5,
              "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}
    frames = exchange(daemon.endpoint, zmq.DEALER, [b"", json.dumps(header).encode(), bytes(16)])
    reply = json.loads(frames[1])
    assert frames[0] == b"" and len(frames) == 2  # the delimiter back, and no output frame
    assert reply["status"] == 400 and reply["id"] == 12
    assert "unknown header field 'deadline_ms' (did you mean 'timeout_ms'?)" in reply["error"]


def test_pipelined_dealer_matches_many_replies_by_id(daemon: Daemon) -> None:
    session = ort.InferenceSession(str(REPO / "engines/classifier/1/model.onnx"))
    rng = np.random.default_rng(7)
    images = [rng.random((1, 3, 64, 64), dtype=np.float32) for _ in range(200)]
    with daemon.pipeline() as pipe:
        ids = [pipe.submit("classifier", {"images": im}) for im in images]
        assert pipe.in_flight == 200
        replies = dict(zip(ids, pipe.gather(list(reversed(ids)))[::-1]))
    for ident, im in zip(ids, images):
        reply = replies[ident]
        assert reply.status == 200 and reply.header["id"] == ident
        np.testing.assert_allclose(reply.outputs["probs"], session.run(None, {"images": im})[0], rtol=1e-5, atol=1e-6)


def test_many_clients_at_once_all_get_their_own_answers(daemon: Daemon) -> None:
    import threading

    errors: list[str] = []

    def worker(offset: float) -> None:
        x = np.full((1, 4), offset, np.float32)
        with daemon.client() as client:
            for _ in range(50):
                reply = client.infer("addone", {"x": x}, version="1")
                if reply.status != 200 or reply.outputs["y"][0, 0] != offset + 1:
                    errors.append(f"{offset}: {reply.header}")

    threads = [threading.Thread(target=worker, args=(float(i),)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_cli_infer_prints_header_and_shapes_and_saves_outputs(daemon: Daemon, tmp_path) -> None:
    x = np.ones((2, 4), np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([sys.executable, "-m", "infermux", "infer", "addone", "--endpoint", daemon.endpoint,
                           "--input", f"x={tmp_path / 'x.npy'}", "--version", "1", "--save", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert '"status": 200' in proc.stdout and "y: float32[2, 4]" in proc.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "out/y.npy"), x + 1)


def test_cli_infer_exits_nonzero_with_the_error(daemon: Daemon) -> None:
    proc = subprocess.run([sys.executable, "-m", "infermux", "infer", "nosuch", "--endpoint", daemon.endpoint,
                           "--shape", "x=1x4"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "404: unknown model 'nosuch'" in proc.stderr


def test_cli_infer_finds_the_socket_from_the_config(daemon: Daemon) -> None:
    proc = subprocess.run([sys.executable, "-m", "infermux", "infer", "addone", "--config", str(daemon.config_path),
                           "--runtime-dir", str(daemon.run_dir), "--shape", "x=1x4"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_the_models_view_carries_each_loaded_versions_inputs_and_outputs(daemon: Daemon) -> None:
    with daemon.admin() as admin:
        rows = {(m["name"], m["version"]): m for m in admin.call("models")["models"]}
    pair = rows[("pair", "1")]
    assert [(i["name"], i["dtype"], i["shape"]) for i in pair["inputs"]] == [("a", "float32", [-1, 3]),
                                                                          ("b", "float32", [-1, 3])]
    assert [o["name"] for o in pair["outputs"]] == ["sum", "prod"]


def test_cli_infer_and_bench_without_shapes_send_what_the_model_takes(daemon: Daemon) -> None:
    where = ["--config", str(daemon.config_path), "--runtime-dir", str(daemon.run_dir)]
    proc = subprocess.run([sys.executable, "-m", "infermux", "infer", "pair", *where],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "sum: float32[1, 3]" in proc.stdout and "prod: float32[1, 3]" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "infermux", "bench", "--model", "addone", "--version", "2",
                           "--requests", "50", "--warmup", "5", *where], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_cli_infer_of_an_unknown_model_shows_the_daemons_404_naming_the_served_models(daemon: Daemon) -> None:
    where = ["--config", str(daemon.config_path), "--runtime-dir", str(daemon.run_dir)]
    proc = subprocess.run([sys.executable, "-m", "infermux", "infer", "addon", *where],  # a typo of addone
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("infermux: 404: unknown model 'addon'; served models: ") and "addone" in line, line
    assert "--shape" not in proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["status"] == 404


def test_cli_bench_of_an_unknown_model_names_the_served_models(daemon: Daemon) -> None:
    where = ["--config", str(daemon.config_path), "--runtime-dir", str(daemon.run_dir)]
    proc = subprocess.run([sys.executable, "-m", "infermux", "bench", "addon", "--requests", "5", *where],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "no model 'addon' is configured; served models: " in line and "addone" in line, line


def _python_block(page: Path, needle: str) -> str:
    """The Python code block of `page` that holds `needle`, as written there."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S) if needle in b]
    assert len(blocks) == 1, f"{page.name}: {len(blocks)} Python blocks hold {needle!r}"
    return blocks[0]


def _run_snippet(code: str, endpoint: str) -> dict:
    """Run a documented snippet as written, but for its socket: `endpoint` instead of the packaged one."""
    packaged = '"ipc:///run/infermux/infer.sock"'
    assert packaged in code, "the snippet no longer names the packaged socket: update this test"
    scope: dict = {}
    exec(compile(code.replace(packaged, repr(endpoint)), "<snippet>", "exec"), scope)
    return scope


def test_the_readmes_client_snippet_runs_as_written(daemon: Daemon) -> None:
    scope = _run_snippet(_python_block(REPO / "README.md", "from infermux.client import Client"), daemon.endpoint)
    assert scope["reply"].status == 200 and scope["reply"].outputs["probs"].shape == (1, 10)


def test_the_protocol_pages_pyzmq_example_runs_as_written(make_daemon, tmp_path: Path) -> None:
    models.add_one(tmp_path / "add" / "1" / "model.onnx", width=2, offset=1.0)
    d = make_daemon(f'[[models]]\nname = "add"\nengine = "{tmp_path}/add/1/model.onnx"\n')
    scope = _run_snippet(_python_block(REPO / "docs" / "protocol.md", "sock.recv_multipart()"), d.endpoint)
    assert scope["reply"]["id"] == 7
    np.testing.assert_array_equal(scope["y"], [[2.0, 3.5]])
