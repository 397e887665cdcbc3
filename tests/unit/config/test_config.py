"""Configuration: valid files load into typed settings; every error names file, field and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux import config as cfg
from support.harness import REPO

FILE = Path("/etc/infermux/test.toml")
MODEL = '[[models]]\nname = "a"\nengine = "a.onnx"\n'


def error(text: str) -> str:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.parse(text, FILE)
    message = str(info.value)
    assert message.startswith(str(FILE)), message
    return message


def test_sample_config_loads_with_paths_resolved() -> None:
    config = cfg.load(REPO / "etc/infermux/infermux.toml")
    assert config.daemon.engine_dir == REPO / "engines"
    assert [m.name for m in config.models] == ["classifier", "mlp"]
    assert all(m.engine.exists() for m in config.models)


def test_defaults_fill_what_the_file_leaves_out() -> None:
    config = cfg.parse(MODEL, FILE)
    m = config.models[0]
    assert (m.version, m.placement, m.contexts, m.max_batch) == ("1", "hot", 1, 1)
    assert m.engine == Path("/var/lib/infermux/engines/a.onnx")
    assert config.routing.strategy == "least_queue"


@pytest.mark.parametrize("text, placement", [
    ("", "hot"), ('placement = "cold"\n', "cold"), ('placement = "hot"\n', "hot"),
    ('mode = "multiproc"\n', "cold"), ('mode = "inproc"\n', "hot"),  # the old key and its names
    ('placement = "cold"\nmode = "multiproc"\n', "cold"),  # both, where they agree
])
def test_placement_is_hot_or_cold_and_mode_is_its_old_name(text: str, placement: str) -> None:
    assert cfg.parse(MODEL + text, FILE).models[0].placement == placement


def test_model_toml_takes_the_placement_and_its_old_name_too(tmp_path: Path) -> None:
    assert cfg.parse_model_settings('placement = "cold"\n', tmp_path / "model.toml", "m", tmp_path).placement == "cold"
    assert cfg.parse_model_settings('mode = "multiproc"\n', tmp_path / "model.toml", "m", tmp_path).placement == "cold"
    with pytest.raises(cfg.ConfigError, match="placement: must be hot"):
        cfg.parse_model_settings('placement = "warm"\n', tmp_path / "model.toml", "m", tmp_path)


@pytest.mark.parametrize("text, fragment", [
    ("[daemon\n", "not valid TOML"),
    ("[daemons]\n", "daemons: unknown table"),
    ("[daemon]\nlisten = []\n", "daemon.listen: needs at least one endpoint"),
    ('[daemon]\nlisten = ["http://x"]\n', "daemon.listen[0]: endpoint 'http://x' must start with ipc:// or tcp://"),
    ("[daemon]\nmax_message_bytes = 10\n", "daemon.max_message_bytes: must be >= 1024"),
    ('[daemon]\nmemory_budget = "lots"\n', "daemon.memory_budget: 'lots' is not a percentage"),
    ('[daemon]\nmemory_budget = "150%"\n', "daemon.memory_budget"),
    ('[daemon]\nlog_level = "loud"\n', "daemon.log_level"),
    ('[daemon]\nlisten_on = "x"\n', "daemon.listen_on: unknown field"),
    ('[routing]\nstrategy = "random"\n', "routing.strategy: must be one of least_queue, weighted, hash"),
    ('[routing]\nversion_mismatch = "maybe"\n', "routing.version_mismatch"),
    ('[[models]]\nengine = "a.onnx"\n', "models[0].name: is required"),
    ('[[models]]\nname = "a"\n', 'models[name="a"].engine: is required'),
    (MODEL + "contexts = 0\n", "models[name=\"a\"].contexts: must be >= 1, got 0"),
    (MODEL + 'contexts = "2"\n', "models[name=\"a\"].contexts: must be int, got str"),
    (MODEL + "max_queue = true\n", "models[name=\"a\"].max_queue: must be int, got bool"),
    (MODEL + 'placement = "remote"\n', "models[name=\"a\"].placement: must be hot (in the daemon) or cold"),
    (MODEL + 'mode = "remote"\n', "models[name=\"a\"].mode: must be inproc or multiproc (the old names of placement"),
    (MODEL + 'placement = "hot"\nmode = "multiproc"\n',
     'models[name="a"].mode: mode = "multiproc" is the old name of placement = "cold", but placement = "hot"; '
     'keep one of the two'),
    (MODEL + "colour = 1\n", "models[name=\"a\"].colour: unknown field; known fields"),
    (MODEL + "contxts = 2\n", "models[name=\"a\"].contxts: unknown field; did you mean `contexts`?"),
    ('[daemon]\nmemory_bugdet = "1GiB"\n', "daemon.memory_bugdet: unknown field; did you mean `memory_budget`?"),
    (MODEL + "preferred_batch = [4, 0]\n", "models[name=\"a\"].preferred_batch[1]: must be >= 1"),
    (MODEL + MODEL, "models[1, name=\"a\"]: model 'a' version '1' is already defined by models[0]"),
    (MODEL + 'fallback = "b"\n', "models[name=\"a\"].fallback: unknown model 'b'"),
    (MODEL + 'fallback = "a"\n', "models[name=\"a\"].fallback: model 'a' cannot fall back to itself"),
    (MODEL + 'fallback = "b"\n[[models]]\nname = "b"\nengine = "b.onnx"\nfallback = "a"\n',
     "models[name=\"a\"].fallback: fallback cycle: a -> b -> a"),
    (MODEL + "[models.rollout]\nshadow_requests = 0\n", 'models[name="a"].rollout.shadow_requests: must be >= 1'),
    (MODEL + '[models.rollout]\ncompare = "exact"\n',
     'models[name="a"].rollout.compare: must be one of allclose, argmax, iou, got \'exact\''),
    (MODEL + "[models.rollout]\nmin_agreement = 1.5\n",
     'models[name="a"].rollout.min_agreement: must be between 0 and 1, got 1.5'),
    (MODEL + "[models.rollout]\nmin_idle_cpu = 2\n",
     'models[name="a"].rollout.min_idle_cpu: must be between 0 and 1, got 2.0'),
    (MODEL + "[models.rollout]\nmax_latency_ratio = 0.5\n",
     'models[name="a"].rollout.max_latency_ratio: must be 0 (not judged) or >= 1, got 0.5'),
    (MODEL + "[models.rollout]\nmax_memory_mb = -1\n",
     'models[name="a"].rollout.max_memory_mb: must be 0 (not judged) or a size in MiB, got -1.0'),
    (MODEL + "[models.rollout]\nmax_memory_mb = inf\n",
     'models[name="a"].rollout.max_memory_mb: must be 0 (not judged) or a size in MiB, got inf'),
    (MODEL + '[models.rollout]\ncompare = "argmax"\nrtol = 0.1\n',
     'models[name="a"].rollout: rtol and atol belong to compare = "allclose"'),
    (MODEL + "[models.rollout]\nshadow_request = 5\n",
     'models[name="a"].rollout.shadow_request: unknown field; did you mean `shadow_requests`?'),
    (MODEL + 'default = true\n[[models]]\nname = "a"\nversion = "2"\nengine = "a2.onnx"\ndefault = true\n',
     'models[name="a", version="2"].default: model \'a\' already has a default version '
     '(models[name="a", version="1"])'),
    (MODEL + 'queue_policy = "lifo"\n', 'models[name="a"].queue_policy: must be one of fifo, newest_per_key'),
    (MODEL + "per_key_depth = 2\n", 'models[name="a"].per_key_depth: only applies to queue_policy = "newest_per_key"'),
    (MODEL + 'queue_policy = "newest_per_key"\nper_key_depth = 0\n', 'models[name="a"].per_key_depth: must be >= 1'),
    (MODEL + "nice = -1\n", 'models[name="a"].nice: must be >= 0'),
    (MODEL + "nice = 20\n", 'models[name="a"].nice: must be <= 19, got 20'),
    ("[daemon]\nstream_silent_s = -1\n", "daemon.stream_silent_s: must be >= 0"),
    ("[daemon]\nstream_metrics_keys = 0\n", "daemon.stream_metrics_keys: must be >= 1"),
    ("[daemon]\nstream_max_keys = 0\n", "daemon.stream_max_keys: must be >= 1"),
])
def test_each_kind_of_error_names_the_field_and_reason(text: str, fragment: str) -> None:
    assert fragment in error(text)


def test_a_stream_policy_is_set_on_models_and_pipelines() -> None:
    pipeline = ('[[pipelines]]\nname = "p"\nqueue_policy = "newest_per_key"\nper_key_depth = 2\n'
                '[[pipelines.steps]]\nprocessor = "decode"\n')
    config = cfg.parse(MODEL + 'queue_policy = "newest_per_key"\n' + pipeline, FILE)
    assert (config.models[0].queue_policy, config.models[0].per_key_depth) == ("newest_per_key", 1)
    assert (config.pipelines[0].queue_policy, config.pipelines[0].per_key_depth) == ("newest_per_key", 2)
    assert cfg.parse(MODEL, FILE).models[0].queue_policy == "fifo"
    assert "pipelines[0].queue_policy: must be one of" in error(pipeline.replace("newest_per_key", "newest"))


def test_long_fallback_chains_are_refused() -> None:
    names = "abcdef"
    text = "".join(f'[[models]]\nname = "{n}"\nengine = "{n}.onnx"\n'
                   + (f'fallback = "{names[i + 1]}"\n' if i + 1 < len(names) else "")
                   for i, n in enumerate(names))
    assert "longer than" in error(text)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(cfg.ConfigError, match="cannot read"):
        cfg.load(tmp_path / "missing.toml")


@pytest.mark.parametrize("value, total, expected", [("50%", 1000, 500), ("2GiB", 0, 2 << 30), ("512MB", 0, 512 * 10**6), (4096, 0, 4096)])
def test_memory_budget_forms(value: object, total: int, expected: int) -> None:
    assert cfg.parse_budget(FILE, value, total) == expected


def test_relative_ipc_endpoints_live_in_the_runtime_dir(tmp_path: Path) -> None:
    assert cfg.resolve_endpoint("ipc://infer.sock", tmp_path) == f"ipc://{tmp_path}/infer.sock"
    assert cfg.resolve_endpoint("ipc:///run/x.sock", tmp_path) == "ipc:///run/x.sock"
    assert cfg.resolve_endpoint("tcp://127.0.0.1:5555", tmp_path) == "tcp://127.0.0.1:5555"
    assert cfg.runtime_dir(cfg.DaemonConfig(), str(tmp_path)) == tmp_path


def test_daemon_refuses_to_start_on_a_broken_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.toml"
    bad.write_text(MODEL + "contexts = -1\n")
    proc = subprocess.run([sys.executable, "-m", "infermux", "serve", "--config", str(bad)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert f'{bad}: models[name="a"].contexts: must be >= 1, got -1' in proc.stderr


def test_an_entry_without_a_usable_name_is_named_by_its_index() -> None:
    assert 'models[1].name: must be str, got int 3' in error(MODEL + "[[models]]\nname = 3\nengine = \"b.onnx\"\n")
    assert 'models[name="a \\"b\\""].contexts' in error('[[models]]\nname = \'a "b"\'\nengine = "a.onnx"\ncontexts = 0\n')


@pytest.mark.parametrize("line, words", [
    ("max_regions = 0", ["pipelines[0].max_regions", ">= 1"]),
    ("max_batch_bytes = \"big\"", ["pipelines[0].max_batch_bytes", "must be int"]),
    ("max_crop_width = -4", ["pipelines[0].max_crop_width", ">= 1"]),
    ("nice = -2", ["pipelines[0].nice", ">= 0"]),
    ("nice = 40", ["pipelines[0].nice", "<= 19, got 40"]),
])
def test_pipeline_bounds_in_the_file_are_checked(line: str, words: list[str]) -> None:
    text = f'[[models]]\nname = "m"\nengine = "m.onnx"\n[[pipelines]]\nname = "p"\n{line}\n' \
           '[[pipelines.steps]]\nmodel = "m"\n'
    message = error(text)
    assert all(w in message for w in words), message


def test_contexts_in_the_file_and_in_a_model_toml_are_held_to_max_contexts(tmp_path: Path) -> None:
    from infermux.swap.repository import SettingsCache
    from infermux.swap.watcher import Settler, scan
    text = '[daemon]\nmax_contexts = 4\n[[models]]\nname = "m"\nengine = "m.onnx"\ncontexts = 5\n'
    with pytest.raises(cfg.ConfigError, match=r"contexts: 5 contexts is over \[daemon\] max_contexts \(4\)"):
        cfg.parse(text, tmp_path / "x.toml")
    with pytest.raises(cfg.ConfigError, match="max_contexts: must be <= 1024"):
        cfg.parse("[daemon]\nmax_contexts = 5000\n", tmp_path / "x.toml")
    (tmp_path / "m/1").mkdir(parents=True)
    (tmp_path / "m/1/model.onnx").write_bytes(b"x")
    (tmp_path / "m/model.toml").write_text("contexts = 40\n")
    found = SettingsCache(tmp_path, cfg.DaemonConfig).get("m", scan(tmp_path, Settler(0.0)))
    assert isinstance(found, cfg.ConfigError) and "over [daemon] max_contexts (32)" in str(found)


def test_max_reply_bytes_is_checked_and_defaults_to_max_message_bytes(tmp_path: Path) -> None:
    assert cfg.parse("[daemon]\nmax_message_bytes = 4096\nmax_header_bytes = 1024\n",
                     tmp_path / "x.toml").daemon.max_reply_bytes == 4096
    assert cfg.parse("[daemon]\nmax_reply_bytes = 4096\n", tmp_path / "x.toml").daemon.max_reply_bytes == 4096
    with pytest.raises(cfg.ConfigError, match="daemon.max_reply_bytes: must be >= 1024"):
        cfg.parse("[daemon]\nmax_reply_bytes = 10\n", tmp_path / "x.toml")
