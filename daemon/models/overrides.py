"""Operators' live changes (`infermux ctl set`, the console) and the rule that keeps them.

The rule (docs/architecture.md#live-changes): a live change to a field
holds across reloads, new versions and restarts until the configuration
file changes that same field (then the file wins for that field, with an
`override_dropped` event naming both values) or the operator runs
`infermux ctl reset MODEL [FIELD]`.

Each override remembers the value the file gave when the operator first
changed the field, so "the file changed it" is a comparison with what the
file says now, whichever path brings the file's settings in: a reload
(`follow`), a version found in engine_dir or a restart (`reconcile`).
A new version of a model with live settings takes them from the version it
supersedes (`inherit`). Every change is written to the state file
(models/statefile.py), so a restart restores them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterable, Mapping

from infermux.config import Config, ModelConfig, fallback_of, fallback_problem, settings_of
from infermux.config.kinds import INT
from infermux.events import EventLog
from infermux.models.version import config_template

log = logging.getLogger("infermux.overrides")

# The fields an operator changes live: those declared `settable` (config/settings.py). A model's fallback is
# the whole model's (its entries carry version ""); a new version takes the others from the version it
# supersedes, but for the weight, which follows the share rule instead.
SETTINGS = {key: s for key, s in settings_of(ModelConfig).items() if s.settable}
MODEL_FIELDS = ("fallback",)
VERSION_FIELDS = tuple(key for key in SETTINGS if key not in MODEL_FIELDS)
INHERITED = tuple(f for f in VERSION_FIELDS if f != "weight")
FIELDS = VERSION_FIELDS + MODEL_FIELDS
_TYPES: dict[str, type] = {f.name: {"int": int, "str": str}.get(str(f.type), object) for f in fields(ModelConfig)}
# (smallest, largest) of each integer field, for `ctl set` and for the state file read back alike, as the
# file has them: past the largest a value is a typo, and may not even fit a float.
BOUNDS = {key: (int(s.low), int(s.high)) for key, s in SETTINGS.items()
          if s.kind is INT and s.low is not None and s.high is not None}
MAX_PREFERRED = 64  # batch sizes in one preferred_batch list
MAX_NAME = 256  # a fallback model's name, as written in a state file


@dataclass(frozen=True)
class Override:
    """One field an operator changed live: the value set, and the file's value when it was set."""

    model: str
    version: str  # "" for a field of the whole model (fallback)
    field: str
    live: Any
    file: Any

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.model, self.version, self.field)

    def label(self) -> str:
        return f"{self.model}:{self.version} {self.field}" if self.version else f"{self.model} {self.field}"

    def as_json(self) -> dict[str, Any]:
        """The admin `models` entry's `{"live": v, "file": v}`."""
        return {"live": _plain(self.live), "file": _plain(self.file)}

    def record(self) -> dict[str, Any]:
        """One entry of the state file."""
        return {"model": self.model, "version": self.version, "field": self.field, **self.as_json()}

    @classmethod
    def from_record(cls, entry: Any) -> "Override":
        """An entry of the state file; ValueError when it is not one this daemon wrote."""
        if not isinstance(entry, dict):
            raise ValueError(f"an entry is not an object: {str(entry)[:60]}")
        model, version, name = (entry.get(k) for k in ("model", "version", "field"))
        if not (isinstance(model, str) and model and isinstance(version, str) and name in FIELDS):
            raise ValueError(f"an entry names no model, version and settable field: {str(entry)[:80]}")
        if (version == "") != (name in MODEL_FIELDS):
            raise ValueError(f"{name!r} of {model!r} is given for the wrong version {version!r}")
        return cls(model, version, name, _value(name, entry.get("live")), _value(name, entry.get("file")))


@dataclass(frozen=True)
class Dropped:
    """An override that stopped holding: the file changed its field, a reset, or its version left."""

    override: Override
    file: Any  # the value that serves from now on
    reason: str

    def summary(self) -> str:
        o = self.override
        return f"{o.label()} live {_plain(o.live)} -> {_plain(self.file)} ({self.reason})"


