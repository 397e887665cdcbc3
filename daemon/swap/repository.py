"""What the engine directory asks the daemon to serve (docs/hot-swap.md).

Pure decisions, no side effects: given a scan of `<engine_dir>`, the main
configuration, a model's `model.toml` and its pin, which versions should be
served and with which settings. swap.py makes it so.

Rules (docs/hot-swap.md):
- a model in engine_dir but not in the configuration is served with the
  settings of its `model.toml` (defaults without one);
- a version listed in the configuration is always served while its file
  exists (it is what the operator wrote); the version policy chooses among
  the *other* versions found on disk, which inherit the settings of the
  model's configured default version (else its newest);
- a pin overrides the policy: only the pinned version (and configured ones).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from infermux.config import (Config, ConfigError, DaemonConfig, ModelConfig, contexts_problem, parse_model_settings,
                             policy_key)
from infermux.models.registry import version_key
from infermux.models.version import ModelVersion, config_template
from infermux.swap.watcher import ENGINE_NAMES, EngineFile, FileSig, Snapshot

log = logging.getLogger("infermux.swap")


@dataclass(frozen=True)
class Policy:
    """Triton's version policy: the `latest_n` newest, `all`, or `specific` versions."""

    kind: str = "latest"
    latest_n: int = 1
    versions: tuple[str, ...] = ()

    @classmethod
    def of(cls, mc: ModelConfig) -> "Policy":
        return cls(*policy_key(mc))

    def select(self, versions: Iterable[str]) -> set[str]:
        found = sorted(set(versions), key=version_key)
        if self.kind == "all":
            return set(found)
        if self.kind == "specific":
            return set(found) & set(self.versions)
        return set(found[-self.latest_n:])


def config_policy(entries: Sequence[ModelConfig]) -> Policy:
    """The policy the configuration sets for a model (config.py checked that entries agree)."""
    default = Policy()
    for mc in entries:
        if Policy.of(mc) != default:
            return Policy.of(mc)
    return default


def in_layout(engine_dir: Path, mc: ModelConfig) -> bool:
    """Whether a configured version's engine sits at `<engine_dir>/<name>/<version>/model.<ext>`."""
    return mc.engine.name in ENGINE_NAMES and mc.engine.parent == engine_dir / mc.name / mc.version


@dataclass
class ModelPlan:
    """What one model should serve now."""

    name: str
    wanted: dict[str, tuple[ModelConfig, EngineFile]] = field(default_factory=dict)
    configured: set[str] = field(default_factory=set)  # wanted versions the configuration lists
    on_disk: set[str] = field(default_factory=set)     # every version with an engine file, complete or not
    error: str = ""                                     # model.toml is broken: change nothing


class SettingsCache:
    """Parsed `model.toml` files, re-read only when they change; `daemon()` gives the `[daemon]` table
    in force, whose bounds (max_contexts) a file is held to at each look."""

    def __init__(self, engine_dir: Path, daemon: Callable[[], DaemonConfig] = DaemonConfig) -> None:
        self.engine_dir = engine_dir
        self._daemon = daemon
        self._cache: dict[str, tuple[FileSig, ModelConfig | ConfigError]] = {}

    def get(self, name: str, snapshot: Snapshot) -> ModelConfig | ConfigError:
        found = snapshot.settings.get(name)
        if found is None:
            self._cache.pop(name, None)
            return ModelConfig(name=name, engine=self.engine_dir / name)
        path, sig = found
        cached = self._cache.get(name)
        if cached is not None and cached[0] == sig:
            result = cached[1]
        else:
            result = self._parse(name, path)
            self._cache[name] = (sig, result)
        why = contexts_problem(result.contexts, self._daemon()) if isinstance(result, ModelConfig) else None
        return ConfigError(path, "contexts", why) if why else result

    def _parse(self, name: str, path: Path) -> ModelConfig | ConfigError:
        try:
            return parse_model_settings(path.read_text(encoding="utf-8"), path, name, self.engine_dir)
        except ConfigError as exc:
            return exc
        except (OSError, UnicodeDecodeError) as exc:
            return ConfigError(path, "", f"cannot read: {exc}")


