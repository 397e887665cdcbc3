"""How a setting is declared, and the one reader of a table that every section's parser uses.

A setting is a field of a section's frozen dataclass (config/settings.py) whose default is made by
`setting(...)`: the field's name is the key, the dataclass is the section, and the `Setting` kept in
the field's metadata holds the rest: its kind (the TOML type it takes and what it becomes), bounds or
choices, its default, when a change applies (`LIVE`, `RELOAD`, `RESTART`, `CAMERA`, `SINK`), whether
`ctl set` changes it, and one line of documentation. `read_table` checks a table against those declarations (unknown
keys with a did-you-mean, required keys, types, bounds, choices); what only a section knows (one key
against another, paths against engine_dir) stays in that section's parser.
"""

from __future__ import annotations

import difflib
import functools
import math
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from infermux.config.errors import ConfigError

# When a change to a setting takes effect.
LIVE = "live"  # a reload applies it to what runs, in place (and `ctl set`, where the setting is settable)
RELOAD = "reload"  # a reload builds the version or pipeline anew beside the running one, switched in once ready
RESTART = "restart"  # only a restart applies it; a reload logs that a restart is needed
CAMERA = "camera"  # a reload restarts that camera's process with it; the daemon and other cameras run on
SINK = "sink"  # a reload restarts that sink on its spool (sinks/hub.py `apply`); nothing waiting in it is lost
APPLIES = {LIVE: "`ctl reload` (or SIGHUP) applies it to what runs, in place; a settable one also `ctl set`",
           RELOAD: "`ctl reload` loads the version (or builds the pipeline) anew beside the running one and "
                   "switches to it once ready",
           RESTART: "only a restart applies it; `ctl reload` logs that a restart is needed",
           CAMERA: "`ctl reload` restarts that camera's process with it; the daemon and the other cameras run on",
           SINK: "`ctl reload` restarts that sink on its spool, whose waiting events it then delivers; the "
                 "pipelines and the other sinks run on"}


@dataclass(frozen=True)
class Kind:
    """What a setting's TOML value must be: `name` as the reference writes it, and `read(file, where,
    value)`, which checks the value and returns what the dataclass holds (a Path, a tuple), or raises
    ConfigError."""

    name: str
    read: Callable[[Path, str, Any], Any]


@dataclass(frozen=True)
class Rule:
    """A bound that `low`/`high` cannot say: `text` completes "must be ..." in an error and in the
    reference, `holds` tells a good value."""

    text: str
    holds: Callable[[Any], bool]


@dataclass(frozen=True)
class Setting:
    """One key of a section, declared once (see the module's docstring)."""

    kind: Kind
    doc: str
    applies: str
    default: Any = None
    required: bool = False
    low: float | None = None  # numbers: the smallest allowed
    high: float | None = None  # ... and the largest
    low_open: bool = False  # `low` itself is not allowed (> low)
    choices: tuple[str, ...] = ()  # strings: the values allowed
    choice_text: str = ""  # what "must be ..." says of the choices, where a list of them does not say enough
    rule: Rule | None = None
    settable: bool = False  # `infermux ctl set` changes it on a running version (models/overrides.py)
    unset: bool = False  # the default means "not set" (the option off), a value the file may not write
    section: type | None = None  # a nested table's (or list of tables') dataclass, whose keys are declared alike
    key: str = ""  # the field's name, filled in by `settings_of`

    def check(self, file: Path, where: str, value: Any) -> Any:
        """`value` read by the kind and held to the bounds, choices and rule; ConfigError if not."""
        value = self.kind.read(file, where, value)
        problem = self.problem(value)
        if problem:
            raise ConfigError(file, where, problem)
        return value

    def problem(self, value: Any) -> str | None:
        """Why a value of the right type is still not allowed, or None."""
        if self.choices and value not in self.choices:
            return f"must be {self.choice_text or self._choices()}, got {_shown(value)}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return self._range(value)
        if self.rule is not None and not self.rule.holds(value):
            return f"must be {self.rule.text}, got {_shown(value)}"
        return None

    def bounds(self) -> str:
        """The allowed values, as the reference shows them."""
        if self.choices:
            return ", ".join(f"`{_toml(c)}`" for c in self.choices)
        if self.rule is not None:
            return self.rule.text
        if self.low is not None and self.high is not None and not self.low_open:
            return f"{_pretty(self.low)} to {_pretty(self.high)}"
        parts = [f"{'>' if self.low_open else '>='} {_pretty(self.low)}" if self.low is not None else "",
                 f"<= {_pretty(self.high)}" if self.high is not None else ""]
        return ", ".join(p for p in parts if p)

    def _choices(self) -> str:
        return f"one of {', '.join(c for c in self.choices if c)}"

    def _range(self, value: float) -> str | None:
        if self.rule is not None:
            return None if self.rule.holds(value) else f"must be {self.rule.text}, got {value}"
        low, high = self.low, self.high
        if (isinstance(value, float) and low is not None and high is not None and not self.low_open
                and not low <= value <= high):
            return f"must be between {_number(low)} and {_number(high)}, got {value}"
        if low is not None and (value <= low if self.low_open else value < low):
            return f"must be {'>' if self.low_open else '>='} {_number(low)}, got {value}"
        if high is not None and value > high:
            return f"must be <= {_number(high)}, got {value}"
        return None


