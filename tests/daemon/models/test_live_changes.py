"""Operators' live changes have memory: they hold across reloads, new versions and restarts until
the file changes the same field or `ctl reset` (docs/architecture.md#live-changes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from support.chaos import WATCHED  # a daemon watching an engine folder
from support.harness import Daemon
from support.polling import eventually
from support.publish import PROBE, publish, wait_served

X4 = np.ones((1, 4), np.float32)

# Two versions under weighted routing, and a stand-in with the same inputs for a live fallback.
WEIGHTED = """
[[models]]
name = "addone"
version = "1"
engine = "addone/1/model.onnx"
strategy = "weighted"
[[models]]
name = "addone"
version = "2"
engine = "addone/2/model.onnx"
strategy = "weighted"
[[models]]
name = "stand"
engine = "addone/1/model.onnx"
"""


def rows(d: Daemon) -> dict[tuple[str, str], dict]:
    with d.admin() as admin:
        return {(m["name"], m["version"]): m for m in admin.call("models")["models"]}


def versions_served(d: Daemon, n: int = 200) -> Counter:
    """The versions of addone that answered `n` pipelined requests. On a busy box a full queue sends
    some to addone's live fallback `stand` (whose own version is "1" too): those are checked to be
    stand-ins, and left out, so that the count says where routing sent the rest."""
    with d.pipeline() as pipe:
        replies = pipe.gather([pipe.submit("addone", {"x": X4}) for _ in range(n)])
    assert all(r.status == 200 for r in replies), [r.status for r in replies if r.status != 200][:3]
    stand_ins = [r for r in replies if r.fallback]
    assert all(r.model == "stand" and r.fallback["reason"] in ("queue_full", "deadline") for r in stand_ins), \
        [r.header for r in stand_ins][:2]
    assert len(stand_ins) < n, "every request went to the fallback: the box was too busy to route any"
    return Counter(r.version for r in replies if not r.fallback)


def events(d: Daemon, kind: str) -> list[dict]:
    with d.admin() as admin:
        return [e for e in admin.call("events", limit=1000)["events"] if e["kind"] == kind]


def ctl(d: Daemon, *words: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infermux", "ctl", *words, "--admin", d.admin_endpoint],
                          capture_output=True, text=True, timeout=60)


def test_a_reload_of_the_unchanged_file_keeps_live_weights_and_fallback(make_daemon) -> None:
    d = make_daemon(WEIGHTED)
    with d.admin() as admin:
        admin.call("set", model="addone", weights={"1": 100, "2": 0}, fallback="stand")
        changes = admin.call("reload")["changes"]
    assert not any(changes.values()), changes  # nothing changed, and nothing did
    after = rows(d)
    assert (after[("addone", "1")]["weight"], after[("addone", "2")]["weight"]) == (100, 0)
    assert after[("addone", "1")]["fallback"] == "stand"
    assert after[("addone", "1")]["overrides"] == {"weight": {"live": 100, "file": 0},
                                                   "fallback": {"live": "stand", "file": ""}}
    assert versions_served(d).keys() == {"1"}  # the canary held at 0 % stays so
    with d.admin() as admin:  # and SIGHUP is the same reload
        admin.call("set", model="addone", weights={"1": 0, "2": 100})
    since = len(d.log())
    d.signal(signal.SIGHUP)
    d.wait_for("reloaded", since=since)
    assert versions_served(d).keys() == {"2"}


def test_the_file_wins_for_a_field_it_changed_and_the_reply_and_an_event_say_so(make_daemon) -> None:
    d = make_daemon(WEIGHTED)
    with d.admin() as admin:
        admin.call("set", model="addone", weights={"1": 90, "2": 10})
        admin.call("set", model="addone", version="1", contexts=2)
    d.config_path.write_text(d.config_path.read_text().replace(
        'engine = "addone/1/model.onnx"\nstrategy = "weighted"', 'engine = "addone/1/model.onnx"\nstrategy = "weighted"'
        '\nweight = 50', 1))
    with d.admin() as admin:
        changes = admin.call("reload")["changes"]
    assert changes["overrides_dropped"] == ["addone:1 weight live 90 -> 50 (the file changed it)"]
    assert changes["changed"] == ["addone:1 ['weight']"]
    after = rows(d)
    assert after[("addone", "1")]["weight"] == 50 and after[("addone", "2")]["weight"] == 10  # v2's still live
    assert after[("addone", "1")]["contexts"] == 2  # the file did not change contexts: the live 2 holds
    assert after[("addone", "1")]["overrides"] == {"contexts": {"live": 2, "file": 1}}
    dropped = events(d, "override_dropped")
    assert [(e["version"], e["field"], e["live"], e["file"]) for e in dropped] == [("1", "weight", "90", "50")]


def test_ctl_reset_gives_the_files_values_back_and_ctl_models_marks_overrides(make_daemon) -> None:
    d = make_daemon(WEIGHTED)
    with d.admin() as admin:
        admin.call("set", model="addone", weights={"1": 100, "2": 0})
        admin.call("set", model="addone", version="2", timeout_ms=1500)
    listing = ctl(d, "models")
    assert listing.returncode == 0, listing.stderr
    assert "live: weight=100 (file 0)" in listing.stdout and "live: timeout_ms=1500 (file 1000)" in listing.stdout
    status = subprocess.run([sys.executable, "-m", "infermux", "status", "--admin", d.admin_endpoint],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "weight=100 (file 0)" in status.stdout, status.stdout + status.stderr
    reset = ctl(d, "reset", "addone", "weights")
    assert reset.returncode == 0, reset.stderr
    after = rows(d)
    assert after[("addone", "1")]["overrides"] == {} and after[("addone", "1")]["weight"] == 0
    assert after[("addone", "2")]["overrides"] == {"timeout_ms": {"live": 1500, "file": 1000}}
    assert ctl(d, "reset", "addone").returncode == 0
    assert rows(d)[("addone", "2")]["timeout_ms"] == 1000 and rows(d)[("addone", "2")]["overrides"] == {}
    refused = ctl(d, "reset", "addone", "colour")
    assert refused.returncode == 1 and "cannot reset 'colour'" in refused.stderr


def test_live_changes_survive_a_restart_until_the_file_changes_the_field(make_daemon) -> None:
    d = make_daemon(WEIGHTED)
    with d.admin() as admin:
        admin.call("set", model="addone", weights={"1": 100, "2": 0}, fallback="stand")
        admin.call("set", model="addone", version="2", contexts=3)
    saved = json.loads((d.state_dir / "overrides.json").read_text())
    assert {(e["version"], e["field"]) for e in saved["overrides"]} == {  # version 2's weight 0 is the file's
        ("1", "weight"), ("", "fallback"), ("2", "contexts")}
    assert d.stop() == 0
    d.start()
    after = rows(d)
    assert after[("addone", "2")]["contexts"] == 3 and after[("addone", "1")]["fallback"] == "stand"
    assert "restored 3 live change(s)" in d.log() and "addone:2 contexts=3" in d.log()
    assert versions_served(d).keys() == {"1"}
    assert d.stop() == 0
    d.config_path.write_text(d.config_path.read_text().replace('version = "2"\n', 'version = "2"\ncontexts = 2\n', 1))
    d.start()  # the file changed contexts of version 2 while the daemon was stopped: the file wins there
    after = rows(d)
    assert after[("addone", "2")]["contexts"] == 2 and "contexts" not in after[("addone", "2")]["overrides"]
    assert after[("addone", "1")]["weight"] == 100
    assert "override_dropped" in d.log() and "live=3 file=2" in d.log()


def test_an_unreadable_state_file_is_set_aside_and_the_daemon_starts(make_daemon, tmp_path: Path) -> None:
    d = make_daemon(WEIGHTED)
    with d.admin() as admin:
        admin.call("set", model="addone", version="2", contexts=3)
    assert d.stop() == 0
    state = d.state_dir / "overrides.json"
    state.write_text('{"format": 1, "overrides": [{"model": "addone"')  # cut off mid-write
    d.start()
    assert rows(d)[("addone", "2")]["contexts"] == 1  # the file's settings serve
    aside = list(d.state_dir.glob("overrides.json.unreadable-*"))
    assert len(aside) == 1 and aside[0].read_text().startswith('{"format": 1')
    assert not state.exists()
    assert "state_set_aside" in d.log() and "cannot be read" in d.log()
    with d.admin() as admin:  # and the next live change is saved again
        admin.call("set", model="addone", version="2", contexts=2)
    assert json.loads(state.read_text())["overrides"][0]["live"] == 2


def test_a_state_file_value_over_a_live_sets_bounds_is_set_aside_and_the_daemon_serves(make_daemon) -> None:
    d = make_daemon(WEIGHTED)
    assert d.stop() == 0
    huge = {"model": "addone", "version": "2", "field": "contexts", "live": 100_000, "file": 1}
    weight = {"model": "addone", "version": "1", "field": "weight", "live": 10**400, "file": 0}
    (d.state_dir / "overrides.json").write_text(json.dumps({"format": 1, "overrides": [huge, weight]}))
    d.start()
    assert rows(d)[("addone", "2")]["contexts"] == 1  # the file's settings serve; no 100,000 threads
    # no live fallback here (the state file that would name one was set aside): fewer requests than
    # max_queue, so that a slow box cannot fill a queue and answer 429
    assert sum(versions_served(d, n=32).values()) > 0
    assert list(d.state_dir.glob("overrides.json.unreadable-*")) and "contexts must be an integer 1..1024" in d.log()


def test_a_second_daemon_given_the_same_state_directory_is_refused(make_daemon, tmp_path: Path) -> None:
    first = make_daemon(WEIGHTED)
    with first.admin() as admin:
        admin.call("set", model="addone", version="2", contexts=2)
    run = subprocess.run([sys.executable, "-m", "infermux", "serve", "--config", str(first.config_path),
                          "--runtime-dir", str(tmp_path / "other-run"), "--state-dir", str(first.state_dir)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 4 and "Traceback" not in run.stderr, run.stderr
    assert f"already serves the state directory {first.state_dir}" in run.stderr and "--state-dir" in run.stderr
    assert json.loads((first.state_dir / "overrides.json").read_text())["overrides"][0]["live"] == 2
    assert rows(first)[("addone", "2")]["contexts"] == 2


def test_a_state_directory_every_user_may_write_is_refused_with_one_line(make_daemon, tmp_path: Path) -> None:
    d = make_daemon(WEIGHTED)
    assert d.stop() == 0
    d.state_dir.chmod(0o777)
    run = subprocess.run([sys.executable, "-m", "infermux", "serve", "--config", str(d.config_path),
                          "--runtime-dir", str(d.run_dir), "--state-dir", str(d.state_dir)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("infermux:")]
    assert f"state directory {d.state_dir} is writable by every user (mode 777)" in line, line
    assert not list(d.run_dir.glob("*.sock"))  # nothing was bound


# -- new versions ---------------------------------------------------------------------------------

@pytest.fixture
def watched(tmp_path: Path) -> Path:
    root = tmp_path / "engines"
    root.mkdir()
    return root


def start_watching(tmp_path: Path, root: Path, models_toml: str = "") -> Daemon:
    workdir = tmp_path / "daemon"
    workdir.mkdir()
    return Daemon(workdir, WATCHED.format(root=root) + models_toml).start()


def test_a_new_version_takes_the_live_settings_of_the_one_it_supersedes(tmp_path: Path, watched: Path) -> None:
    publish(watched, "det", 1, offset=1.0)
    publish(watched, "stand", 1, offset=5.0)
    d = start_watching(tmp_path, watched)
    try:
        with d.admin() as admin:
            admin.call("set", model="det", contexts=3, timeout_ms=2500, max_batch=4, batch_delay_us=100,
                       fallback="stand")
        publish(watched, "det", 2, offset=2.0)
        wait_served(d, "det", "2", 2.0)
        new = rows(d)[("det", "2")]
        assert (new["contexts"], new["timeout_ms"], new["max_batch"], new["batch_delay_us"], new["fallback"]) == \
            (3, 2500, 4, 100, "stand")
        assert new["overrides"]["contexts"] == {"live": 3, "file": 1}
        inherited = events(d, "inherited")
        assert inherited and inherited[-1]["version"] == "2" and inherited[-1]["from"] == "1"
        assert inherited[-1]["contexts"] == 3
    finally:
        assert d.stop() == 0, d.log()


def test_under_weighted_a_new_version_takes_the_superseded_weight_and_says_so(tmp_path: Path, watched: Path) -> None:
    for version in (1, 2):
        publish(watched, "det", version, offset=float(version))
    configured = "".join(f'[[models]]\nname = "det"\nversion = "{v}"\nengine = "det/{v}/model.onnx"\n'
                         f'strategy = "weighted"\n' for v in (1, 2))
    d = start_watching(tmp_path, watched, configured)
    try:
        with d.admin() as admin:
            admin.call("set", model="det", weights={"1": 90, "2": 10})
        publish(watched, "det", 3, offset=3.0)  # found in engine_dir: takes version 2's weight, 10
        eventually(lambda: rows(d).get(("det", "3"), {}).get("state") == "ready", "version 3 ready", 30)
        assert [rows(d)[("det", v)]["weight"] for v in "123"] == [90, 10, 10]
        swapped = eventually(lambda: [e for e in events(d, "swapped") if e["version"] == "3"], "swapped event")
        assert swapped[-1]["weight"] == 10 and swapped[-1]["share"] == "9%"
        with d.pipeline() as pipe:
            replies = pipe.gather([pipe.submit("det", {"x": PROBE}) for _ in range(400)])
        assert Counter(r.version for r in replies)["3"] > 0  # 9 %: none in 400 would be p < 1e-16
    finally:
        assert d.stop() == 0, d.log()


def test_canary_weight_is_what_a_new_version_gets_under_weighted(tmp_path: Path, watched: Path) -> None:
    publish(watched, "det", 1, offset=1.0)
    configured = ('[[models]]\nname = "det"\nversion = "1"\nengine = "det/1/model.onnx"\nstrategy = "weighted"\n'
                  'weight = 95\ncanary_weight = 5\n')
    d = start_watching(tmp_path, watched, configured)
    try:
        publish(watched, "det", 2, offset=2.0)
        eventually(lambda: rows(d).get(("det", "2"), {}).get("state") == "ready", "version 2 ready", 30)
        new = rows(d)[("det", "2")]
        assert new["weight"] == 5 and new["overrides"]["weight"] == {"live": 5, "file": 0}
        assert rows(d)[("det", "1")]["weight"] == 95
    finally:
        assert d.stop() == 0, d.log()


def test_a_reload_that_changes_a_watched_versions_settings_loads_its_engine_no_second_time(
        tmp_path: Path, watched: Path) -> None:
    publish(watched, "det", 1, offset=1.0)
    d = start_watching(tmp_path, watched, '[[models]]\nname = "det"\nversion = "1"\nengine = "det/1/model.onnx"\n')
    try:
        with d.admin() as admin:
            admin.call("set", model="det", contexts=2)
        d.config_path.write_text(d.config_path.read_text() + "timeout_ms = 2000\n")
        with d.admin() as admin:
            assert admin.call("reload")["changes"]["changed"] == ["det:1 ['timeout_ms']"]
            loads = len([e for e in admin.call("events", limit=1000)["events"] if e["kind"] == "loading"])
        publish(watched, "later", 1, offset=3.0)  # the swap's pass after the reload is done once this serves
        wait_served(d, "later", "1", 3.0)
        loaded = [e for e in events(d, "loading")][loads:]
        assert [(e["model"], e["version"]) for e in loaded] == [("later", "1")]
        row = rows(d)[("det", "1")]
        assert (row["contexts"], row["timeout_ms"]) == (2, 2000)
    finally:
        assert d.stop() == 0, d.log()


def test_the_file_wins_for_a_field_it_changed_on_a_version_found_in_engine_dir_too(
        tmp_path: Path, watched: Path) -> None:
    """A version found in engine_dir takes its settings from the model's entry in the file: when the
    reload changes that entry's field, the file wins there too, and the reply names the dropped change."""
    for version in (1, 2):
        publish(watched, "det", version, offset=float(version))
    d = start_watching(tmp_path, watched, '[[models]]\nname = "det"\nversion = "1"\nengine = "det/1/model.onnx"\n'
                                          'default = true\n')
    try:
        eventually(lambda: rows(d).get(("det", "2"), {}).get("state") == "ready", "version 2 found and ready", 30)
        with d.admin() as admin:
            admin.call("set", model="det", version="2", contexts=3)
        assert rows(d)[("det", "2")]["contexts"] == 3
        d.config_path.write_text(d.config_path.read_text() + "contexts = 2\n")
        with d.admin() as admin:
            changes = admin.call("reload")["changes"]
        assert "det:2 contexts live 3 -> 2 (the file changed it)" in changes["overrides_dropped"], changes
        eventually(lambda: rows(d)[("det", "2")]["contexts"] == 2, "the file's contexts on version 2", 30)
        assert "contexts" not in rows(d)[("det", "2")].get("overrides", {})
        dropped = [(e["version"], e["field"]) for e in events(d, "override_dropped")]
        assert ("2", "contexts") in dropped, dropped
    finally:
        assert d.stop() == 0, d.log()
