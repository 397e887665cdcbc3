"""Plugin discovery shared by backends and processors: built-ins, entry points, "module:Class".

A plugin is named by a short name that maps to "module:Attr", from the
package's own table (so a source checkout without `pip install` finds it)
and its entry-point group; "module:Attr" itself is accepted as a name, for a
plugin not installed as a package, where the name comes from the daemon's
own configuration file. A name from anywhere less trusted (a `model.toml`
in engine_dir, which publishers write) must be an installed one:
`installed_only` says why not. Nothing is imported until it is used.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Mapping


def specs(group: str, builtin: Mapping[str, str], name: str = "") -> dict[str, str]:
    """Name -> "module:Attr" for every plugin of `group`, plus `name` itself when it is a "module:Attr"."""
    found = dict(builtin)
    for ep in entry_points(group=group):
        found[ep.name] = ep.value
    if ":" in name:
        found[name] = name
    return found


def resolve(spec: str) -> object:
    """The object "module:Attr" names, its module imported (ImportError, AttributeError when absent)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def installed_only(group: str, builtin: Mapping[str, str], name: str, kind: str) -> str | None:
    """Why `name` may not be chosen by a file that is not the daemon's configuration, or None when
    it names an installed plugin: a "module:Attr" there would let whoever writes the file import
    and call anything (`os:abort`)."""
    found = specs(group, builtin)
    if name in found:
        return None
    return (f"{name!r} is not an installed {kind}; choose one of {', '.join(sorted(found))} (installed "
            f"packages' `{group}` entry points; a module path is taken only from the daemon's configuration file)")
