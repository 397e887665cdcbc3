"""Rollback: registry.pin / unpin (what the admin socket's pin and unpin commands call).

The daemon runs in this process (same App, swapper and frontend thread
as `infermux serve`, real sockets and files) so the test can call the
registry the way the admin server will.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from infermux import config as cfg
from infermux.swap import swapper as swap
from infermux.client import Client
from infermux.app import App
from support.polling import eventually
from support.publish import publish

X = np.ones((1, 4), np.float32)

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
watch = {watch}
watch_settle_s = 0.3
watch_debounce_s = 0.02
"""


@contextmanager
def running(tmp_path: Path, root: Path, models: str = "", watch: bool = True) -> Iterator[App]:
    """serve.py's start-up sequence, with the frontend on a thread of this process."""
    text = HEAD.format(root=root, watch=str(watch).lower()) + models
    server = App(cfg.parse(text, tmp_path / "infermux.toml"), tmp_path / "run")
    server.bind()
    swapper = swap.attach(server)
    ready = threading.Event()

    def done() -> None:
        if swapper is not None:
            swapper.start()
        ready.set()

    server.start_models(done=done)
    frontend = threading.Thread(target=server.serve_forever, daemon=True)
    frontend.start()
    assert ready.wait(15)
    try:
        yield server
    finally:
        if swapper is not None:
            swapper.stop()
        server.stop()
        frontend.join(15)


def version_served(server: App, model: str = "m") -> str:
    with Client(server.endpoints[0], timeout_s=5) as client:
        reply = client.infer(model, {"x": X})
    assert reply.status == 200, reply.error
    np.testing.assert_array_equal(reply.outputs["y"], X + float(reply.version))  # offset = version
    return reply.version or ""


def kinds(server: App, model: str, version: str) -> list[str]:
    return [e.kind for e in server.events.recent(1000) if e.model == model and e.version == version]


def test_pin_rolls_back_to_an_older_file_and_holds_it_until_unpin(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    publish(root, "m", 2, offset=2)
    with running(tmp_path, root) as server:
        assert version_served(server) == "2"
        assert kinds(server, "m", "1") == ["detected"]  # latest_n = 1: never loaded
        server.registry.pin("m", "1")  # rollback to a version only on disk
        eventually(lambda: version_served(server) == "1", "version 1 served", 30.0)
        eventually(lambda: "unloaded" in kinds(server, "m", "2"), "version 2 unloaded", 30.0)
        publish(root, "m", 3, offset=3)  # newer versions are ignored while pinned
        eventually(lambda: "detected" in kinds(server, "m", "3"), "version 3 detected", 30.0)
        time.sleep(0.5)
        assert version_served(server) == "1" and "loading" not in kinds(server, "m", "3")
        server.registry.unpin("m")  # catch up with the newest
        eventually(lambda: version_served(server) == "3", "version 3 served", 30.0)
        eventually(lambda: kinds(server, "m", "1")[-1:] == ["unloaded"], "version 1 unloaded last", 30.0)
        assert server.registry.model("m").pinned is None


@pytest.mark.timing
def test_pin_to_a_serving_version_takes_effect_at_once(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    publish(root, "m", 2, offset=2)
    (root / "m" / "model.toml").write_text('version_policy = "all"\n')
    with running(tmp_path, root) as server:
        assert version_served(server) == "2"
        server.registry.pin("m", "1")
        assert version_served(server) == "1"  # no load needed: the very next request
        eventually(lambda: "unloaded" in kinds(server, "m", "2"), "version 2 unloaded", 30.0)  # a pin holds one version: the rest drain
        server.registry.unpin("m")
        eventually(lambda: version_served(server) == "2", "version 2 served", 30.0)


def test_pin_without_the_watcher_switches_among_configured_versions(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    publish(root, "m", 2, offset=2)
    models = "".join(f'[[models]]\nname = "m"\nversion = "{v}"\nengine = "m/{v}/model.onnx"\n' for v in (1, 2))
    with running(tmp_path, root, models, watch=False) as server:
        assert version_served(server) == "2"
        server.registry.pin("m", "1")
        assert version_served(server) == "1"
        server.registry.unpin("m")
        assert version_served(server) == "2"


def test_pin_and_unpin_refuse_unknown_models_and_versions(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    with running(tmp_path, root) as server:
        with pytest.raises(ValueError, match=r"unknown model 'nosuch'; models: m"):
            server.registry.pin("nosuch", "1")
        with pytest.raises(ValueError, match=r"model 'm' has no version '7'; versions: 1"):
            server.registry.pin("m", "7")
        with pytest.raises(ValueError, match=r"unknown model 'nosuch'"):
            server.registry.unpin("nosuch")
        assert server.registry.model("m").pinned is None


@pytest.mark.parametrize("strategy", ["least_queue", "weighted"])
def test_unpin_with_a_corrupt_newest_version_settles_on_the_newest_that_loads(tmp_path: Path, strategy: str) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    publish(root, "m", 2, offset=2)
    with running(tmp_path, root, f'[routing]\nstrategy = "{strategy}"\n') as server:
        server.registry.pin("m", "1")
        eventually(lambda: version_served(server) == "1", "version 1 served", 30.0)
        corrupt = root / "m" / ".3.tmp" / "model.onnx"  # published the documented way, but not an ONNX model
        corrupt.parent.mkdir(parents=True)
        corrupt.write_bytes(b"\x08\x07 this is not an onnx model" * 50)
        corrupt.parent.rename(root / "m" / "3")
        eventually(lambda: "detected" in kinds(server, "m", "3"), "version 3 detected", 30.0)
        server.registry.unpin("m")  # the policy wants 3, which cannot load: 2 is the newest that does
        eventually(lambda: version_served(server) == "2", "version 2 served", 30.0)
        eventually(lambda: kinds(server, "m", "1")[-1:] == ["unloaded"], "version 1 unloaded last", 30.0)
        settled = [e for e in server.events.recent(1000) if e.kind == "settled"]
        assert [(e.model, e.version) for e in settled] == [("m", "2")]
        assert "version 3: load failed" in settled[0].detail["reason"]
        assert "serving version 2, the newest that loads" in settled[0].detail["reason"]
        # under weighted routing, the stand-in is not said to take every request: it takes its share
        assert ("weight's share" in settled[0].detail["reason"]) == (strategy == "weighted")
        server.registry.pin("m", "1")  # the failed file is not tried again, pinned or not
        eventually(lambda: version_served(server) == "1", "version 1 served", 30.0)
        server.registry.unpin("m")
        eventually(lambda: version_served(server) == "2", "version 2 served", 30.0)
        assert kinds(server, "m", "3").count("loading") == 1
        assert server.registry.model("m").versions["3"].state.value == "failed"


def test_a_misspelt_engine_path_says_the_configured_file_is_missing_and_where_it_looked(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "m", 1, offset=1)
    models = '[[models]]\nname = "m"\nversion = "1"\nengine = "m/1/modle.onnx"\n'
    with running(tmp_path, root, models) as server:
        mv = server.registry.model("m").versions["1"]
        assert mv.state.value == "failed"
        assert f"configured engine {root}/m/1/modle.onnx is missing: looked in {root}/m/1; it holds model.onnx" \
            in mv.reason
        detected = next(e for e in server.events.recent(1000) if e.kind == "detected" and e.model == "m")
        assert detected.detail["ignored"] == (f"the configuration names engine {root}/m/1/modle.onnx for this "
                                              f"version, which is missing")