class Overrides:
    """The live changes in force. Thread-safe: a change replaces the whole table in one assignment
    (readers, the router per request and the stats thread, never see one half made), and saves
    it under a lock, so the file always holds the latest table."""

    def __init__(self, events: EventLog, save: Callable[[list[dict[str, Any]]], None] | None = None,
                 restored: Iterable[Override] = ()) -> None:
        self.events = events
        self._save = save
        self._lock = threading.Lock()
        self._saving = threading.Lock()
        self._items: dict[tuple[str, str, str], Override] = {o.key: o for o in restored}
        self._dropped: deque[Dropped] = deque(maxlen=1000)  # since the last reload (its reply lists them)
        self.weights: dict[str, dict[str, int]] = {}  # model -> version -> live weight (replaced whole)
        self._reweigh()

    # -- reading -----------------------------------------------------------

    def all(self) -> list[Override]:
        return sorted(self._items.values(), key=lambda o: o.key)

    def of(self, model: str, version: str) -> dict[str, Override]:
        """The overrides a version's entry shows: its own fields and its model's."""
        items = self._items.values()
        return {o.field: o for o in items if o.model == model and o.version in (version, "")}

    def weights_of(self, name: str, file: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        """Version -> weight of model `name` for `weighted` routing: the `file`'s, live ones over them."""
        given = file.get(name, {})
        live = self.weights.get(name)
        return {**given, **live} if live else dict(given)

    def fallbacks(self, chain: Mapping[str, str]) -> dict[str, str]:
        """A model -> fallback chain with the live fallbacks over it ("" removes one)."""
        result = dict(chain)
        for o in self._items.values():
            if o.field == "fallback":
                result.pop(o.model, None)
                if o.live:
                    result[o.model] = o.live
        return result

    def apply(self, mc: ModelConfig) -> ModelConfig:
        """`mc` with the live values of its version (and its model's fallback) over it."""
        changes = {o.field: o.live for o in self.of(mc.name, mc.version).values()}
        return replace(mc, **changes) if changes else mc

    def over(self, config: Config) -> Config:
        """`config` as it serves: every listed version with its live values."""
        return replace(config, models=tuple(self.apply(mc) for mc in config.models))

    # -- changing -----------------------------------------------------------

    def set(self, model: str, version: str, name: str, live: Any, file: Any) -> None:
        """Record a live change of `name` (`file`: the value before it, used only for a first change).
        A value set back to the file's is no override any more."""
        version = "" if name in MODEL_FIELDS else version
        with self._lock:
            items = dict(self._items)
            known = items.get((model, version, name))
            first = known.file if known is not None else file
            if live == first:
                items.pop((model, version, name), None)
            else:
                items[(model, version, name)] = Override(model, version, name, live, first)
            self._items = items
        self._changed()

    def reset(self, model: str, name: str | None = None) -> list[Dropped]:
        """`infermux ctl reset`: forget the model's overrides (of field `name` only, when given)."""
        gone = [o for o in self.all() if o.model == model and name in (None, o.field)]
        return [self._drop(o, o.file, "reset") for o in gone]

    def forget(self, model: str, version: str, why: str) -> None:
        """`version` of `model` is served no more: its overrides go (its model's too once none is left)."""
        for o in self.all():
            if o.model == model and o.version == version:
                self._drop(o, o.file, why)

    def forget_model(self, model: str, why: str) -> None:
        for o in self.all():
            if o.model == model:
                self._drop(o, o.file, why)

    def reconcile(self, mc: ModelConfig) -> ModelConfig:
        """`mc` as the file gives it now, with the live values that still hold: an override of a
        field the file changed since the override was set is dropped (the file wins)."""
        for o in list(self.of(mc.name, mc.version).values()):
            if o.version and getattr(mc, o.field) != o.file:
                self._drop(o, getattr(mc, o.field), "the file changed it")
        return self.apply(mc)

    def follow(self, config: Config) -> None:
        """The file in force is now `config`: the file wins for every field it changed, in the
        versions it lists and the fallbacks of the models it lists (a version found in engine_dir
        is reconciled when the swap applies its new settings); a live fallback that would now make
        a cycle goes too."""
        chain = fallback_of(config.models)
        self._follow_changes(config, chain)
        for o in [o for o in self.all() if o.field == "fallback" and o.live]:
            problem = fallback_problem(self.fallbacks(chain))
            if problem is None:
                break
            without = {**self.fallbacks(chain), o.model: chain.get(o.model, "")}
            if fallback_problem({k: v for k, v in without.items() if v}) is None:  # this one closes it
                self._drop(o, chain.get(o.model, ""), problem[1])

    def _follow_changes(self, config: Config, chain: dict[str, str]) -> None:
        """Drop every live change of a field `config` gives another value than the file did."""
        listed = {mc.key: mc for mc in config.models}
        names = {mc.name for mc in config.models}
        for o in self.all():
            if o.version and (o.model, o.version) in listed:
                now = getattr(listed[(o.model, o.version)], o.field)
            elif o.version and o.model in names:
                # A version found in engine_dir of a model the file lists: its settings are the model's
                # entry's (swap/repository.py), but for the weight, which the share rule gives it.
                if o.field == "weight":
                    continue
                now = getattr(config_template(config.versions(o.model)), o.field)
            elif not o.version and o.model in names:
                now = chain.get(o.model, "")
            else:
                continue
            if now != o.file:
                self._drop(o, now, "the file changed it")

    def inherit(self, mc: ModelConfig, superseded: str | None, share: int | None) -> tuple[ModelConfig, dict[str, Any]]:
        """A new version `mc` (as the file gives it) takes the live settings of the version it
        supersedes, and `share` as its weight (None: keep the file's). Returns it with its live
        values and what it took."""
        taken: dict[str, Any] = {}
        own = self.of(mc.name, mc.version)
        if superseded is not None and superseded != mc.version:
            for o in self.of(mc.name, superseded).values():
                if o.version and o.field in INHERITED and o.field not in own:
                    self.set(mc.name, mc.version, o.field, o.live, getattr(mc, o.field))
                    taken[o.field] = o.live
        if share is not None and "weight" not in own and share != mc.weight:
            self.set(mc.name, mc.version, "weight", share, mc.weight)
            taken["weight"] = share
        return self.apply(mc), taken

    def take_dropped(self) -> list[Dropped]:
        """What stopped holding since the last call (a reload's reply lists it)."""
        with self._lock:
            dropped = list(self._dropped)
            self._dropped.clear()
        return dropped

    # -- inside ---------------------------------------------------------------

    def _drop(self, o: Override, file: Any, reason: str) -> Dropped:
        with self._lock:
            if self._items.get(o.key) == o:
                self._items = {key: other for key, other in self._items.items() if key != o.key}
            dropped = Dropped(o, file, reason)
            self._dropped.append(dropped)
        self.events.emit("override_dropped", o.model, o.version, field=o.field, live=_text(o.live),
                         file=_text(file), reason=reason)
        self._changed()
        return dropped

    def _changed(self) -> None:
        with self._saving:  # the table read inside the lock: a slower change never publishes an older one last
            self._reweigh()
            if self._save is not None:
                self._save([o.record() for o in self.all()])

    def _reweigh(self) -> None:
        weights: dict[str, dict[str, int]] = {}
        for o in self._items.values():
            if o.field == "weight":
                weights.setdefault(o.model, {})[o.version] = o.live
        self.weights = weights


def file_weights(config: Config) -> dict[str, dict[str, int]]:
    """Model -> version -> weight, as the configuration gives them (versions without one: none)."""
    weights: dict[str, dict[str, int]] = {}
    for mc in config.models:
        if mc.weight:
            weights.setdefault(mc.name, {})[mc.version] = mc.weight
    return weights


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _value(name: str, value: Any) -> Any:
    """A value read back from the state file, checked as the field's type and bounds (those of `ctl set`)."""
    if name == "preferred_batch":
        if not isinstance(value, list) or len(value) > MAX_PREFERRED or not all(
                _integer(v) and 1 <= v <= BOUNDS["max_batch"][1] for v in value):
            raise ValueError(f"preferred_batch must be a list of at most {MAX_PREFERRED} batch sizes, "
                             f"got {str(value)[:40]}")
        return tuple(value)
    if name == "queue_policy":
        policies = SETTINGS["queue_policy"].choices
        if value not in policies:
            raise ValueError(f"queue_policy must be one of {', '.join(policies)}, got {str(value)[:40]}")
        return value
    if name in BOUNDS:
        low, high = BOUNDS[name]
        if not _integer(value) or not low <= value <= high:
            raise ValueError(f"{name} must be an integer {low}..{high}, got {str(value)[:40]}")
        return value
    if _TYPES.get(name) is str and not (isinstance(value, str) and len(value) <= MAX_NAME):
        raise ValueError(f"{name} must be a model name, got {str(value)[:40]}")
    return value


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
