"""The swapper's own bookkeeping stays bounded however many versions come and go (what a long soak would show)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

from infermux import config as cfg
from infermux.events import EventLog
from infermux.execution.hooks import FrontendHooks
from infermux.models.registry import Registry
from infermux.swap.rollout import Rollouts
from infermux.swap.swapper import Swapper
from support.publish import publish

CONFIG = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
watch_settle_s = 0
"""


@pytest.fixture
def swapper(tmp_path: Path) -> Iterator[Swapper]:
    """A Swapper on a registry with no frontend (whose barrier then returns at once)."""
    root = tmp_path / "engines"
    (root / "cold").mkdir(parents=True)
    # A cold model that is not preloaded: versions are registered, never loaded, so the test is quick.
    (root / "cold" / "model.toml").write_text('placement = "cold"\n')
    path = tmp_path / "infermux.toml"
    path.write_text(CONFIG.format(root=root))
    config = cfg.load(path)
    events = EventLog()
    registry = Registry(config, events, FrontendHooks(reply=lambda *a: None, on_late=lambda job: None))
    rollouts = Rollouts(registry, events)  # none start here: no model has a rollout table
    server = SimpleNamespace(config=config, registry=registry, events=events, ticks=[], rollouts=rollouts)
    yield Swapper(server)  # type: ignore[arg-type]
    rollouts.close()


def test_versions_published_and_deleted_leave_no_trace(swapper: Swapper) -> None:
    root = swapper.engine_dir
    for version in range(1, 41):
        publish(root, "cold", version, offset=version)
        if version > 1:
            shutil.rmtree(root / "cold" / str(version - 1))  # the operator removes the old one
        swapper.apply(swapper.watcher.scan())
    assert set(swapper.registry.model("cold").versions) == {"40"}
    assert set(swapper._announced) == {("cold", "40")}  # was one entry per version ever published
    assert set(swapper._made_from) == {("cold", "40")}
