"""`[[models]]` entries and a model folder's `model.toml`: their keys read as declared
(config/settings.py), then the rules between keys and between entries."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from infermux.config.declare import child, read_table
from infermux.config.errors import ConfigError
from infermux.config.settings import (MAX_FALLBACK_DEPTH, OLD_PLACEMENT_NAMES, QUEUE_POLICIES, DaemonConfig,
                                      ModelConfig, RolloutConfig, RoutingConfig)
from infermux.plugins import backends

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def model_labels(entries: list[tuple[Any, Any]]) -> list[str]:
    """How errors name each `[[models]]` entry, from its (name, version): `models[name="a"]`, with
    the version where entries share the name, the index where that is not enough (or no name)."""
    def text(value: Any) -> str | None:
        return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "" else None

    keys = [(n if isinstance(n, str) and n else None, text(v) or "1") for n, v in entries]  # a name is a string
    labels = []
    for i, (name, version) in enumerate(keys):
        if name is None:
            labels.append(f"models[{i}]")
        elif sum(1 for n, _ in keys if n == name) == 1:
            labels.append(f"models[name={json.dumps(name)}]")
        elif keys.count((name, version)) == 1:
            labels.append(f"models[name={json.dumps(name)}, version={json.dumps(version)}]")
        else:
            labels.append(f"models[{i}, name={json.dumps(name)}]")
    return labels


def parse_model(file: Path, where: str, table: Any, engine_dir: Path) -> ModelConfig:
    """One `[[models]]` entry (`where` names it in errors; "" in a model.toml)."""
    raw = read_table(file, where, table, ModelConfig, old_names=("mode",))
    for key in ("name", "version"):  # logged and exposed as metric labels: no newline, no ESC
        if key in raw and not raw[key].isprintable():
            raise ConfigError(file, child(where, key), f"{ascii(raw[key])} holds control characters")
    _old_placement(file, where, raw)
    _check_version_policy(file, where, raw)
    check_queue_policy(file, where, raw)
    if "rollout" in raw:
        rollout = raw["rollout"]
        if rollout.get("compare", "allclose") != "allclose" and ({"rtol", "atol"} & set(rollout)):
            raise ConfigError(file, child(where, "rollout"), "rtol and atol belong to compare = \"allclose\"")
        raw["rollout"] = RolloutConfig(**rollout)
    engine = Path(raw["engine"]).expanduser()
    raw["engine"] = engine if engine.is_absolute() else engine_dir / engine
    return ModelConfig(**raw)


def _old_placement(file: Path, where: str, raw: dict[str, Any]) -> None:
    """`mode = "inproc" | "multiproc"`, the old spelling of `placement`: read, and allowed beside
    `placement` only where the two agree."""
    if "mode" not in raw:
        return
    placement = raw.get("placement")
    mode = raw.pop("mode")
    if mode not in OLD_PLACEMENT_NAMES:
        raise ConfigError(file, child(where, "mode"), f"must be inproc or multiproc (the old names of placement = "
                          f"\"hot\" and \"cold\"), got {mode!r}")
    if placement is not None and OLD_PLACEMENT_NAMES[mode] != placement:
        raise ConfigError(file, child(where, "mode"), f"mode = {json.dumps(mode)} is the old name of placement = "
                          f"{json.dumps(OLD_PLACEMENT_NAMES[mode])}, but placement = {json.dumps(placement)}; "
                          f"keep one of the two")
    raw["placement"] = OLD_PLACEMENT_NAMES[mode]


def _check_version_policy(file: Path, where: str, raw: dict[str, Any]) -> None:
    """`latest_n` goes with "latest", `versions` with "specific", which needs some."""
    policy = raw.get("version_policy", "latest")
    if "latest_n" in raw and policy != "latest":
        raise ConfigError(file, child(where, "latest_n"), f"only applies to version_policy = \"latest\", "
                          f"not {policy!r}")
    if "versions" in raw and policy != "specific":
        raise ConfigError(file, child(where, "versions"), f"only applies to version_policy = \"specific\", "
                          f"not {policy!r}")
    if policy == "specific" and not raw.get("versions"):
        raise ConfigError(file, child(where, "versions"), "version_policy = \"specific\" needs a non-empty "
                          "list of versions, e.g. versions = [\"2\", \"3\"]")


def check_queue_policy(file: Path, where: str, raw: dict[str, Any]) -> None:
    """`per_key_depth` only goes with queue_policy = "newest_per_key"."""
    policy = raw.get("queue_policy", QUEUE_POLICIES[0])
    if "per_key_depth" in raw and policy != "newest_per_key":
        raise ConfigError(file, child(where, "per_key_depth"), "only applies to queue_policy = \"newest_per_key\" "
                          f"(how many requests of one key may wait), not {policy!r}")


def policy_key(m: ModelConfig) -> tuple[str, int, tuple[str, ...]]:
    """A model's version policy as one comparable value."""
    return (m.version_policy, m.latest_n, m.versions)