def setting(default: Any, kind: Kind, doc: str, *, applies: str, **more: Any) -> Any:
    """A dataclass field declaring one setting (`Setting` says what `more` may hold)."""
    declared = Setting(kind, doc, applies, default=default, **more)
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"setting": declared})
    return field(default=default, metadata={"setting": declared})


def required(kind: Kind, doc: str, *, applies: str, **more: Any) -> Any:
    """A dataclass field declaring a setting the table must give (no default)."""
    return field(metadata={"setting": Setting(kind, doc, applies, required=True, **more)})


def settings_of(section: type) -> dict[str, Setting]:
    """Key -> declaration of every setting of a section's dataclass, in the order declared."""
    return dict(_declared(section))


@functools.lru_cache(maxsize=None)
def _declared(section: type) -> tuple[tuple[str, Setting], ...]:
    found = []
    for f in fields(section):
        declared = f.metadata.get("setting")
        if declared is not None:
            default = declared.default if f.default is MISSING else f.default
            found.append((f.name, replace(declared, key=f.name, default=default)))
    return tuple(found)


def read_table(file: Path, where: str, table: Any, section: type, old_names: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keys `table` gives, each checked against its declaration in `section` and read into what the
    dataclass holds; nested tables are read alike, as dicts (lists of dicts) for the caller to finish.
    `old_names`: keys still read under an older name, which the caller translates."""
    check_type(file, where, table, dict)
    declared = settings_of(section)
    known_keys(file, where, table, {*declared, *old_names})
    raw = dict(table)
    for key, s in declared.items():  # in the order declared: a name's error before its engine's
        if key in table:
            raw[key] = _read(file, child(where, key), table[key], s)
        elif s.required:
            raise ConfigError(file, child(where, key), "is required")
    return raw


def _read(file: Path, where: str, value: Any, s: Setting) -> Any:
    value = s.check(file, where, value)
    if s.section is None:
        return value
    if isinstance(value, list):
        return [read_table(file, f"{where}[{i}]", item, s.section) for i, item in enumerate(value)]
    return read_table(file, where, value, s.section)


def known_keys(file: Path, where: str, table: Mapping[str, Any], names: set[str]) -> None:
    """Every key of `table` is one of `names`; the first that is not gets the nearest known one."""
    unknown = sorted(set(table) - names)
    if unknown:
        # 0.75, not difflib's 0.6: a typo is suggested its field, an unrelated word (colour) no field at all.
        near = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.75)
        hint = f"did you mean `{near[0]}`? " if near else ""
        raise ConfigError(file, child(where, unknown[0]),
                          f"unknown field; {hint}known fields: {', '.join(sorted(names))}")


def child(where: str, key: str) -> str:
    """The path of `key` inside the table at `where` ("" is a file's top, as in a model.toml)."""
    return f"{where}.{key}" if where else key


# Python's types as a TOML file's author knows them.
TOML_NAMES: dict[type, str] = {float: "number", dict: "a table"}


def check_type(file: Path, where: str, value: Any, want: type | tuple[type, ...]) -> None:
    """`value` is one of the types `want` (a bool is no int)."""
    wants = want if isinstance(want, tuple) else (want,)
    ok = bool in wants if isinstance(value, bool) else isinstance(value, wants)
    if not ok:
        names = " or ".join(TOML_NAMES.get(w, w.__name__) for w in wants)
        raise ConfigError(file, where, f"must be {names}, got {type(value).__name__} {value!r}")


def at_least(file: Path, where: str, value: Any, minimum: int = 1) -> None:
    """`value` is an int of at least `minimum`."""
    check_type(file, where, value, int)
    if value < minimum:
        raise ConfigError(file, where, f"must be >= {minimum}, got {value}")


def resolve(file: Path, value: str) -> Path:
    """A path as written in `file`: `~` expanded, relative to the file's folder."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (file.parent / path).resolve()


def _shown(value: Any) -> str:
    return repr(str(value)[:40]) if isinstance(value, str) else repr(value)


def _number(value: float) -> str:
    """A bound as an error states it: 1, not 1.0."""
    if isinstance(value, float) and value.is_integer() and not math.isinf(value):
        value = int(value)
    return str(value)


def _pretty(value: float) -> str:
    """A bound as the reference shows it: a large power of two as one (2^30)."""
    text = _number(value)
    number = int(text) if text.isdigit() else 0
    if number >= 1 << 16 and number & (number - 1) == 0:
        return f"2^{number.bit_length() - 1}"
    if number >= 1 << 16 and (number + 1) & number == 0:
        return f"2^{number.bit_length()} - 1"
    return text


def _toml(value: Any) -> str:
    """A value as TOML writes it, for the reference."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def toml_value(value: Any) -> str:
    """A default as the reference shows it, as TOML writes it."""
    return _toml(value)
