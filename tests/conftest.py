"""Shared fixtures: tiny models on disk and real daemons serving them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import pytest

# The tests' helpers (tests/support) assert too: rewrite their asserts at the first import, or pytest
# warns that it came too late to (the TensorRT stand-in is also named in test modules' pytest_plugins).
pytest.register_assert_rewrite("support")

from support.harness import DAEMON_HEAD, REPO, Daemon  # noqa: E402 (after register_assert_rewrite)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: the .deb's build-time tests run without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker per core this process may use, at most 4 (each runs daemons with threads
    of their own; more would only queue them behind each other)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))

SESSION_MODELS = """
[routing]
version_mismatch = "fallback"

[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
contexts = 2
max_queue = 256

[[models]]
name = "addone"
version = "1"
engine = "addone/1/model.onnx"

[[models]]
name = "addone"
version = "2"
engine = "addone/2/model.onnx"

[[models]]
name = "pair"
engine = "pair/1/model.onnx"

[[models]]
name = "reshaper"
engine = "reshaper/1/model.onnx"

[[models]]
name = "slow"
engine = "slow/1/model.onnx"
max_queue = 2
timeout_ms = 5000

[[models]]
name = "slow_fb"
engine = "slow/1/model.onnx"
max_queue = 1
timeout_ms = 5000
fallback = "fast512"

[[models]]
name = "fast512"
engine = "fast512/1/model.onnx"
"""


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An engine directory with the sample models and the tests' own."""
    from support import models  # needs onnx; imported here so tests without daemons (the .deb build's) run without it

    root = tmp_path_factory.mktemp("engines")
    for name in ("classifier", "mlp"):
        shutil.copytree(REPO / "engines" / name, root / name)
    models.add_one(root / "addone/1/model.onnx", offset=1.0)
    models.add_one(root / "addone/2/model.onnx", offset=2.0)
    models.two_outputs(root / "pair/1/model.onnx")
    models.reshaper(root / "reshaper/1/model.onnx")
    models.slow(root / "slow/1/model.onnx")
    models.slow(root / "slower/1/model.onnx", layers=48)  # 4x: a flood stays queued (test_fairness.py)
    models.add_one(root / "fast512/1/model.onnx", width=512, offset=0.0)
    models.nonzero(root / "nonzero/1/model.onnx")
    return root


@pytest.fixture
def make_daemon(tmp_path: Path, engines: Path) -> Iterator[Callable[..., Daemon]]:
    """Start daemons with a test's own models; each is stopped after the test."""
    started: list[Daemon] = []

    def start(models_toml: str, head: str = DAEMON_HEAD, wait_ready: bool = True, env: dict[str, str] | None = None,
              prefix: list[str] | None = None, **fmt: str) -> Daemon:
        workdir = tmp_path / f"daemon{len(started)}"
        workdir.mkdir()
        daemon = Daemon(workdir, (head + models_toml).format(engines=engines, **fmt), env=env, prefix=prefix)
        started.append(daemon)
        return daemon.start(wait_ready=wait_ready)

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    """One daemon for the whole session, serving SESSION_MODELS."""
    workdir = tmp_path_factory.mktemp("daemon")
    d = Daemon(workdir, (DAEMON_HEAD + SESSION_MODELS).format(engines=engines)).start()
    yield d
    assert d.stop() == 0, d.log()
