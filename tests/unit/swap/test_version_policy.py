"""Version policy and discovery settings: config fields, model.toml, and which versions are served."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux import config as cfg
from infermux.swap.repository import Policy, SettingsCache, plan
from infermux.swap.watcher import EngineFile, FileSig, Snapshot

FILE = Path("/etc/infermux/test.toml")
MODEL = '[[models]]\nname = "a"\nengine = "a/1/model.onnx"\n'


def error(text: str) -> str:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.parse(text, FILE)
    return str(info.value)


def test_policy_fields_default_to_the_newest_version() -> None:
    m = cfg.parse(MODEL, FILE).models[0]
    assert (m.version_policy, m.latest_n, m.versions) == ("latest", 1, ())
    assert cfg.parse(MODEL, FILE).daemon.watch is True


def test_policy_fields_parse() -> None:
    m = cfg.parse(MODEL + 'version_policy = "specific"\nversions = ["2", 3]\n', FILE).models[0]
    assert (m.version_policy, m.versions) == ("specific", ("2", "3"))
    assert cfg.parse(MODEL + "latest_n = 3\n", FILE).models[0].latest_n == 3


@pytest.mark.parametrize("text, fragment", [
    (MODEL + 'version_policy = "newest"\n', "models[name=\"a\"].version_policy: must be one of latest, all, specific, got 'newest'"),
    (MODEL + "latest_n = 0\n", "models[name=\"a\"].latest_n: must be >= 1, got 0"),
    (MODEL + 'latest_n = "2"\n', "models[name=\"a\"].latest_n: must be int"),
    (MODEL + 'version_policy = "all"\nlatest_n = 2\n', "models[name=\"a\"].latest_n: only applies to version_policy = \"latest\""),
    (MODEL + 'versions = ["1"]\n', "models[name=\"a\"].versions: only applies to version_policy = \"specific\""),
    (MODEL + 'version_policy = "specific"\n', "models[name=\"a\"].versions: version_policy = \"specific\" needs a non-empty list"),
    (MODEL + 'version_policy = "specific"\nversions = []\n', "models[name=\"a\"].versions: version_policy = \"specific\" needs"),
    (MODEL + 'version_policy = "specific"\nversions = "1"\n', "models[name=\"a\"].versions: must be list"),
    (MODEL + 'version_policy = "specific"\nversions = [1.5]\n', "models[name=\"a\"].versions[0]: must be str or int"),
    (MODEL + 'version_policy = "all"\n' + MODEL.replace('engine = "a/1', 'version = "2"\nengine = "a/2')
     + "latest_n = 2\n", 'models[name="a", version="2"].version_policy: model \'a\' already has another version policy '
     '(models[name="a", version="1"])'),
    ('[daemon]\nwatch = "yes"\n', "daemon.watch: must be bool"),
    ("[daemon]\nwatch_settle_s = -1\n", "daemon.watch_settle_s: must be >= 0"),
    ('[daemon]\nwatch_rescan_s = "often"\n', "daemon.watch_rescan_s: must be int or number"),
])
def test_policy_and_watch_errors_name_the_field(text: str, fragment: str) -> None:
    assert fragment in error(text)


def test_the_same_policy_on_every_entry_is_fine() -> None:
    two = MODEL + 'version_policy = "all"\n' + MODEL.replace('engine = "a/1', 'version = "2"\nengine = "a/2') \
        + 'version_policy = "all"\n'
    assert len(cfg.parse(two, FILE).models) == 2


TOML = Path("/e/det/model.toml")


def settings_error(text: str) -> str:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.parse_model_settings(text, TOML, "det", Path("/e"))
    return str(info.value)


def test_model_toml_holds_model_fields_without_name_version_engine() -> None:
    mc = cfg.parse_model_settings('contexts = 2\nversion_policy = "all"\n', TOML, "det", Path("/e"))
    assert (mc.name, mc.contexts, mc.version_policy) == ("det", 2, "all")


@pytest.mark.parametrize("text, fragment", [
    ('engine = "x.onnx"\n', "model.toml: engine: comes from the path <engine_dir>/<model>/<version>/model.<ext>"),
    ('version = "2"\n', "model.toml: version: comes from the path"),
    ('name = "x"\n', "model.toml: name: comes from the path"),
    ("default = true\n", "model.toml: default: the default of a discovered model is its newest ready version"),
    ("contexts = 0\n", "model.toml: contexts: must be >= 1, got 0"),
    ("colour = 1\n", "model.toml: colour: unknown field"),
    ('fallback = "det"\n', "model.toml: fallback: model 'det' cannot fall back to itself"),
    ("latest_n = 0\n", "model.toml: latest_n: must be >= 1"),
    ("contexts = \n", "model.toml: not valid TOML"),
])
def test_model_toml_errors_name_the_file_and_field(text: str, fragment: str) -> None:
    assert fragment in settings_error(text)


@pytest.mark.parametrize("policy, expected", [
    (Policy(), {"10"}),
    (Policy("latest", 2), {"9", "10"}),
    (Policy("latest", 9), {"1", "2", "9", "10"}),
    (Policy("all"), {"1", "2", "9", "10"}),
    (Policy("specific", versions=("2", "7")), {"2"}),
])
def test_policy_selects_by_version_order_not_text_order(policy: Policy, expected: set[str]) -> None:
    assert policy.select(["1", "2", "9", "10"]) == expected


def engine(model: str, version: str, root: Path = Path("/e")) -> EngineFile:
    return EngineFile(model, version, root / model / version / "model.onnx", FileSig(10, 0, 1), True)


def snapshot(*files: EngineFile) -> Snapshot:
    return Snapshot({(f.model, f.version): f for f in files})


def test_configured_versions_are_always_wanted_and_others_inherit_their_settings() -> None:
    config = cfg.parse('[daemon]\nengine_dir = "/e"\n[[models]]\nname = "det"\nversion = "1"\n'
                       'engine = "det/1/model.onnx"\ncontexts = 3\ndefault = true\nweight = 5\n', FILE)
    snap = snapshot(engine("det", "1"), engine("det", "2"), engine("det", "3"))
    p = plan("det", snap, config, SettingsCache(Path("/e")), pinned=None)
    assert set(p.wanted) == {"1", "3"} and p.configured == {"1"}
    three = p.wanted["3"][0]
    assert (three.contexts, three.default, three.weight, three.engine) == (3, False, 0, Path("/e/det/3/model.onnx"))
    pinned = plan("det", snap, config, SettingsCache(Path("/e")), pinned="2")
    assert set(pinned.wanted) == {"1", "2"}


def test_a_configured_entry_outside_the_layout_is_left_alone() -> None:
    config = cfg.parse('[daemon]\nengine_dir = "/e"\n[[models]]\nname = "det"\nengine = "/opt/det.onnx"\n', FILE)
    p = plan("det", snapshot(engine("det", "1"), engine("det", "2")), config, SettingsCache(Path("/e")), None)
    assert set(p.wanted) == {"2"} and not p.configured  # version 1 is the configured file, not this one


def test_discovered_model_uses_model_toml(tmp_path: Path) -> None:
    (tmp_path / "det").mkdir()
    toml = tmp_path / "det" / "model.toml"
    toml.write_text('version_policy = "latest"\nlatest_n = 2\nmax_queue = 7\n')
    config = cfg.parse(f'[daemon]\nengine_dir = "{tmp_path}"\n', FILE)
    snap = Snapshot({(f.model, f.version): f for f in (engine("det", v, tmp_path) for v in "123")},
                    {"det": (toml, FileSig(1, 1, 1))})
    p = plan("det", snap, config, SettingsCache(tmp_path), None)
    assert set(p.wanted) == {"2", "3"} and p.wanted["3"][0].max_queue == 7
    toml.write_text("contexts = 0\n")
    snap.settings["det"] = (toml, FileSig(2, 2, 1))  # a changed file is read again
    broken = plan("det", snap, config, SettingsCache(tmp_path), None)
    assert "contexts: must be >= 1" in broken.error and not broken.wanted
