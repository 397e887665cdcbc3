"""The docs stand on their own: no references to a design page outside the repository, no dead links."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
CITES = ("DESIGN" + " §", "DESIGN" + ".md")  # split, or this file would cite it
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.split()]


def _slug(heading: str) -> str:
    """The anchor GitHub makes of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_nothing_cites_the_design_page_outside_the_repository() -> None:
    cited = [f"{path.relative_to(ROOT)}:{n}" for path in _tracked() if path.suffix in (".py", ".md", ".sh", ".toml")
             and path.exists() for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if any(cite in line for cite in CITES)]
    assert not cited, f"point these at docs/architecture.md or docs/protocol.md instead: {cited}"


CONFLICT = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)  # a merge's markers, left in a file by mistake


def test_no_tracked_file_holds_merge_conflict_markers() -> None:
    marked = [str(path.relative_to(ROOT)) for path in _tracked() if path.is_file() and path.suffix != ".png"
              and CONFLICT.search(path.read_text(errors="replace"))]
    assert not marked, f"resolve the merge in these files: {marked}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_link_in_the_docs_leads_somewhere(page: Path) -> None:
    dead = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            dead.append(target)
    assert not dead, f"{page.name}: links to nothing: {dead}"


def test_code_comments_point_at_sections_that_exist() -> None:
    dead = []
    for path in _tracked():
        if path.suffix != ".py" or not path.exists():
            continue
        for page, anchor in re.findall(r"(docs/[\w-]+\.md)#([\w-]+)", path.read_text(errors="replace")):
            if not (ROOT / page).exists() or anchor not in _anchors(ROOT / page):
                dead.append(f"{path.relative_to(ROOT)}: {page}#{anchor}")
    assert not dead, dead


README = ROOT / "README.md"


def _code_blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move reference material to docs/"


def test_the_readme_shows_the_very_test_command_ci_runs() -> None:
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")][-1]
    shown = [line for block in _code_blocks(README, "sh") for line in block.splitlines()]
    assert ci in shown, f".ci/run runs {ci!r}; the README must show that command"


def test_the_readme_shows_its_client_commands_as_a_checkout_runs_them() -> None:
    # tests/daemon/test_readme.py runs each against the sample configuration's daemon, without -c.
    commands = [line for block in _code_blocks(README, "sh") for line in block.splitlines()
                if re.match(r"\.venv/bin/infermux (status|ctl|top|infer|bench)\b", line)]
    assert {c.split()[1] for c in commands} >= {"status", "ctl", "infer", "bench", "top"}, commands


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_zmq_socket_in_the_docs_has_a_receive_timeout(page: Path) -> None:
    # A client copied from the docs must not hang forever on a daemon that is down.
    blocking = [block for block in _code_blocks(page, "python") if re.search(r"\.socket\(zmq\.", block)
                and "RCVTIMEO" not in block]
    assert not blocking, f"{page.name}: set zmq.RCVTIMEO (or poll with a timeout) in: {blocking}"
