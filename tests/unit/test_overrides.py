"""The rule for live changes (models/overrides.py) and the state file that keeps them (models/statefile.py)."""

from __future__ import annotations

import json
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
