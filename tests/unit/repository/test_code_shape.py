"""The product's code keeps a readable shape, and its comments quote no measured timings.

No function over MAX_LINES lines (its `def` to its last line), none above radon's cyclomatic
complexity MAX_COMPLEXITY, no module over MAX_MODULE_LINES lines. Two exceptions are for good:
protocol.py's request parser (one flat, ordered list of the checks a request passes, kept in one
place so that none is skipped) and config.py, where the settings are declared. Figures measured on
a machine go stale in a comment: they belong in docs/performance.md, and the comment keeps the reason.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path
from typing import Iterator

from radon.complexity import cc_visit
from radon.visitors import Function

ROOT = Path(__file__).resolve().parents[3]
TREES = ("daemon", "tui", "plugins")

MAX_LINES = 50
MAX_COMPLEXITY = 15
MAX_MODULE_LINES = 600

# For good: (file, function or "module", what).
EXEMPT = {
    ("daemon/protocol.py", "parse_request", "lines"): "the request parser: every check in order, in one place",
    ("daemon/protocol.py", "parse_request", "complexity"): "the request parser: every check in order, in one place",
}

@functools.lru_cache(maxsize=1)
def _sources() -> tuple[tuple[str, str], ...]:
    return tuple((str(path.relative_to(ROOT)), path.read_text())
                 for tree in TREES for path in sorted((ROOT / tree).rglob("*.py")))


@functools.lru_cache(maxsize=1)
def _found() -> dict[tuple[str, str, str], str]:
    """Every offender in the product, and what it is over."""
    found = {key: why for path, text in _sources() for key, why in offenders(path, text)}
    c_files = tuple((str(path.relative_to(ROOT)), path.read_text())
                    for tree in TREES for path in sorted((ROOT / tree).rglob("*.c")))
    found.update({(path, "comment", "timing"): "\n".join(quotes) for path, text in _sources() + c_files
                  if (quotes := _timings(path, text))})
    return found


def _functions(blocks: list) -> Iterator[Function]:
    """radon's functions and methods, and the functions defined inside them."""
    for block in blocks:
        if isinstance(block, Function):
            yield block
            yield from _functions(block.closures)


def offenders(path: str, text: str) -> Iterator[tuple[tuple[str, str, str], str]]:
    """((file, function or "module", "lines" or "complexity"), what is over) for one module's source."""
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        yield (path, "module", "lines"), f"{path}: {lines} lines (at most {MAX_MODULE_LINES})"
    for fn in _functions(cc_visit(text)):
        if fn.complexity > MAX_COMPLEXITY:
            yield ((path, fn.fullname, "complexity"),
                   f"{path}:{fn.lineno} {fn.fullname}: complexity {fn.complexity} (at most {MAX_COMPLEXITY})")
    tree = ast.parse(text)
    classes = {id(item): node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for item in node.body}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_LINES:
                name = ".".join(filter(None, (classes.get(id(node)), node.name)))
                yield (path, name, "lines"), f"{path}:{node.lineno} {name}: {length} lines (at most {MAX_LINES})"


def test_no_function_or_module_is_over_its_size_or_complexity() -> None:
    new = sorted(why for key, why in _found().items()
                 if key not in EXEMPT and key[1] != "comment")
    assert not new, ("split these (a function reads top to bottom in one screen; a module has one "
                     "concern):\n" + "\n".join(new))


def test_the_shape_check_finds_a_long_function_a_complex_one_and_a_long_module() -> None:
    branches = "".join(f"    if x == {n}:\n        return {n}\n" for n in range(16))
    padding = "".join(f"    y = {n}\n" for n in range(50))
    source = (f"def branchy(x):\n{branches}    return -1\n\n\n"
              f"class Long:\n    def method(self):\n{padding.replace('    ', '        ')}        return y\n"
              + "\n" * MAX_MODULE_LINES)
    assert sorted(key for key, _ in offenders("daemon/new.py", source)) == [
        ("daemon/new.py", "Long.method", "lines"),
        ("daemon/new.py", "branchy", "complexity"),
        ("daemon/new.py", "module", "lines")]
    assert not list(offenders("daemon/new.py", "def short(x):\n    return x\n"))


# A paragraph of a comment or docstring quotes a measured timing when it has a time figure and says
# where or that it was measured, or gives the time as an approximation ("~10 µs").
_MACHINE = re.compile(r"\b(?:2|two)-core\b|\bdevelopment (?:box|machine)\b|\b(?:the|this|our) box\b"
                      r"|\bmeasured\b|\btook\b", re.IGNORECASE)
_FIGURE = re.compile(r"\d(?:[\d.,]*\d)?\s?(?:µs|us|ns|ms|s|%)(?!\w)")
_APPROXIMATE = re.compile(r"~\s?\d(?:[\d.,–-]*\d)?\s?(?:µs|us|ns|ms|s)(?!\w)")


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each paragraph of the module's comments (a run of comment lines) and docstrings."""
    run: list[str] = []
    start = last = 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type != tokenize.COMMENT:
            continue
        if run and token.start[0] != last + 1:
            yield start, "\n".join(run)
            run = []
        if not run:
            start = token.start[0]
        run.append(token.string)
        last = token.start[0]
    if run:
        yield start, "\n".join(run)
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            for paragraph in re.split(r"\n\s*\n", doc or ""):
                yield node.body[0].lineno, paragraph


def _c_paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each paragraph of a C file's comments."""
    for comment in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.DOTALL):
        for paragraph in re.split(r"\n\s*\n", comment.group()):
            yield text.count("\n", 0, comment.start()) + 1, paragraph


def _timings(path: str, text: str) -> list[str]:
    paragraphs = _c_paragraphs(text) if path.endswith(".c") else _paragraphs(text)
    return [f"{path}:{line}: {' '.join(paragraph.split())[:120]}" for line, paragraph in paragraphs
            if _APPROXIMATE.search(paragraph) or (_MACHINE.search(paragraph) and _FIGURE.search(paragraph))]


def test_no_comment_quotes_a_measured_timing() -> None:
    found = [quotes for key, quotes in _found().items() if key[1] == "comment"]
    assert not found, ("measured timings in comments (the figure and its date go to docs/performance.md, "
                       "the comment keeps the reason):\n" + "\n".join(found))


def test_the_timing_check_tells_a_measurement_from_a_setting() -> None:
    assert _timings("x.py", "# A hand-off costs ~70 µs of the frontend's time.\nX = 1\n")
    assert _timings("x.py", '"""Faster.\n\nOn the 2-core box this took 5.4 against 3.1 µs a call."""\n')
    assert not _timings("x.py", "# Wait at most 500 µs (the default) before waking the executor.\nX = 1\n")
    assert not _timings("x.py", '"""Memory measured after a load.\n\nPolled every 50 ms."""\n')
    assert _timings("x.c", "/* one call a message:\n   ~10 us saved a request */\nint x;\n")