def plan(name: str, snapshot: Snapshot, config: Config, settings: SettingsCache,
         pinned: str | None) -> ModelPlan:
    """The versions of `name` to serve, each with its settings and file."""
    files = snapshot.versions(name)
    result = ModelPlan(name, on_disk=set(files))
    entries = config.versions(name)
    listed = {mc.version for mc in entries}
    for mc in entries:
        f = files.get(mc.version)
        if f is not None and in_layout(config.daemon.engine_dir, mc) and f.path == mc.engine:
            result.wanted[mc.version] = (mc, f)
            result.configured.add(mc.version)
    discovered = {v: f for v, f in files.items() if v not in listed}
    if entries:
        template, policy = config_template(entries), config_policy(entries)
    else:
        found = settings.get(name, snapshot)
        if isinstance(found, ConfigError):
            result.error = str(found)
            return result
        template, policy = found, Policy.of(found)
    if pinned is not None and (pinned in discovered or pinned in listed):
        chosen = {pinned} & set(discovered)
    else:
        chosen = policy.select(discovered)
    for version in chosen:
        f = discovered[version]
        mc = replace(template, version=version, engine=f.path, default=False, weight=0)
        result.wanted[version] = (mc, f)
    return result


def why_ignored(configured: ModelConfig | None, pinned: str | None) -> str:
    """The `ignored` of a file on disk that is not served."""
    if configured is not None:  # the configuration names another file for this version
        where = configured.engine
        state = "which is missing" if not where.exists() else "which is served instead"
        return f"the configuration names engine {where} for this version, {state}"
    return f"pinned to {pinned}" if pinned is not None else "outside version_policy"


class FolderScreen:
    """What a scan found that must not be served as it is, said once per folder (docs/security.md).

    A model or version folder whose name holds a control character (a
    newline, ESC) is refused: it would split log lines and break the
    metrics text. A folder (or engine file) that is a symlink resolving
    outside engine_dir is logged with where it points, and served unless
    `[daemon] follow_symlinks = false`.
    """

    def __init__(self) -> None:
        self._said: dict[Path, str] = {}  # folder -> what was logged about it, while it stays so

    def apply(self, snapshot: Snapshot, daemon: DaemonConfig) -> Snapshot:
        """`snapshot` without the refused folders; logs what is new since the last scan."""
        said: dict[Path, str] = {}
        engines = {}
        for key, f in snapshot.engines.items():
            folder, problem, refused = _problem(f, daemon)
            if problem:
                said[folder] = problem
            if not refused:
                engines[key] = f
        root = daemon.engine_dir
        settings = {name: found for name, found in snapshot.settings.items() if name.isprintable()}
        for name in set(snapshot.settings) - set(settings):
            said[root / name] = _bad_name(root / name)
        for folder, problem in said.items():
            if self._said.get(folder) != problem:
                log.warning("%s", problem)
        self._said = said
        return Snapshot(engines, settings)


def _problem(f: EngineFile, daemon: DaemonConfig) -> tuple[Path, str, bool]:
    """(the folder concerned, what to log or "", whether it is refused) for one engine file."""
    model_dir = daemon.engine_dir / f.model
    for folder in (model_dir, model_dir / f.version):
        if not folder.name.isprintable():
            return folder, _bad_name(folder), True
    for link in (model_dir, model_dir / f.version, f.path):
        if link.is_symlink():
            try:
                target = link.resolve()
                outside = not target.is_relative_to(daemon.engine_dir.resolve())
            except (OSError, RuntimeError):  # a loop, or gone meanwhile: the next scan sees
                return link, "", True
            if not outside:
                return link, "", False
            if daemon.follow_symlinks:
                return link, (f"{link} is a symlink to {target}, outside engine_dir "
                              f"{daemon.engine_dir}: serving it (follow_symlinks = false refuses it)"), False
            return link, (f"refused {link}: a symlink to {target}, outside engine_dir {daemon.engine_dir} "
                          f"(follow_symlinks = false)"), True
    return model_dir, "", False


def _bad_name(folder: Path) -> str:
    return (f"refused folder {ascii(str(folder))} in engine_dir: its name holds control characters "
            f"(a newline, ESC...) that would break log lines and metrics; rename it")


def rollback_from(before: ModelVersion | None, version: str, on_disk: set[str]) -> str:
    """The serving version that `version` stands in for because its folder was removed ("" if none): it
    falls back at once, without shadowing, as nothing would be left to compare it with."""
    if before is None or not before.ready or before.version in on_disk:
        return ""
    return before.version if version_key(version) < version_key(before.version) else ""


def same_file(made: tuple[Any, ...] | None, key: tuple[Any, ...], current: ModelVersion | None) -> bool:
    """The serving file itself under new settings (a reload, an edited model.toml, standing in for a refused
    newer version under that one's): the same answers, so it swaps in unshadowed, never a candidate of itself."""
    return made is not None and made[:2] == key[:2] and current is not None and current.ready


def made_before(made: tuple[Any, ...] | None, key: tuple[Any, ...]) -> ModelConfig | None:
    """The file's settings an entry was made under, where `key` is the same file (under new settings, or
    the same); None for another file or none."""
    return made[2] if made is not None and made[:2] == key[:2] else None
