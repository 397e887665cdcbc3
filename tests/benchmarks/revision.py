"""Another git revision of the package, importable beside this checkout: before/after in one run.

    env = package_env("631f6e7", tmp)      # PYTHONPATH for `python -m infermux ...` at that revision
    subprocess.Popen([sys.executable, "-m", "infermux", "serve", ...], env={**os.environ, **env})

Ratios between two builds are only fair when both run in the same minutes on
the same box, so the benchmark scripts start the old daemon beside the new
one (`--against REV`) and interleave their rounds. The revision's daemon/,
tui/ and plugins/ are exported with `git archive` and laid out as the
installed package is (daemon/ is `infermux`, tui/ and plugins/ inside it);
PYTHONPATH wins over this checkout's editable install. `git archive` holds
no build outputs, so this checkout's compiled extensions are copied in where
the revision's C source is the same (`carried`): otherwise the revision would
run without them (the frontend on pyzmq's socket calls, say), and a ratio
would compare builds, not revisions.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def package_env(rev: str, dest: Path) -> dict[str, str]:
    """Export `rev`'s package under `dest` and return the environment that imports it first."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "daemon", "tui", "plugins"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    src = dest / "src"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, filter="data")
    names = carried(src / "daemon")
    print(f"{rev}: " + (f"this checkout's {', '.join(names)} copied in" if names else
                        "no compiled extension copied in (none built here, or its C source differs)"), flush=True)
    package = dest / "path" / "infermux"
    package.mkdir(parents=True)
    for entry in (src / "daemon").iterdir():
        (package / entry.name).symlink_to(entry)
    (package / "tui").symlink_to(src / "tui")
    (package / "plugins").symlink_to(src / "plugins")
    return {"PYTHONPATH": str(dest / "path")}


def carried(exported: Path) -> list[str]:
    """Copy this checkout's built extensions into `exported` (a revision's daemon/) where that revision's
    C source for them is the same as this checkout's; the names of those copied."""
    names = []
    for built in sorted((ROOT / "daemon").rglob("*.so")):
        source = built.with_name(built.name.split(".")[0] + ".c")
        twin = exported / source.relative_to(ROOT / "daemon")
        if source.exists() and twin.exists() and _code(twin.read_text()) == _code(source.read_text()):
            shutil.copy2(built, twin.parent / built.name)
            names.append(built.name)
    return names


def _code(c_source: str) -> str:
    """C source without its comments: a revision whose extension differs from this one's only in a
    comment runs this checkout's build (else it would run pyzmq's calls, an unfair comparison)."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", c_source, flags=re.S)


def describe(rev: str) -> str:
    """`rev` as a short hash and subject, for the results table."""
    return subprocess.run(["git", "log", "-1", "--format=%h (%s)", rev], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
