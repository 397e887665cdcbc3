"""Running a page's walk-through as written: the commands of its `sh` block, in a folder laid out as a
fresh clone is, with the suite's own environment standing in for the block's install line."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

from support.harness import REPO


def commands(page: str, heading: str) -> list[str]:
    """The commands of the first `sh` block under `heading` in docs/`page`, comments and `&` taken off
    (a comment is ` # ...`: a '#' inside a word, as in an MQTT topic, stays)."""
    text = (REPO / "docs" / page).read_text()
    section = text[text.index(heading):]
    start = section.index("```sh\n") + len("```sh\n")
    block = section[start:section.index("```", start)]
    lines = (re.sub(r"\s+#\s.*$", "", line) for line in block.splitlines())
    return [line.strip().rstrip("&").strip() for line in lines if line.strip()]


def local(command: str) -> list[str]:
    """A page command's words, with `.venv/bin/` as the suite's own environment's bin folder."""
    bin_dir = Path(sys.executable).parent
    return [str(bin_dir / w.removeprefix(".venv/bin/")) if w.startswith(".venv/bin/") else w
            for w in shlex.split(command)]


def clone_of(folder: Path, files: tuple[str, ...]) -> Path:
    """`folder` with the repository's `files` (the ones the page's commands name) at their paths."""
    for rel in files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, folder / rel)
    return folder
