"""A docs page's walk-through run as written: its `sh` block's commands, in a folder laid out as a clone.

    commands = walkthrough.block(REPO / "docs/cameras.md", "## Try it: four cameras")
    words = walkthrough.argv(commands[2])                   # .venv/bin/... -> this suite's environment
    walkthrough.wait_ready(log, daemon)                     # the daemon's log says " ready "
    app = walkthrough.console(top_command, clone, env)      # `infermux top` as that command builds it

The suite's own environment stands in for the page's `.venv` (its install line), and the console is
the app `infermux top` builds from the same arguments, for Textual's pilot to drive.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support.harness import REPO


def block(page: Path, heading: str) -> list[str]:
    """The commands of the first `sh` block under `heading` in `page`, comments and `&` taken off
    (a comment is ` # ...`: a '#' inside a word, as in an MQTT topic, stays)."""
    text = page.read_text()
    section = text[text.index(heading):]
    start = section.index("```sh\n") + len("```sh\n")
    lines = (re.sub(r"\s+#\s.*$", "", line) for line in section[start:section.index("```", start)].splitlines())
    return [line.strip().rstrip("&").strip() for line in lines if line.strip()]


def clone_of(folder: Path, files: tuple[str, ...]) -> Path:
    """`folder` with the repository's `files` (the ones the page's commands name) at their paths."""
    for rel in files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, folder / rel)
    return folder


def argv(command: str) -> list[str]:
    """A page command with `.venv/bin/` as the suite's own environment's bin folder."""
    bin_dir = Path(sys.executable).parent
    words = shlex.split(command)
    return [str(bin_dir / w.removeprefix(".venv/bin/")) if w.startswith(".venv/bin/") else w for w in words]


def wait_ready(log: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Wait until the daemon writing `log` says it is ready; fail with its log if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while " ready " not in log.read_text():
        assert proc.poll() is None, f"the daemon exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"the daemon was not ready in {timeout_s} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def console(top: str, clone: Path, env: dict[str, str]) -> Any:
    """The TopApp that the page's `infermux top ...` command builds, run from `clone` with `env`'s runtime
    directory (where the page's daemon put its sockets)."""
    from infermux.cli import top as top_command
    from infermux.tui.app import TopApp
    from infermux.tui.feed import Endpoints, LiveFeed

    parser = argparse.ArgumentParser()
    top_command.add_arguments(parser)
    args = parser.parse_args(argv(top)[2:])
    args.config = str(clone / args.config)
    saved = os.environ.get("RUNTIME_DIRECTORY")
    os.environ["RUNTIME_DIRECTORY"] = env["RUNTIME_DIRECTORY"]  # the console finds the sockets as the page's would
    try:
        admin, stats, config = top_command.endpoints(args)
    finally:
        if saved is None:
            del os.environ["RUNTIME_DIRECTORY"]
        else:
            os.environ["RUNTIME_DIRECTORY"] = saved
    return TopApp(LiveFeed(Endpoints(admin, stats)), config_path=config)