def parse_model_settings(text: str, file: Path, name: str, engine_dir: Path) -> ModelConfig:
    """`<engine_dir>/<name>/model.toml`: the `[[models]]` fields minus those the path gives.

    Returns a template (version "", engine = the model's folder) to copy per version.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, "", f"not valid TOML: {exc}") from None
    for key in ("name", "version", "engine"):
        if key in data:
            raise ConfigError(file, key, "comes from the path <engine_dir>/<model>/<version>/model.<ext>; "
                              "remove it")
    if "default" in data:
        raise ConfigError(file, "default", "the default of a discovered model is its newest ready version; "
                          "use pin to hold one")
    if data.get("fallback") == name:
        raise ConfigError(file, "fallback", f"model {name!r} cannot fall back to itself")
    backend = data.get("backend")
    why = backends.refusal(backend) if isinstance(backend, str) and backend else None
    if why:  # engine_dir is written by publishers, not by whoever writes this file's configuration
        raise ConfigError(file, "backend", why)
    mc = parse_model(file, "", {**data, "name": name, "engine": name}, engine_dir)
    return replace(mc, version="")


def contexts_problem(contexts: int, daemon: DaemonConfig) -> str | None:
    """Why a version may not have `contexts` contexts (over `[daemon] max_contexts`), or None."""
    if contexts > daemon.max_contexts:
        return (f"{contexts} contexts is over [daemon] max_contexts ({daemon.max_contexts}): each one is an "
                "engine session with its own memory and thread")
    return None


def check_models(file: Path, models: list[ModelConfig], routing: RoutingConfig, daemon: DaemonConfig) -> None:
    """The rules between entries: contexts within [daemon]'s bound, one entry per version, one default
    per model, fallbacks that exist and make no cycle, one version policy per model."""
    labels = model_labels([(m.name, m.version) for m in models])
    for i, m in enumerate(models):
        why = contexts_problem(m.contexts, daemon)
        if why:
            raise ConfigError(file, f"{labels[i]}.contexts", why)
    _check_unique(file, models, labels)
    _check_fallbacks(file, models, labels)
    _check_policies(file, models, labels)
    problem = fallback_problem(fallback_of(models))
    if problem:
        start, why = problem
        index = next(i for i, m in enumerate(models) if m.name == start and m.fallback)
        raise ConfigError(file, f"{labels[index]}.fallback", why)


def _check_unique(file: Path, models: list[ModelConfig], labels: list[str]) -> None:
    """One entry per (name, version), one default version per name."""
    seen: dict[tuple[str, str], int] = {}
    for i, m in enumerate(models):
        if m.key in seen:
            raise ConfigError(file, labels[i], f"model {m.name!r} version {m.version!r} "
                              f"is already defined by models[{seen[m.key]}]")
        seen[m.key] = i
    defaults: dict[str, int] = {}
    for i, m in enumerate(models):
        if m.default and m.name in defaults:
            raise ConfigError(file, f"{labels[i]}.default",
                              f"model {m.name!r} already has a default version ({labels[defaults[m.name]]})")
        if m.default:
            defaults[m.name] = i


def _check_fallbacks(file: Path, models: list[ModelConfig], labels: list[str]) -> None:
    names = {m.name for m in models}
    for i, m in enumerate(models):
        if m.fallback and m.fallback not in names:
            raise ConfigError(file, f"{labels[i]}.fallback", f"unknown model {m.fallback!r}; "
                              f"known models: {', '.join(sorted(names))}")
        if m.fallback == m.name:
            raise ConfigError(file, f"{labels[i]}.fallback", f"model {m.name!r} cannot fall back to itself")


def _check_policies(file: Path, models: list[ModelConfig], labels: list[str]) -> None:
    """A version policy belongs to the model: entries that set one must agree."""
    default = policy_key(ModelConfig(name="", engine=Path()))
    first: dict[str, int] = {}
    for i, m in enumerate(models):
        if policy_key(m) == default:
            continue
        j = first.setdefault(m.name, i)
        if policy_key(models[j]) != policy_key(m):
            raise ConfigError(file, f"{labels[i]}.version_policy", f"model {m.name!r} already has another "
                              f"version policy ({labels[j]}); set it once, or the same on every entry")


def fallback_of(models: list[ModelConfig] | tuple[ModelConfig, ...]) -> dict[str, str]:
    """Model name -> fallback model name (the default version's setting wins)."""
    chain: dict[str, str] = {}
    for m in models:
        if m.fallback and (m.name not in chain or m.default):
            chain[m.name] = m.fallback
    return chain


def fallback_problem(chain: Mapping[str, str]) -> tuple[str, str] | None:
    """(model, why) if a model -> fallback mapping has a cycle or a chain too long, else None."""
    for start in chain:
        path, node = [start], chain[start]
        while node in chain and node not in path:
            path.append(node)
            node = chain[node]
        if node in path:
            return start, f"fallback cycle: {' -> '.join([*path[path.index(node):], node])}"
        if len(path) > MAX_FALLBACK_DEPTH:
            return start, f"fallback chain {' -> '.join(path)} is longer than {MAX_FALLBACK_DEPTH}"
    return None
