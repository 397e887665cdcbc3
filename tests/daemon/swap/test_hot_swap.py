"""Hot swap end to end: real files in a real watched folder, a real daemon (docs/hot-swap.md)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from support import models
from support.harness import Daemon, Value
from support.polling import eventually
from infermux.client import Reply
from support.publish import PROBE, publish, wait_served, watching, write_atomically, write_slowly

X = PROBE  # what wait_served sends too

def head(root: Path, mismatch: str = "reject", **settings: Value) -> str:
    """A daemon serving what is published under `root` (watched closely) with `settings`; a request for a
    version it lacks answered as `mismatch` says."""
    return watching(root, **settings) + f'\n[routing]\nversion_mismatch = "{mismatch}"\n'


@pytest.fixture
def start(tmp_path: Path, root: Path) -> Iterator[Callable[..., Daemon]]:
    """Start a daemon watching `root`; stopped (and checked to stop cleanly) after the test."""
    started: list[Daemon] = []

    def run(models_toml: str = "", mismatch: str = "reject", settle_s: float = 0.4) -> Daemon:
        workdir = tmp_path / f"daemon{len(started)}"
        workdir.mkdir()
        daemon = Daemon(workdir, head(root, mismatch, watch_settle_s=settle_s) + models_toml)
        started.append(daemon)
        return daemon.start()

    yield run
    for daemon in started:
        assert daemon.stop() == 0, daemon.log()


def ask(daemon: Daemon, model: str, version: str | None = None) -> Reply:
    with daemon.client() as client:
        return client.infer(model, {"x": X}, version=version)


def events(daemon: Daemon, model: str, version: str) -> list[str]:
    """The kinds of event the daemon logged for one version, in order."""
    tag = f" model={model} version={version}"
    kinds = []
    for line in daemon.log().splitlines():
        if "infermux.events:" in line and (tag + " ") in line + " ":
            kinds.append(line.split("infermux.events: ", 1)[1].split(" ", 1)[0])
    return kinds


def test_models_in_engine_dir_are_served_without_config(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    publish(root, "other", "2.1", offset=7)
    daemon = start()
    assert ask(daemon, "m").version == "1"
    reply = ask(daemon, "other")
    assert (reply.status, reply.version) == (200, "2.1")
    np.testing.assert_array_equal(reply.outputs["y"], X + 7)


def test_new_version_is_loaded_beside_then_takes_over(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start()
    publish(root, "m", 2, offset=2)
    wait_served(daemon, "m", "2", offset=2)
    daemon.wait_for("unloaded model=m version=1", 5)
    assert events(daemon, "m", "2") == ["detected", "loading", "warming", "loaded", "swapped"]
    assert events(daemon, "m", "1")[-2:] == ["draining", "unloaded"]
    assert ask(daemon, "m", "1").status == 404  # superseded under latest_n = 1, reject mismatches


def test_engine_replaced_in_place_serves_the_new_file(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start()
    publish(root, "m", 1, offset=5)
    wait_served(daemon, "m", "1", offset=5)
    daemon.wait_for("unloaded model=m version=1", 5)
    assert 'swapped model=m version=1 previous="1 (previous file)"' in daemon.log()


def test_a_file_written_slowly_is_not_loaded_before_it_is_complete(root: Path,
                                                                    start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    # A settle window far above the writer's pauses, so a busy 2-core box cannot stretch a pause past it.
    daemon = start(settle_s=1.5)
    data = models.add_one(root / ".build" / "model.onnx", offset=2).read_bytes()
    # Pauses (0.15 s) shorter than watch_settle_s (1.5 s): the file keeps changing, so it must wait.
    write_slowly(root / "m" / "2" / "model.onnx", data, steps=6, pause_s=0.15)
    assert "model=m version=2" not in daemon.log()  # neither detected (complete) nor loaded
    assert ask(daemon, "m").version == "1"
    wait_served(daemon, "m", "2", offset=2)
    log = daemon.log()
    assert log.count("loading model=m version=2") == 1 and "failed" not in log, log


def test_corrupt_engine_keeps_the_old_version_and_the_next_good_file_wins(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start()
    # The serving file overwritten with garbage: the engine loaded from it keeps serving.
    write_atomically(root / "m" / "1" / "model.onnx", b"garbage")
    daemon.wait_for("failed model=m version=1", 10)
    reply = ask(daemon, "m")
    assert reply.version == "1"
    np.testing.assert_array_equal(reply.outputs["y"], X + 1)
    # The registry logs the failed load before the swapper records the rejection on the serving
    # version (swapper.py), so the status may lag the log by a moment (a fresh-clone CI run saw it).
    def with_reason() -> dict | None:
        with daemon.admin() as admin:
            (state,) = [m for m in admin.call("status")["models"] if m["name"] == "m"]
        return state if state["reason"] else None

    state = eventually(with_reason, "the serving version to show the rejection", 10, interval_s=0.05)
    assert state["state"] == "ready" and "new engine file rejected (load failed" in state["reason"]
    # A new version that does not load: the old one keeps serving, the new one shows why.
    write_atomically(root / "m" / "2" / "model.onnx", b"\x08\x07 this is not an onnx model" * 50)
    daemon.wait_for("failed model=m version=2", 10)
    assert ask(daemon, "m").version == "1"
    named = ask(daemon, "m", "2")
    assert named.status == 503 and "failed" in named.error and "load failed" in named.error
    # The watcher did not freeze: a good file for version 2 is taken.
    publish(root, "m", 2, offset=2)
    wait_served(daemon, "m", "2", offset=2)


def test_checksum_mismatch_keeps_the_old_version(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1, checksum="good")
    daemon = start()
    assert ask(daemon, "m").version == "1"
    final = publish(root, "m", 2, offset=2, checksum="bad")
    daemon.wait_for("failed model=m version=2", 10)
    assert "checksum failed" in daemon.log()
    assert ask(daemon, "m").version == "1"
    # Publishing the right checksum is a change too: the same engine file is tried again.
    import hashlib
    digest = hashlib.sha256(final.read_bytes()).hexdigest()
    write_atomically(final.with_name("model.onnx.sha256"), f"{digest}  model.onnx\n".encode())
    wait_served(daemon, "m", "2", offset=2)


def test_removed_version_and_removed_model_drain_and_unload(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    publish(root, "m", 2, offset=2)
    write_atomically(root / "m" / "model.toml", b'version_policy = "all"\n')
    daemon = start()
    assert ask(daemon, "m", "1").version == "1" and ask(daemon, "m").version == "2"
    shutil.rmtree(root / "m" / "2")
    daemon.wait_for("unloaded model=m version=2", 10)
    assert ask(daemon, "m", "2").status == 404
    wait_served(daemon, "m", "1", offset=1)
    shutil.rmtree(root / "m")
    daemon.wait_for("unloaded model=m version=1", 10)
    gone = ask(daemon, "m")
    assert gone.status == 404 and "unknown model 'm'" in gone.error


def test_version_policies(root: Path, start: Callable[..., Daemon]) -> None:
    for model in ("latest2", "every", "chosen"):
        for version in (1, 2, 3):
            publish(root, model, version, offset=version)
    write_atomically(root / "latest2" / "model.toml", b'version_policy = "latest"\nlatest_n = 2\n')
    write_atomically(root / "every" / "model.toml", b'version_policy = "all"\n')
    write_atomically(root / "chosen" / "model.toml", b'version_policy = "specific"\nversions = ["1", 3]\n')
    daemon = start()

    def served_versions(model: str) -> set[str]:
        return {v for v in ("1", "2", "3", "4") if ask(daemon, model, v).status == 200}

    assert served_versions("latest2") == {"2", "3"}
    assert served_versions("every") == {"1", "2", "3"}
    assert served_versions("chosen") == {"1", "3"}
    publish(root, "latest2", 4, offset=4)
    wait_served(daemon, "latest2", "4", offset=4)
    daemon.wait_for("unloaded model=latest2 version=2", 10)
    assert served_versions("latest2") == {"3", "4"}
    # Editing model.toml changes the policy live.
    write_atomically(root / "chosen" / "model.toml", b'version_policy = "specific"\nversions = ["2"]\n')
    daemon.wait_for("unloaded model=chosen version=3", 10)
    assert served_versions("chosen") == {"2"}


def test_discovered_version_of_a_configured_model_inherits_its_settings(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "cfg", 1, offset=1)
    daemon = start('[[models]]\nname = "cfg"\nversion = "1"\nengine = "cfg/1/model.onnx"\ncontexts = 2\n')
    publish(root, "cfg", 2, offset=2)
    wait_served(daemon, "cfg", "2", offset=2)
    loaded = [line for line in daemon.log().splitlines() if "events: loaded model=cfg version=2" in line]
    assert loaded and "contexts=2" in loaded[0]
    assert ask(daemon, "cfg", "1").status == 200  # a configured version stays while its file does
    shutil.rmtree(root / "cfg" / "1")
    daemon.wait_for("unloaded model=cfg version=1", 10)
    gone = ask(daemon, "cfg", "1")
    assert gone.status == 503 and "engine file removed" in gone.error  # still known: it is configured
    publish(root, "cfg", 1, offset=1)  # back: loaded again (beside 2, which stays the default)
    eventually(lambda: ask(daemon, "cfg", "1").status == 200, "cfg version 1 served again", 10)
    assert ask(daemon, "cfg").version == "2"


def test_editing_model_toml_reloads_the_served_version_with_the_new_settings(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start()
    write_atomically(root / "m" / "model.toml", b"contexts = 2\n")
    daemon.wait_for('swapped model=m version=1 previous="1 (previous file)"', 10)
    loads = [line for line in daemon.log().splitlines() if "events: loaded model=m version=1" in line]
    assert [("contexts=2" in line) for line in loads] == [False, True]
    assert ask(daemon, "m").version == "1"


def test_broken_model_toml_is_reported_and_changes_nothing(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start()
    write_atomically(root / "m" / "model.toml", b"contexts = 0\n")
    daemon.wait_for("failed model=m reason=", 10)
    assert "contexts: must be >= 1" in daemon.log()
    publish(root, "m", 2, offset=2)  # not taken while the settings are broken
    time.sleep(1.0)
    assert ask(daemon, "m").version == "1"
    write_atomically(root / "m" / "model.toml", b"contexts = 2\n")
    wait_served(daemon, "m", "2", offset=2)


def test_watch_false_serves_only_the_configuration(root: Path, tmp_path: Path) -> None:
    publish(root, "m", 1, offset=1)
    publish(root, "cfg", 1, offset=3)
    daemon = Daemon(tmp_path, head(root, watch=False) + '[[models]]\nname = "cfg"\nengine = "cfg/1/model.onnx"\n').start()
    try:
        assert ask(daemon, "cfg").status == 200
        assert ask(daemon, "m").status == 404
    finally:
        assert daemon.stop() == 0


def test_files_present_at_start_are_loaded_before_ready(root: Path, start: Callable[..., Daemon]) -> None:
    for version in (1, 2):
        path = publish(root, "m", version, offset=version)
        old = time.time() - 3600
        os.utime(path, (old, old))
    daemon = start()
    log = daemon.log()
    assert log.index("loaded model=m version=2") < log.index(" ready ")
    assert "loading model=m version=1" not in log  # latest_n = 1: the older one is not even loaded
    assert 'detected model=m version=1 file=model.onnx bytes=88 ignored="outside version_policy"' in log


def test_rollback_through_the_admin_socket(root: Path, start: Callable[..., Daemon]) -> None:
    """`infermux ctl pin m 1` after a bad release: the old file is loaded again and holds."""
    publish(root, "m", 1, offset=1)
    daemon = start()
    publish(root, "m", 2, offset=2)
    wait_served(daemon, "m", "2", offset=2)
    with daemon.admin() as admin:
        assert admin.call("pin", model="m", version="1")["version"] == "1"  # only on disk now
        wait_served(daemon, "m", "1", offset=1)
        publish(root, "m", 3, offset=3)
        daemon.wait_for("detected model=m version=3", 10)
        assert 'ignored="pinned to 1"' in daemon.log() and ask(daemon, "m").version == "1"
        refused = admin.call("pin", check=False, model="m", version="9")
        assert not refused["ok"] and "has no version '9'" in refused["error"]
        admin.call("unpin", model="m")
        wait_served(daemon, "m", "3", offset=3)


def test_the_shell_commands_of_docs_hot_swap_work(root: Path, start: Callable[..., Daemon],
                                                   tmp_path: Path) -> None:
    """docs/hot-swap.md's publish, in-place-with-checksum and remove commands (onnx for plan)."""
    build = tmp_path / "build"
    models.add_one(build / "m3.onnx", offset=3)
    models.add_one(build / "m3-fixed.onnx", offset=30)
    publish(root, "det", 2, offset=2)
    daemon = start()

    def sh(script: str) -> None:
        import subprocess
        subprocess.run(["bash", "-euo", "pipefail", "-c", f"cd {root}\n{script}"], check=True)

    sh(f"""mkdir det/.3
cp {build}/m3.onnx det/.3/model.onnx
(cd det/.3 && sha256sum model.onnx > model.onnx.sha256)
mv -T det/.3 det/3""")
    wait_served(daemon, "det", "3", offset=3)
    sh(f"""cp {build}/m3-fixed.onnx det/3/.model.onnx.tmp
(cd det/3 && sha256sum .model.onnx.tmp | sed 's/\\.model\\.onnx\\.tmp/model.onnx/' > .model.onnx.sha256.tmp)
mv det/3/.model.onnx.sha256.tmp det/3/model.onnx.sha256 && mv det/3/.model.onnx.tmp det/3/model.onnx""")
    wait_served(daemon, "det", "3", offset=30)
    assert "failed" not in daemon.log()  # both renames were seen together
    sh("rm -r det/3")
    wait_served(daemon, "det", "2", offset=2)  # the policy falls back to the newest left
    sh("rm -r det")
    eventually(lambda: ask(daemon, "det").status == 404, "det unknown once its folder is gone", 10)
