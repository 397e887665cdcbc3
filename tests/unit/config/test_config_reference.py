"""Each setting is declared once (daemon/config/settings.py), and what lists settings reads that declaration:
the reference in docs/configuration.md, the reload planner, `ctl set` and the state file."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest

from infermux import config as cfg
from infermux.admin import commands
from infermux.config import reference
from infermux.config.declare import APPLIES, LIVE, RELOAD, read_table, required, setting
from infermux.config.kinds import INT, NAME, NUMBER, TABLE
from infermux.config.settings import Section
from infermux.models import overrides
from infermux.swap import reload
from support.harness import REPO

FILE = Path("/etc/infermux/test.toml")
MODEL = '[[models]]\nname = "a"\nengine = "a.onnx"\n'
SECTIONS = [pytest.param(s, id=s.name) for s in cfg.SECTIONS]


def test_the_committed_reference_is_what_the_declarations_generate() -> None:
    committed = (REPO / "docs/configuration.md").read_text()
    assert committed == reference.markdown(), f"docs/configuration.md is out of date: run `{reference.COMMAND}`"


@pytest.mark.parametrize("section", SECTIONS)
def test_every_key_of_a_section_is_declared_with_a_line_of_documentation(section: Section) -> None:
    declared = cfg.settings_of(section.settings)
    assert [f.name for f in fields(section.settings)] == list(declared)
    for key, s in declared.items():
        assert s.doc and "\n" not in s.doc, key
        assert s.applies in APPLIES, key
        assert f"`{key}`" in reference.markdown()


@pytest.mark.parametrize("section", SECTIONS)
def test_every_default_is_a_value_its_own_declaration_allows(section: Section) -> None:
    for key, s in cfg.settings_of(section.settings).items():
        if s.default is not None and not s.required and not s.unset:
            assert s.problem(s.default) is None, (key, s.problem(s.default))


def test_a_bound_declared_once_holds_in_the_file_and_for_ctl_set_alike() -> None:
    for key, (low, high) in overrides.BOUNDS.items():
        declared = cfg.settings_of(cfg.ModelConfig)[key]
        assert (declared.low, declared.high) == (low, high)
        for bad in (low - 1, high + 1):
            with pytest.raises(cfg.ConfigError, match=rf'models\[name="a"\]\.{key}: must be [<>]='):
                cfg.parse(MODEL + f"{key} = {bad}\n", FILE)
    assert set(commands.SETTABLE) | {"weight"} == set(overrides.BOUNDS)


def test_ctl_set_and_its_help_name_every_settable_setting() -> None:
    settable = [key for key, s in cfg.settings_of(cfg.ModelConfig).items() if s.settable]
    assert set(overrides.FIELDS) == set(settable)
    help_text = commands.COMMANDS["set"].help
    assert all(key in help_text for key in settable)


def test_the_reload_planner_reads_when_each_change_applies() -> None:
    old = cfg.parse(MODEL, FILE)
    declared = cfg.settings_of(cfg.ModelConfig)
    loaded_anew = replace(old, models=(replace(old.models[0], nice=3),))
    in_place = replace(old, models=(replace(old.models[0], max_queue=3),))
    assert declared["nice"].applies == cfg.RELOAD and reload.plan(old, loaded_anew).reloaded
    assert declared["max_queue"].applies == cfg.LIVE and reload.plan(old, in_place).changed
    for key, s in cfg.settings_of(cfg.DaemonConfig).items():
        if s.applies == cfg.RESTART:
            assert key in reload.RESTART_FIELDS
    restarted = replace(old, daemon=replace(old.daemon, metrics_port=9100))
    assert reload.plan(old, restarted).restart_needed == ["daemon.metrics_port"]
    assert all(s.applies == cfg.RESTART for s in cfg.settings_of(cfg.SnapshotConfig).values())
    smaller = replace(old, snapshots=cfg.SnapshotConfig(max_mb=1.0))
    assert reload.plan(old, smaller).restart_needed == ["snapshots.max_mb"]


def test_the_reload_planner_restarts_a_camera_whose_camera_setting_changed_and_no_other() -> None:
    head = MODEL + '[[pipelines]]\nname = "p"\n[[pipelines.steps]]\nmodel = "a"\n'
    cams = '[[cameras]]\nname = "{}"\nurl = "a.mp4"\npipeline = "p"\n'
    old = cfg.parse(head + cams.format("x") + cams.format("y"), FILE)
    declared = cfg.settings_of(cfg.CameraConfig)
    assert declared["fps"].applies == cfg.CAMERA and declared["enabled"].applies == cfg.LIVE
    assert all(s.applies == cfg.CAMERA for s in cfg.settings_of(cfg.GateConfig).values())
    x, y = old.cameras
    faster = replace(old, cameras=(x, replace(y, fps=5.0)))
    gated = replace(old, cameras=(replace(x, gate=cfg.GateConfig(delta=30)), y))
    disabled = replace(old, cameras=(replace(x, enabled=False), y))
    assert reload.plan(old, faster).cameras_restarted == ["y"]
    assert reload.plan(old, gated).cameras_restarted == ["x"]
    assert reload.plan(old, disabled).cameras_restarted == []


@dataclass(frozen=True)
class _Gate:
    """A table inside a list entry, as a camera's gate would be."""

    min_score: float = setting(0.5, NUMBER, "a detection below it is dropped", applies=LIVE, low=0, high=1)


@dataclass(frozen=True)
class _Camera:
    """A list section declared as the others are."""

    name: str = required(NAME, "the camera's name", applies=RELOAD)
    fps: int = setting(10, INT, "frames a second", applies=LIVE, low=1, high=120)
    gate: _Gate | None = setting(None, TABLE, "what passes", applies=LIVE, section=_Gate)


@pytest.mark.parametrize("table, message", [
    ({"fps": 10}, "cameras[0].name: is required"),
    ({"name": "door", "fpss": 10}, "cameras[0].fpss: unknown field; did you mean `fps`?"),
    ({"name": "door", "fps": 0}, "cameras[0].fps: must be >= 1, got 0"),
    ({"name": "door", "gate": {"min_scor": 0.2}}, "cameras[0].gate.min_scor: unknown field; did you mean `min_score`?"),
    ({"name": "door", "gate": {"min_score": 2}}, "cameras[0].gate.min_score: must be between 0 and 1, got 2.0"),
])
def test_a_new_list_section_with_a_nested_table_is_checked_from_its_declarations(table: dict, message: str) -> None:
    with pytest.raises(cfg.ConfigError) as info:
        read_table(FILE, "cameras[0]", table, _Camera)
    assert str(info.value).startswith(f"{FILE}: {message}")
    assert read_table(FILE, "cameras[0]", {"name": "door", "gate": {"min_score": 1}}, _Camera) == {
        "name": "door", "gate": {"min_score": 1.0}}
    shown = reference.section_text(Section("cameras", _Camera, True, "Cameras."))
    assert "## `[[cameras]]`" in shown and "| `fps` | integer | `10` | 1 to 120 | live | frames a second |" in shown


def test_a_sink_setting_restarts_that_sink_and_an_events_setting_rebuilds_its_pipeline() -> None:
    assert all(s.applies == cfg.SINK for s in cfg.settings_of(cfg.SinkConfig).values())
    assert all(s.applies == cfg.RELOAD for s in cfg.settings_of(cfg.LifecycleConfig).values())
    assert cfg.settings_of(cfg.PipelineConfig)["events"].section is cfg.LifecycleConfig
    assert {"sinks", "pipelines.events"} <= {s.name for s in cfg.SECTIONS}
