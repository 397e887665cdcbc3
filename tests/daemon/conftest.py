"""Fixtures of the daemon tests beyond tests/conftest.py's, and which files the quick loop leaves out."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.matrix import cell  # noqa: F401  (the feature matrices' per-cell check; each file has its own `placed`)
from support.users import open_tmp, traversable  # noqa: F401  (folders other users may reach while a test runs)

# Files whose tests together take ten seconds or more on the 2-core development box: marked `slow`, so
# the quick loop (`pytest tests/unit tests/daemon -x -m "not slow"`, docs/testing.md) leaves them to
# the full run. Measured with --durations=0; tests/benchmarks/RESULTS.md has the loop's time.
SLOW_FILES = {
    "test_admin.py", "test_batching.py", "test_chaos.py", "test_cli.py", "test_curve.py", "test_hostile.py",
    "test_hostile_sockets.py", "test_hot_swap.py", "test_matrix.py", "test_pipeline_matrix.py",
    "test_pipelines.py", "test_regions.py", "test_routing.py", "test_shared_weights.py", "test_tracking.py",
    "test_workers.py", "test_rollout_life.py", "test_pipeline_steps.py", "test_hostile_boxes.py",
    "test_hostile_text.py", "test_object_events.py", "test_mqtt_sink.py",
    "test_cameras.py", "test_camera_streams.py",
    "test_cameras_rtsp.py", "test_camera_matrix.py", "test_sink_matrix.py", "test_mqtt_outage.py",
    "test_zone_matrix.py", "test_crossings_kept.py",
}
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = {path.name for path in HERE.rglob("test_*.py")}
    assert SLOW_FILES <= here, f"SLOW_FILES names files that are not here: {sorted(SLOW_FILES - here)}"
    for item in items:
        if HERE in item.path.parents and item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty engine directory for one test (the watched one, where its versions are published)."""
    path = tmp_path / "engines"
    path.mkdir()
    return path
