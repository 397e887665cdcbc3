"""Plugin discovery shared by backends and processors: built-ins, entry points, "module:Class".

A plugin is named by a short name that maps to "module:Attr", from the
package's own table (so a source checkout without `pip install` finds it)
and its entry-point group; "module:Attr" itself is accepted as a name, for a
plugin not installed as a package. Nothing is imported until it is used.
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
