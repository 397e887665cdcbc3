"""The cold-worker benchmark runs every case (a tiny run; figures come from the full one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "bench_workers.py"


@pytest.mark.slow
def test_the_worker_benchmark_runs_every_case() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--no-write", "--duration", "0.2", "--rounds", "1",
                          "--warmup", "5", "--starts", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    for case in ("49k hot", "49k cold", "4m9 hot", "4m9 cold", "49k cold, all via slot", "49k cold, all inline",
                 "spare worker", "no spare"):
        assert f"| {case} |" in out.stdout, out.stdout
    assert "Cold minus hot, p50:" in out.stdout
