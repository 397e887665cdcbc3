"""The memory budget's arithmetic: limits, estimates, exit reasons."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from infermux import budget
from infermux.config import ConfigError, ModelConfig
from infermux.workerproc import exit_reason


def engine_of(tmp_path: Path, size: int, suffix: str = ".onnx") -> Path:
    path = tmp_path / f"model{suffix}"
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_the_estimate_prefers_what_was_measured_last(tmp_path: Path) -> None:
    mc = ModelConfig("m", engine_of(tmp_path, 10 << 20), mode="multiproc")
    assert budget.estimate(mc, measured=123 << 20, worker_base=50 << 20) == 123 << 20


def test_a_first_estimate_is_the_file_per_copy_plus_a_workers_base(tmp_path: Path) -> None:
    onnx = engine_of(tmp_path, 10 << 20)
    cold = ModelConfig("m", onnx, mode="multiproc", contexts=2)  # onnxruntime: one session per context
    hot = ModelConfig("m", onnx, contexts=1)
    plan = ModelConfig("m", engine_of(tmp_path, 10 << 20, ".plan"), mode="multiproc", contexts=2)
    assert budget.estimate(cold, 0, 50 << 20) == int(10 * 2 * 2) * 2**20 + (50 << 20)
    assert budget.estimate(hot, 0, 50 << 20) == 20 << 20
    assert budget.estimate(plan, 0, 0) == (20 << 20) + budget.DEFAULT_WORKER_BASE  # contexts share a plan
    missing = ModelConfig("m", tmp_path / "nope.onnx")
    assert budget.estimate(missing, 0, 0) == 0


def test_the_limit_is_a_share_of_what_the_box_has() -> None:
    b = budget.MemoryBudget("50%", "test.toml")
    assert b.total > 0 and b.limit == b.total // 2
    assert 0 < b.available() <= b.total
    assert budget.MemoryBudget("1GiB", "test.toml").limit == 1 << 30
    with pytest.raises(ConfigError, match="memory_budget"):
        budget.MemoryBudget("lots", "test.toml")


def test_exit_reasons_name_the_signal() -> None:
    assert exit_reason(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_reason(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert exit_reason(3) == "exit code 3" and exit_reason(None) == "running"


def test_worker_settings_are_validated_with_their_field_path() -> None:
    from infermux import config

    assert config.parse("", Path("x.toml")).daemon.spare_worker is True
    with pytest.raises(ConfigError, match=r"daemon.worker_hang_s: must be > 0"):
        config.parse("[daemon]\nworker_hang_s = 0\n", Path("x.toml"))
    with pytest.raises(ConfigError, match=r"daemon.spare_worker: must be bool"):
        config.parse('[daemon]\nspare_worker = "yes"\n', Path("x.toml"))
