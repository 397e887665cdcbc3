"""The tests' own layout: grouped by kind, unique file names, shared code in tests/support only.

pytest imports test files by their base name (its default import mode puts each file's folder on
sys.path), and puts tests/ itself there for tests/conftest.py: so two files of one name would
clash, and a folder of tests/ named like a module the daemon imports would be imported instead of
that module wherever it is not installed (a folder `tensorrt` made `import tensorrt` succeed).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
REPO = TESTS.parent
KINDS = {"unit", "daemon", "tensorrt_contract", "tui", "system", "benchmarks", "gpu"}


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def _imported(path: Path) -> set[str]:
    """The top-level names of every absolute import in `path`, function-level ones included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_test_file_sits_in_the_folder_of_its_kind() -> None:
    misplaced = [str(p.relative_to(TESTS)) for p in _test_files() if p.relative_to(TESTS).parts[0] not in KINDS]
    assert _test_files() and not misplaced, f"put these in one of {sorted(KINDS)}: {misplaced}"


def test_unit_and_daemon_tests_sit_in_folders_named_for_the_package_they_test() -> None:
    # tests/unit/execution/ tests daemon/execution/; a top-level module's tests (protocol.py, events.py) and
    # the daemon tests that cross packages (the feature matrix, fuzzing) sit at the folder's top.
    packages = {p.name for tree in ("daemon", "plugins") for p in (REPO / tree).iterdir()
                if p.is_dir() and (p / "__init__.py").exists()} | {"plugins", "repository"}
    folders = {f"{kind}/{p.name}": p.name for kind in ("unit", "daemon") for p in (TESTS / kind).iterdir()
               if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders and not {k for k, name in folders.items() if name not in packages}, sorted(folders)


def test_test_file_names_are_unique_across_folders() -> None:
    twice = [name for name, n in Counter(p.name for p in _test_files()).items() if n > 1]
    assert not twice, twice


def test_no_test_file_imports_another() -> None:
    names = {p.stem for p in _test_files()}
    importing = {str(p.relative_to(TESTS)): sorted(_imported(p) & names) for p in _test_files()}
    assert not {k: v for k, v in importing.items() if v}, "move what they share into tests/support"


def test_no_folder_of_tests_is_named_like_a_module_the_product_imports() -> None:
    product = set().union(*(_imported(p) for tree in ("daemon", "tui", "plugins") for p in (REPO / tree).rglob("*.py")))
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert product & {"tensorrt", "numpy", "zmq"}  # the walk found the product's imports
    assert not folders & product, sorted(folders & product)
