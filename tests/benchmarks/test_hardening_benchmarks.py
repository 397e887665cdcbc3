"""Tiny runs of the fuzzing and peer benchmark scripts: they run, judge and report (RESULTS.md untouched)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent


@pytest.mark.slow
def test_the_fuzz_benchmark_reports_a_clean_run() -> None:
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_fuzz.py"), "--messages", "600", "--no-write"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "| messages sent / answered | 600 / 600 |" in out.stdout
    assert "| daemon died or hung / tracebacks in its log / exit code on SIGTERM | 0 / 0 / 0 |" in out.stdout


@pytest.mark.slow
def test_the_peer_benchmark_says_why_mlserver_is_missing_and_still_measures_infermux() -> None:
    # A venv that cannot be made stands for any install failure: no figures are invented for MLServer.
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_peer.py"), "--rounds", "1", "--duration", "0.2",
                          "--warmup", "5", "--venv", "/proc/no/such/venv", "--no-write"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MLServer: **not measured**: `python -m venv` failed" in out.stdout
    for case in ("| infermux tcp | 1 |", "| infermux ipc | 1 |", "| infermux tcp | 16 |", "| infermux ipc | 16 |"):
        assert case in out.stdout
    assert "| MLServer http |" not in out.stdout


@pytest.mark.slow
def test_the_hostile_benchmark_answers_every_client_beside_giant_nan_and_many_scan_frames() -> None:
    pytest.importorskip("cv2", reason="the pipeline scenarios need OpenCV")
    pytest.importorskip("PIL", reason="the pipeline scenarios need Pillow")
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_hostile.py"), "--only", "each send", "--rounds", "1",
                          "--seconds", "0.5", "--skip-ocr", "--no-write"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for scenario in ("| a 40,000 × 40,000 box echoed from a 10-byte frame into crop, other bytes each send | 100.0 ",
                     "| a NaN box beside a good one, through track into crop, each send another of 64 keys | 100.0 ",
                     "| a 1 MB progressive 2048² JPEG of 100,000 scans, other bytes each send | 100.0 "):
        assert scenario in out.stdout, out.stdout[-3000:]
