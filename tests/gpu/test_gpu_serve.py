"""A TensorRT engine served end to end: `infermux serve` in a subprocess, the
Client on its ipc socket, outputs compared with onnxruntime (atol 1e-3).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gpu_support import images

pytestmark = pytest.mark.gpu

CONFIG = """\
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engine_dir}"

[[models]]
name = "classifier"
version = "1"
engine = "classifier/1/model.plan"
contexts = 2

[models.options]
device = 0
"""


@pytest.fixture
def daemon(plan_fp32: Path, tmp_path: Path):
    """`infermux serve` with the built classifier engine; yields its endpoint."""
    engine_dir = tmp_path / "engines"
    (engine_dir / "classifier" / "1").mkdir(parents=True)
    (engine_dir / "classifier" / "1" / "model.plan").write_bytes(plan_fp32.read_bytes())
    config, runtime = tmp_path / "infermux.toml", tmp_path / "run"
    runtime.mkdir()
    config.write_text(CONFIG.format(engine_dir=engine_dir))
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "infermux", "serve", "--config", str(config),
                             "--runtime-dir", str(runtime), "--state-dir", str(tmp_path / "state")],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"ipc://{runtime / 'infer.sock'}", proc, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def wait_ready(endpoint: str, proc: subprocess.Popen, log, deadline_s: float = 90):
    """Poll until the model answers 200 (503 while it loads); the first reply."""
    from infermux.client import Client

    x = images(1)
    end = time.monotonic() + deadline_s
    with Client(endpoint, timeout_s=2) as client:
        while time.monotonic() < end:
            assert proc.poll() is None, f"infermux serve exited with {proc.returncode}:\n{_tail(log)}"
            try:
                reply = client.infer("classifier", {"images": x})
            except TimeoutError:
                continue  # socket not bound yet, or the reply was slow
            if reply.status == 200:
                return reply
            assert reply.status == 503, f"{reply.status}: {reply.error}"
            time.sleep(0.2)
    pytest.fail(f"classifier not ready after {deadline_s} s:\n{_tail(log)}")


def _tail(log) -> str:
    log.seek(0)
    return log.read()[-4000:]


def test_served_outputs_match_onnxruntime(daemon, reference):
    from infermux.client import Client

    endpoint, proc, log = daemon
    wait_ready(endpoint, proc, log)
    with Client(endpoint, timeout_s=10) as client:
        for batch in (1, 4, 8):
            x = images(batch, seed=batch)
            reply = client.infer("classifier", {"images": x}, version="1")
            assert reply.status == 200, reply.error
            np.testing.assert_allclose(reply.outputs["probs"], reference(x), atol=1e-3, rtol=1e-3)
        too_big = client.infer("classifier", {"images": images(9)})
        assert too_big.status == 400 and "[8, 3, 64, 64]" in too_big.error
