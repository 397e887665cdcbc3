#!/usr/bin/env python3
"""Check a vendored tree (/usr/lib/infermux/vendor at build time) is complete.

    packaging/check-vendor.py DIR

1. Closure: every requirement of every distribution in DIR (with the
   extras other vendored distributions ask for, and markers evaluated for
   this Python) is met by a distribution in DIR at a matching version.
2. Self-contained: textual's app, widgets and Markdown stack import in a
   fresh interpreter that sees only the standard library and DIR (-I -S:
   no site-packages, so nothing installed on the build machine can hide a
   missing file).

Exits non-zero with the reasons; the Debian build stops on it.
"""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SMOKE = """
import sys
sys.path.insert(0, {dir!r})
import textual, textual.app, textual.widgets, rich.console, pygments.lexers
from textual.widgets import Markdown
import markdown_it, mdit_py_plugins, linkify_it, mdurl, platformdirs, typing_extensions
assert textual.__file__.startswith({dir!r}), textual.__file__
print("textual", textual.__version__ if hasattr(textual, "__version__") else "?", "imports from", {dir!r})
"""


def closure_errors(root: Path) -> list[str]:
    dists = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(root)])}
    if not dists:
        return [f"{root}: no distributions"]
    errors: list[str] = []
    # (distribution, extra) pairs to check; "" is the distribution itself.
    pending = [(name, "") for name in dists]
    seen: set[tuple[str, str]] = set()
    while pending:
        name, extra = pending.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for line in dists[name].requires or []:
            req = Requirement(line)
            if req.marker and not req.marker.evaluate({"extra": extra}):
                continue
            if extra and (not req.marker or req.marker.evaluate({"extra": ""})):
                continue  # a plain requirement: checked with the distribution itself
            dep = canonicalize_name(req.name)
            if dep not in dists:
                errors.append(f"{name}{'[' + extra + ']' if extra else ''} needs {req}: not vendored")
                continue
            if not req.specifier.contains(dists[dep].version, prereleases=True):
                errors.append(f"{name} needs {req}: vendored {dep} is {dists[dep].version}")
            pending.append((dep, ""))
            pending.extend((dep, e) for e in req.extras)
    return errors


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    root = Path(argv[1]).resolve()
    errors = closure_errors(root)
    smoke = subprocess.run([sys.executable, "-I", "-S", "-c", SMOKE.format(dir=str(root))],
                           capture_output=True, text=True)
    if smoke.returncode != 0:
        errors.append("import in isolation failed:\n" + smoke.stderr.strip())
    for e in errors:
        print(f"check-vendor: {e}", file=sys.stderr)
    if not errors:
        print(f"check-vendor: {root} is complete; {smoke.stdout.strip()}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
