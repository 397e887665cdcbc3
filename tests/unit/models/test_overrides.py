"""The rule for live changes (models/overrides.py) and the state file that keeps them (models/statefile.py)."""

from __future__ import annotations

import json
import os
import stat
import threading
from dataclasses import replace
from pathlib import Path

from infermux import config as cfg
from infermux.config import ModelConfig
from infermux.events import EventLog
from infermux.models.overrides import Override, Overrides
from infermux.models.statefile import StateFile, state_dir

V1 = ModelConfig(name="det", engine=Path("det/1/model.onnx"), version="1")


def config_of(*models: ModelConfig) -> cfg.Config:
    return cfg.Config(Path("t.toml"), cfg.DaemonConfig(), cfg.RoutingConfig(), models=tuple(models))


def kinds(events: EventLog) -> list[str]:
    return [e.kind for e in events.recent(100)]


def test_a_change_remembers_the_files_value_from_the_first_change_and_undoing_it_leaves_none() -> None:
    o = Overrides(EventLog())
    o.set("det", "1", "contexts", 3, 1)
    o.set("det", "1", "contexts", 4, 3)  # the file still says 1
    assert o.of("det", "1")["contexts"] == Override("det", "1", "contexts", 4, 1)
    o.set("det", "1", "contexts", 1, 4)
    assert o.of("det", "1") == {}


def test_the_file_wins_only_for_a_field_it_changed() -> None:
    events = EventLog()
    o = Overrides(events)
    o.set("det", "1", "contexts", 3, 1)
    o.set("det", "1", "timeout_ms", 50, 1000)
    o.follow(config_of(replace(V1, contexts=2)))
    assert set(o.of("det", "1")) == {"timeout_ms"}
    dropped = o.take_dropped()
    assert [d.summary() for d in dropped] == ["det:1 contexts live 3 -> 2 (the file changed it)"]
    assert "override_dropped" in kinds(events)
    assert o.apply(replace(V1, contexts=2)).timeout_ms == 50


def test_a_live_fallback_the_new_file_would_close_into_a_cycle_is_dropped() -> None:
    o = Overrides(EventLog())
    o.set("det", "", "fallback", "cls", "")
    cls = ModelConfig(name="cls", engine=Path("c.onnx"), fallback="det")
    o.follow(config_of(V1, cls))
    assert o.fallbacks({"cls": "det"}) == {"cls": "det"}
    assert "fallback cycle" in o.take_dropped()[0].reason


def test_a_new_version_inherits_the_superseded_versions_settings_and_its_share() -> None:
    o = Overrides(EventLog())
    o.set("det", "1", "contexts", 3, 1)
    o.set("det", "1", "weight", 90, 0)
    v2 = replace(V1, version="2")
    mc, taken = o.inherit(v2, "1", share=10)
    assert (mc.contexts, mc.weight) == (3, 10) and taken == {"contexts": 3, "weight": 10}
    assert o.of("det", "2")["contexts"] == Override("det", "2", "contexts", 3, 1)
    assert o.weights == {"det": {"1": 90, "2": 10}}


def test_the_state_file_round_trips_and_a_broken_one_is_set_aside(tmp_path: Path) -> None:
    events = EventLog()
    store = StateFile(tmp_path, events)
    o = Overrides(events, store.write)
    o.set("det", "1", "preferred_batch", (4, 8), ())
    o.set("det", "", "fallback", "cls", "")
    restored = StateFile(tmp_path, events).read()
    assert {r.key: r.live for r in restored} == {("det", "1", "preferred_batch"): (4, 8),
                                                ("det", "", "fallback"): "cls"}
    (tmp_path / "overrides.json").write_text(json.dumps({"format": 1, "overrides": [{"model": "det"}]}))
    assert StateFile(tmp_path, events).read() == []
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["overrides.json.unreadable"]
    assert "state_set_aside" in kinds(events)


