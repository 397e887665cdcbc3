"""The infermux package's import graph has no cycle, and no import hides inside a function to dodge one.

The graph is read from the source (ast): daemon/ is the infermux package,
tui/ and plugins/ its subpackages. Only imports that run when a module is
imported count as edges: those at module level (also inside try/if), not
those under `if TYPE_CHECKING:`, which exist for annotations alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = {"infermux": ROOT / "daemon", "infermux.tui": ROOT / "tui", "infermux.plugins": ROOT / "plugins"}

# Function-local imports of infermux modules that are there on purpose: (module, imported) -> why.
ALLOWED_LOCAL = {
    **{(f"infermux.cli.{cmd}", "*"): "a subcommand imports what it runs inside `run`, so that `infermux --help` "
                                      "and the other subcommands start fast"
       for cmd in ("serve", "ctl", "status", "infer", "bench", "tune", "build", "keygen", "doctor")},
    ("infermux.cli", "infermux"): "`infermux --version` reads the version without importing the daemon",
    ("infermux.cli", "infermux.cli.common"): "the error guard is imported once a subcommand runs, not for --help",
    ("infermux.cli.common", "*"): "shared by the subcommands' parsers: numpy, zmq and the config parser load "
                                  "only when a command runs, so `infermux --help` stays fast",
    ("infermux.tui.top", "*"): "`infermux top` imports the console (textual) only when it runs",
    ("infermux.tui.app", "infermux.tui.views.routing"): "a view module loaded when its view is first shown",
    ("infermux.tui.actions", "infermux.cli.ctl"): "the console's command line parses values as `ctl` does, "
                                                   "imported on the first command typed",
    ("infermux.plugins.backends", "*"): "a backend (onnxruntime, TensorRT) is imported when a model needs it: "
                                        "the libraries are optional",
    ("infermux.vendor", "infermux"): "vendored wheels are put on sys.path before the package is imported",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package, tree in TREES.items():
        for path in tree.rglob("*.py"):
            parts = list(path.relative_to(tree).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _target(module: str, path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The infermux modules an import statement names (a `from X import y` may name module X.y)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports executed at import time: module level, inside try/if/with, not under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                todo += node.body
            todo += node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, ast.With):
            todo += node.body
    return found


def _local_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports inside a function body."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


def graph() -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {t for node in _runtime_imports(tree) for t in _target(module, path, node)}
        edges[module] = {t for t in targets if t in modules and t != module}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_path_in(group, edges) for group in groups]


def _path_in(group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A cycle inside `group`: from its first module, breadth first back to it."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for nxt in sorted(edges[node] & group):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                frontier.append(nxt)
    return sorted(group)


def test_the_package_has_no_import_cycle() -> None:
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_finder_names_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_function_imports_an_infermux_module_unless_it_says_why() -> None:
    unexplained = []
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _local_imports(tree):
            for target in _target(module, path, node)[:1]:
                if not target.startswith("infermux"):
                    continue
                if (module, "*") in ALLOWED_LOCAL or (module, target) in ALLOWED_LOCAL:
                    continue
                unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
    assert not unexplained, ("function-local imports of infermux modules (hiding a cycle? move them to the "
                             "top, or add them to ALLOWED_LOCAL with the reason):\n" + "\n".join(unexplained))


def test_the_daemon_imports_without_the_console_libraries() -> None:
    # Textual and Rich come with the `tui` extra only: the container image, a headless box and the
    # .deb without python3-textual run the daemon without them (a Rich import in the number
    # formatting that `infermux status` and the pipelines share once stopped the container's daemon
    # at start; that formatting is infermux.format now, and the console's markup tui/markup.py).
    import subprocess
    import sys
    daemon_side = sorted(m for m in _modules() if not m.endswith("__main__") and not m.startswith("infermux.tui"))
    script = ("import sys\n"
              "class Block:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name.split('.')[0] in ('rich', 'textual'):\n"
              "            raise ImportError(f'{name} is blocked: the daemon must not need it')\n"
              "sys.meta_path.insert(0, Block())\n"
              f"for m in {daemon_side!r}:\n"
              "    __import__(m)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
