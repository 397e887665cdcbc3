"""What the feature matrix's test files share: the placements, a placement's daemon, and the per-cell check.

Each matrix file has its own module-scoped `placed` fixture (a daemon per placement, serving that
file's models); `cell` (registered for tests/daemon by its conftest.py) wraps each cell on it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from infermux import format as fmt
from infermux.transport.wire import choose
from support.harness import Daemon, Value
from support.publish import WATCH_CLOSELY

# "pyzmq": hot, on a daemon whose frontend runs pyzmq's socket calls instead of the compiled ones
# (transport/wire.py), so that every behaviour is checked through both.
PLACEMENTS = ("hot", "cold", "promoted", "demoted", "pyzmq")
WITH_WORKER = ("cold", "demoted")  # where the version ends up in a worker process
MOVES = {"promoted": "promote", "demoted": "demote"}
IN_DAEMON = ("hot", "promoted", "pyzmq")  # where the version ends up in the daemon's process
WIRE_ENV = {"pyzmq": {"INFERMUX_WIRE": "python"}}  # the placements' environments, where they need one
# The `[daemon]` settings of a matrix file's daemon beyond listen and engine_dir: a version published
# into the watched engine_dir is seen within about a second; a message of 1 MiB at most.
WATCHING: dict[str, Value] = {"max_message_bytes": 1048576, **WATCH_CLOSELY}


def placed_as(placement: str) -> dict[str, str | bool]:
    """A hot or cold row's model settings: cold is in its worker from the start (preloaded)."""
    return {"placement": "cold", "preload": True} if placement == "cold" else {}


def publish_copy(source: Path, root: Path, model: str, version: int) -> None:
    """`source` published as `model` `version` under the watched `root` the documented way (a folder
    renamed into place)."""
    staged = root / model / f".{version}.tmp"
    staged.mkdir(parents=True)
    shutil.copyfile(source, staged / "model.onnx")
    os.rename(staged, root / model / str(version))


def versions(d: Daemon, model: str) -> dict[str, dict[str, Any]]:
    """Admin `models`' views of `model`, by version."""
    with d.admin() as admin:
        return {v["version"]: v for v in admin.call("models")["models"] if v["name"] == model}


def placement_daemon(name: str, workdir: Path, config_text: str) -> Daemon:
    """Placement `name`'s daemon, started, with the frontend's socket calls the placement says."""
    d = Daemon(workdir, config_text, env=WIRE_ENV.get(name)).start()
    with d.admin() as admin:
        wire = admin.call("status")["daemon"]["wire"]
    expected = "python" if name in WIRE_ENV else choose().kind  # compiled wherever the extension was built
    assert wire["kind"] == expected, wire
    return d


@dataclass
class Placement:
    """One placement's daemon and where its engines lie."""

    name: str
    daemon: Daemon
    engines: Path  # conftest's engine directory
    watched: Path  # this daemon's engine_dir, watched for new versions

    @property
    def where(self) -> str:
        """What admin `models` says of a placed version: "hot" or "cold"."""
        return "hot" if self.name in IN_DAEMON else "cold"


def counted_500(d: Daemon) -> dict[tuple[str, str], int]:
    """500s each version's statistics hold."""
    with d.admin() as admin:
        views = admin.call("models")["models"]
    return {(v["name"], v["version"]): v["stats"]["by_status"].get("500", 0) for v in views}


def superseded_counted_as_errors(d: Daemon) -> dict[str, dict]:
    """The versions and pipelines whose statistics count a 409 (superseded under newest_per_key: the
    policy working) as an error, with their statistics: those that answered nothing but 200 and 409,
    at least one 409, and yet show an error rate (the console's ERR%), or errors in the `status` and
    `ctl pipelines` tables' ERR column."""
    with d.admin() as admin:
        views = admin.call("models")["models"]
        pipelines = admin.call("pipelines")["pipelines"]
    seen = [(f"{v['name']}:{v['version']}", v["stats"]) for v in views]
    seen += [(f"pipeline {p['name']}", p["frames"]) for p in pipelines]
    wrong = {}
    for name, stats in seen:
        by_status = stats.get("by_status") or {}
        if by_status.get("409") and set(by_status) <= {"200", "409"}:
            if stats.get("error_qps") or fmt.failures(stats):
                wrong[name] = stats
    return wrong


@pytest.fixture
def cell(placed: Placement) -> Iterator[Placement]:
    """One cell on its placement's daemon; fails it if the daemon logged a traceback or counted a 500
    meanwhile, moved a version in a way its life's table lacks (models/life.py), or counts a stream's 409
    as an error."""
    d = placed.daemon
    start, before = len(d.log()), counted_500(d)
    yield placed
    during = d.log()[start:]
    assert "Traceback" not in during and "answered 500" not in during, during[-6000:]
    assert "is not in the table (models/life.py)" not in during, [x for x in during.splitlines() if "version life" in x]
    grew = {k: n - before.get(k, 0) for k, n in counted_500(d).items() if n > before.get(k, 0)}
    assert not grew, f"500s counted during the cell: {grew}"
    wrong = superseded_counted_as_errors(d)
    assert not wrong, f"409s (superseded) counted as errors: {wrong}"