def test_concurrent_changes_leave_the_file_with_the_last_table(tmp_path: Path) -> None:
    store = StateFile(tmp_path, EventLog())
    o = Overrides(EventLog(), store.write)

    def change(version: str) -> None:
        for n in range(2, 30):
            o.set("det", version, "contexts", n, 1)

    threads = [threading.Thread(target=change, args=(str(v),)) for v in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    saved = {(r.version, r.live) for r in StateFile(tmp_path, EventLog()).read()}
    assert saved == {(str(v), 29) for v in range(4)}


def test_the_state_directory_is_the_configured_one_then_systemds(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/a:{tmp_path}/b")
    assert state_dir(cfg.DaemonConfig()) == tmp_path / "a"
    assert state_dir(cfg.DaemonConfig(state_dir=str(tmp_path / "c"))) == tmp_path / "c"


def saved(folder: Path, *entries: object) -> StateFile:
    """A state file holding `entries`, written as a hand (or another program) might have."""
    (folder / "overrides.json").write_text(json.dumps({"format": 1, "overrides": list(entries)}))
    return StateFile(folder, EventLog(), cfg.DaemonConfig())


def entry(field: str, live: object, version: str = "1") -> dict[str, object]:
    return {"model": "det", "version": version, "field": field, "live": live, "file": "" if version == "" else 1}


def test_a_state_file_value_a_live_set_would_refuse_sets_the_whole_file_aside(tmp_path: Path) -> None:
    for bad in [entry("contexts", 100_000), entry("weight", 10**400), entry("queue_policy", "lifo"),
                entry("preferred_batch", list(range(1, 1000))), entry("max_queue", 0),
                entry("fallback", "x" * 10_000, version="")]:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        store = saved(folder, entry("timeout_ms", 500), bad)
        assert store.read() == [], bad
        assert [p.name.split("-")[0] for p in folder.iterdir()] == ["overrides.json.unreadable"], bad
        assert "state_set_aside" in kinds(store.events)


def test_contexts_over_the_daemons_max_contexts_are_refused_as_a_live_set_would_be(tmp_path: Path) -> None:
    store = saved(tmp_path, entry("contexts", 9))
    store.daemon = cfg.DaemonConfig(max_contexts=8)
    assert store.read() == []
    assert "max_contexts" in store.events.recent(1)[0].detail["reason"]


def test_a_deeply_nested_or_huge_state_file_is_set_aside_not_a_failed_start(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "overrides.json").write_text("[" * 100_000 + "]" * 100_000)
    assert StateFile(deep, EventLog()).read() == []
    huge = tmp_path / "huge"
    huge.mkdir()
    with open(huge / "overrides.json", "wb") as out:  # sparse: the size alone refuses it, nothing is read
        out.truncate(1 << 30)
    store = StateFile(huge, EventLog())
    assert store.read() == [] and "over the" in store.events.recent(1)[0].detail["reason"]
    assert not (huge / "overrides.json").exists()


def test_the_state_file_is_never_read_or_written_through_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root's own\n")
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / "overrides.json").symlink_to(secret)
    assert StateFile(folder, EventLog()).read() == []  # a link is not a state file: set aside, not followed
    planted = folder / f".overrides.json.{os.getpid()}.tmp"
    planted.symlink_to(secret)
    store = StateFile(folder, EventLog())
    Overrides(store.events, store.write).set("det", "1", "contexts", 2, 1)
    assert secret.read_text() == "root's own\n"
    state = folder / "overrides.json"
    assert not state.is_symlink() and stat.S_IMODE(state.stat().st_mode) == 0o600
    assert [o.live for o in StateFile(folder, EventLog()).read()] == [2]


def test_restored_changes_are_listed_in_one_event_and_log_line(tmp_path: Path, caplog) -> None:
    store = saved(tmp_path, entry("contexts", 3), entry("fallback", "cls", version=""))
    with caplog.at_level("INFO", logger="infermux.state"):
        assert len(store.read()) == 2
    (event,) = [e for e in store.events.recent(10) if e.kind == "state_restored"]
    assert event.detail["count"] == 2 and sorted(event.detail["changes"]) == ["det fallback=cls", "det:1 contexts=3"]
    assert "restored 2 live change(s)" in caplog.text and "det:1 contexts=3" in caplog.text
