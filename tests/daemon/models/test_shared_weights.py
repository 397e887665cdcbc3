"""A hot onnxruntime version holds its weights once, however many contexts run it: the daemon's
resident memory and the memory it reports grow by activations per context, not by a copy of the
model per context (docs/architecture.md#memory-footprints)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from support.harness import DAEMON_HEAD, Daemon
from support.models import one_matmul

MODEL_TOML = """
[[models]]
name = "big"
version = "1"
engine = "{engine}"
contexts = {contexts}
"""


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_matmul(tmp_path_factory.mktemp("big") / "big" / "1" / "model.onnx")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def served_footprint(workdir: Path, model: Path, contexts: int) -> tuple[int, int]:
    """The daemon's RSS and the model's reported memory_bytes, once every context has computed."""
    workdir.mkdir()
    config = DAEMON_HEAD.format(engines=model.parents[2]) + MODEL_TOML.format(engine=model, contexts=contexts)
    daemon = Daemon(workdir, config).start(timeout=60)
    try:
        x = np.ones((1, 4096), np.float32)

        def drive() -> None:
            with daemon.client(timeout_s=30) as client:
                for _ in range(8):
                    reply = client.infer("big", {"x": x})
                    assert reply.status == 200, reply.error

        threads = [threading.Thread(target=drive) for _ in range(2 * contexts)]  # every context gets work
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert daemon.proc is not None
        rss = rss_bytes(daemon.proc.pid)
        with daemon.admin() as admin:
            rows = {m["name"]: m for m in admin.call("status")["models"]}
        return rss, rows["big"]["memory_bytes"]
    finally:
        assert daemon.stop() == 0


def test_four_contexts_hold_the_weights_once(tmp_path: Path, big_model: Path) -> None:
    size = big_model.stat().st_size
    rss1, reported1 = served_footprint(tmp_path / "one", big_model, 1)
    rss4, reported4 = served_footprint(tmp_path / "four", big_model, 4)
    assert rss1 > size and reported1 >= size, (rss1, reported1, size)  # the weights are in both figures
    assert rss4 - rss1 <= 0.25 * size, f"4 contexts added {(rss4 - rss1) / 2**20:.0f} MiB over 1"
    assert reported4 <= 1.25 * reported1, (reported1, reported4)
