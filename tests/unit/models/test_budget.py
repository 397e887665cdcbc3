"""The memory budget's arithmetic: limits, estimates, exit reasons; the allocator settings."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from support import models
from infermux.models import budget
from infermux import config as cfg
from infermux.events import EventLog
from infermux.config import ConfigError, ModelConfig
from infermux.execution.hooks import FrontendHooks
from infermux.models.registry import Registry
from infermux.format import exit_reason


def engine_of(tmp_path: Path, size: int, suffix: str = ".onnx") -> Path:
    path = tmp_path / f"model{suffix}"
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_the_estimate_prefers_what_was_measured_last(tmp_path: Path) -> None:
    mc = ModelConfig("m", engine_of(tmp_path, 10 << 20), placement="cold")
    assert budget.estimate(mc, measured=123 << 20, worker_base=50 << 20) == 123 << 20


def test_a_first_estimate_is_the_file_once_plus_a_workers_base(tmp_path: Path) -> None:
    onnx = engine_of(tmp_path, 10 << 20)
    cold = ModelConfig("m", onnx, placement="cold", contexts=2)  # onnxruntime: contexts share a session
    hot = ModelConfig("m", onnx, contexts=4)
    plan = ModelConfig("m", engine_of(tmp_path, 10 << 20, ".plan"), placement="cold", contexts=2)
    assert budget.estimate(cold, 0, 50 << 20) == (20 << 20) + (50 << 20)
    assert budget.estimate(hot, 0, 50 << 20) == 20 << 20
    assert budget.estimate(plan, 0, 0) == (20 << 20) + budget.DEFAULT_WORKER_BASE  # contexts share a plan
    missing = ModelConfig("m", tmp_path / "nope.onnx")
    assert budget.estimate(missing, 0, 0) == 0


def test_a_session_per_context_is_estimated_at_the_file_per_context(tmp_path: Path) -> None:
    onnx = engine_of(tmp_path, 10 << 20)
    own = ModelConfig("m", onnx, contexts=4, options={"share_session": False})
    gpu = ModelConfig("m", onnx, contexts=4, options={"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]})
    shared_gpu = ModelConfig("m", onnx, contexts=4, options={"providers": ["CUDAExecutionProvider"],
                                                              "share_session": True})
    assert budget.estimate(own, 0, 0) == budget.estimate(gpu, 0, 0) == 4 * (20 << 20)
    assert budget.estimate(shared_gpu, 0, 0) == 20 << 20


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


# Eight threads, alive together, each allocating: how many malloc arenas glibc ends up with.
_ARENAS_SCRIPT = """
import ctypes, os, sys, tempfile, threading
from infermux.models import budget
if sys.argv[1] == "capped":
    assert budget.limit_malloc_arenas(2)
allocated, release = threading.Barrier(9), threading.Event()
keep = []
def work():
    keep.append(bytearray(4096))  # above pymalloc's 512 B: glibc malloc, in this thread's arena
    allocated.wait()
    release.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
allocated.wait()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = tempfile.mktemp()
stream = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, stream)
libc.fclose(stream)
print(open(path).read().count("<heap nr="))
os.unlink(path)
release.set()
"""


def _arenas(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", _ARENAS_SCRIPT, mode], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return int(out.stdout)


@pytest.mark.skipif(budget._glibc() is None, reason="glibc's malloc only")
def test_malloc_arenas_stay_capped_however_many_threads_allocate() -> None:
    # The control shows the test can fail: uncapped, glibc gives each new thread an arena.
    assert _arenas("default") > 2
    assert _arenas("capped") <= 2


def test_an_operators_malloc_arena_max_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert budget.limit_malloc_arenas() is False


def test_an_unloaded_version_is_freed_at_once_not_at_the_next_full_collection(tmp_path: Path) -> None:
    models.add_one(tmp_path / "m" / "1" / "model.onnx")
    (tmp_path / "infermux.toml").write_text(f'[daemon]\nengine_dir = "{tmp_path}"\nwatch = false\n'
                                            '[[models]]\nname = "m"\nengine = "m/1/model.onnx"\n')
    registry = Registry(cfg.load(tmp_path / "infermux.toml"), EventLog(), FrontendHooks(lambda *a: None, lambda job: None))
    mv = registry.model("m").versions["1"]
    gc.disable()  # only the unload's own collection may free it
    try:
        assert registry.load(mv)
        executor = weakref.ref(mv.placement.executors[0])
        registry.unload(mv, timeout=5)
        assert executor() is None, "the executor waits in a reference cycle for a full collection"
    finally:
        gc.enable()
