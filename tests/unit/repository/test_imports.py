"""The infermux package is built in layers: no package imports one above it, and no module cycle.

The graph is read from the source (ast): daemon/ is the infermux package,
tui/ and plugins/ its subpackages. Every package sits in one layer of
LAYERS, written bottom to top; a module may import its own layer and the
layers below, never one above, whether the import runs when the module is
imported or later, inside a function, or by a string handed to `importlib`
(the command table names its subcommands' modules). Only imports under
`if TYPE_CHECKING:` are left out: they exist for annotations and never run.
So no two packages can import each other, nothing imports `cli`, the
command line at the top, and nothing below the console imports `tui`. Within a package, the modules' import-time
imports have no cycle either, and an import inside a function says why it
is there (ALLOWED_LOCAL), so none hides a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[3]
TREES = {"infermux": ROOT / "daemon", "infermux.tui": ROOT / "tui", "infermux.plugins": ROOT / "plugins"}

# The layers, bottom to top: (layer, the modules and packages in it, its one job). docs/architecture.md's
# package table follows this order. A name matches the module itself and, but for the root package
# `infermux`, every module inside it.
LAYERS: list[tuple[str, tuple[str, ...], str]] = [
    ("plugins", ("infermux.plugins",),
     "backends and processors behind their protocols; they know nothing of the daemon"),
    ("root", ("infermux", "infermux.config", "infermux.events", "infermux.protocol", "infermux.protocol_types",
              "infermux.protocol_encode", "infermux.format", "infermux.vendor", "infermux.signing",
              "infermux.cameras.config", "infermux.cameras.gate"),
     "what every part reads: the configuration, events, the wire protocol, numbers as text, engine signatures"),
    ("transport", ("infermux.transport",),
     "sockets and what a peer or a message may cost"),
    ("execution", ("infermux.execution",),
     "running an admitted request: the job, the placement contract, queues, batches, executors, the hot placement"),
    ("models", ("infermux.models",),
     "models, versions and their states; the memory budget"),
    ("workers", ("infermux.workers",),
     "the cold placement: worker processes and their messages"),
    ("sinks", ("infermux.sinks",),
     "events leaving the box: each sink's durable spool and the thread that delivers it"),
    ("pipelines", ("infermux.pipelines",),
     "processor and model steps run on a frame"),
    ("swap", ("infermux.swap",),
     "keeping what is served in step with the engine directory and the configuration"),
    ("frontend", ("infermux.frontend",),
     "the frontend loop and the router: requests in, replies out"),
    ("cameras", ("infermux.cameras.supervisor", "infermux.cameras.source", "infermux.cameras.table",
                 "infermux.cameras.series", "infermux.cameras.gstreamer", "infermux.cameras.forkserver"),
     "cameras the daemon reads itself: their processes, supervised; what they decode and how frames travel"),
    ("admin", ("infermux.admin",),
     "operators and the service manager: admin socket, stats, metrics, sd_notify"),
    ("app", ("infermux.app",),
     "the composition root: the daemon's parts built in order, and its lifecycle"),
    # A camera's process is a client of the daemon; the cameras package's other modules sit lower (above).
    ("client", ("infermux.client", "infermux.cameras.child", "infermux.cameras.zygote", "infermux.cameras"),
     "the public client library"),
    ("tui", ("infermux.tui",),
     "the console"),
    ("cli", ("infermux.cli", "infermux.__main__"),
     "the `infermux` command"),
]

# Imports inside a function, of infermux modules, that are there on purpose: (module, imported) -> why.
# They obey the layers like any other import; this only says why they wait for the function to run.
ALLOWED_LOCAL = {
    **{(f"infermux.cli.{cmd}", "*"): "a subcommand imports what it runs inside `run`, so that `infermux --help` "
                                      "and the other subcommands start fast"
       for cmd in ("serve", "ctl", "status", "infer", "bench", "tune", "keygen", "doctor", "sign", "record", "replay",
                   "top")},
    ("infermux.cli", "infermux"): "`infermux --version` reads the version without importing the daemon",
    ("infermux.cameras.source", "infermux.cameras.gstreamer"): "the GStreamer path imports the errors defined here; "
                                                               "loaded only where a camera may use it",
    ("infermux.cli", "infermux.cli.common"): "the error guard is imported once a subcommand runs, not for --help",
    ("infermux.cli.common", "*"): "shared by the subcommands' parsers: numpy, zmq and the config parser load "
                                  "only when a command runs, so `infermux --help` stays fast",
    ("infermux.transport.wire", "infermux.transport"): "the compiled socket calls (`_wire`) are optional: "
                                                       "imported where their absence is handled",
    ("infermux.tui.app", "infermux.tui.views.routing"): "a view module loaded when its view is first shown",
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


def _target(module: str, is_package: bool, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The modules an import statement names (a `from X import y` may name module X.y)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST, functions: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run: those at import time (module level, also inside try/if/with/class)
    and, with `functions`, those inside functions; never those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]), functions)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not functions:
            continue
        else:
            yield from _imports(child, functions)


def _local_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports inside a function body."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


# Calls whose string arguments name something other than a module to import: a logger, and an entry-point
# group (`discovery.specs("infermux.sinks", ...)`, the plugins of a kind other packages may add).
NOT_IMPORTS = {"getLogger", "specs"}


def _programs(tree: ast.Module) -> set[int]:
    """Strings after `-m` in a command line: a module run as a process of its own (a camera's, a worker's),
    across a process boundary, not imported."""
    return {id(b) for node in ast.walk(tree) if isinstance(node, (ast.List, ast.Tuple))
            for a, b in zip(node.elts, node.elts[1:]) if isinstance(a, ast.Constant) and a.value == "-m"}


def _named(tree: ast.Module, sources: dict[str, tuple[bool, str]]) -> Iterator[tuple[str, int]]:
    """Modules a string names, to be imported by name: `importlib.import_module("infermux.x")`, a
    command table's `"infermux.cli.serve"`. The bare package name (a folder, a group, a shared-memory
    prefix), logger names (`logging.getLogger("infermux.swap")`, an import of nothing), entry-point groups
    and a module run with `python -m` are not imports."""
    loggers = {id(arg) for call in ast.walk(tree) if isinstance(call, ast.Call)
               and getattr(call.func, "attr", getattr(call.func, "id", "")) in NOT_IMPORTS for arg in call.args}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in sources
                and node.value != "infermux" and id(node) not in loggers | _programs(tree)):
            yield node.value, node.lineno


def edges(sources: dict[str, tuple[bool, str]], functions: bool) -> dict[str, dict[str, int]]:
    """module -> {infermux module it imports: line}, from each module's (is a package, source text).

    With `functions`, every import that may ever run: also those inside functions, and the modules a
    string names for `importlib` (the command table); without, those that run at import time."""
    found: dict[str, dict[str, int]] = {}
    for module, (is_package, text) in sources.items():
        tree = ast.parse(text, module)
        found[module] = {}
        for node in _imports(tree, functions):
            for target in _target(module, is_package, node):
                if target in sources and target != module:
                    found[module].setdefault(target, node.lineno)
        for target, line in _named(tree, sources) if functions else ():
            if target != module:
                found[module].setdefault(target, line)
    return found


def _sources() -> dict[str, tuple[bool, str]]:
    return {module: (path.name == "__init__.py", path.read_text()) for module, path in _modules().items()}


def graph() -> dict[str, set[str]]:
    """Imports that run when a module is imported (the graph a cycle would break)."""
    return {module: set(targets) for module, targets in edges(_sources(), functions=False).items()}


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...], str]] = LAYERS) -> int | None:
    """The index of `module`'s layer in `layers` (bottom 0), or None where no layer names it."""
    for index, (_, names, _) in enumerate(layers):
        if any(module == name or (name != "infermux" and module.startswith(name + ".")) for name in names):
            return index
    return None


def upward(imports: dict[str, dict[str, int]], layers: list[tuple[str, tuple[str, ...], str]] = LAYERS,
           ) -> list[str]:
    """Every import of a module in a higher layer, as 'module:line (layer) imports target (layer)'."""
    found = []
    for module, targets in sorted(imports.items()):
        low = layer_of(module, layers)
        for target, line in sorted(targets.items()):
            high = layer_of(target, layers)
            if low is not None and high is not None and high > low:
                found.append(f"{module}:{line} ({layers[low][0]}) imports {target} ({layers[high][0]})")
    return found


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


def test_every_module_is_in_a_layer() -> None:
    unplaced = sorted(m for m in _modules() if layer_of(m) is None)
    assert not unplaced, f"modules in no layer (add their package to LAYERS, where it belongs): {unplaced}"


def _architecture_rows() -> list[tuple[str, str]]:
    """docs/architecture.md's package table: (layer, the rest of its row), top row first."""
    text = (ROOT / "docs/architecture.md").read_text()
    table = text[text.index("| layer (bottom to top) |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        layer, rest = line.split("|", 2)[1:]
        rows.append((layer.strip().strip("`").rstrip("/"), rest))
    return rows


def test_the_architecture_table_has_the_layers_in_order_and_names_every_module() -> None:
    rows = _architecture_rows()
    names = [layer for layer, _, _ in LAYERS]
    assert [layer for layer, _ in rows] == names
    # The console's row points at docs/console.md for its many views instead of naming each.
    unnamed = [f"{layer}: {module}" for layer, row in rows if layer != "tui"
               for module, path in _modules().items() if names[layer_of(module) or 0] == layer
               and path.stem not in ("__init__", "__main__") and path.stem not in row]
    assert not unnamed, f"modules docs/architecture.md's package table does not name: {unnamed}"


def test_no_package_imports_a_layer_above_it() -> None:
    found = upward(edges(_sources(), functions=True))
    assert not found, ("imports of a higher layer (move the type down, or pass a callable or Protocol up; "
                       "LAYERS lists the order):\n" + "\n".join(found))


def test_the_layer_check_catches_an_upward_import_even_inside_a_function() -> None:
    layers = [("low", ("infermux.low",), ""), ("high", ("infermux.high",), "")]
    sources = {
        "infermux.low": (True, "def f():\n    from infermux.high import tool\n"),
        "infermux.low.types": (False, "from typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from infermux.high import tool\n"),
        "infermux.high": (True, "from infermux.low import types\nfrom . import tool\n"),
        "infermux.high.tool": (False, "import infermux.low.types\n"),
    }
    assert upward(edges(sources, functions=True), layers) == [
        "infermux.low:2 (low) imports infermux.high (high)",
        "infermux.low:2 (low) imports infermux.high.tool (high)"]
    assert upward(edges(sources, functions=False), layers) == []  # the import in f runs only when f does


def test_the_layer_check_sees_a_module_named_by_a_string_for_importlib() -> None:
    layers = [("low", ("infermux.low",), ""), ("high", ("infermux.high",), "")]
    sources = {
        "infermux.low": (True, "import importlib\nCOMMANDS = {'run': ('infermux.high.tool', 'help')}\n"
                               "def load():\n    return importlib.import_module('infermux.high')\n"),
        "infermux.low.log": (False, "import logging\nlog = logging.getLogger('infermux.high')\n"
                                    "HOME = 'infermux'\n"),
        "infermux.high": (True, ""),
        "infermux.high.tool": (False, ""),
    }
    assert upward(edges(sources, functions=True), layers) == [
        "infermux.low:4 (low) imports infermux.high (high)",
        "infermux.low:2 (low) imports infermux.high.tool (high)"]
    assert layer_of("infermux.other", layers) is None and layer_of("infermux", LAYERS) == 1
    assert layer_of("infermux.execution.job") == layer_of("infermux.execution")


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
            for target in _target(module, path.name == "__init__.py", node)[:1]:
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


DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- layers: generated by tests/unit/repository/test_imports.py from the imports; do not edit -->"
END = "<!-- end of the generated layers -->"


# docs/architecture.md's picture of the layers is drawn from the imports by `picture`, and this file
# checks that it still matches them. When an import adds or removes an arrow between two layers,
# regenerate it with `.venv/bin/python tests/unit/repository/test_imports.py`, which rewrites the block
# between the markers.


def layer_imports() -> dict[str, set[str]]:
    """layer -> the other layers its modules import."""
    found: dict[str, set[str]] = {name: set() for name, _, _ in LAYERS}
    for module, targets in edges(_sources(), functions=True).items():
        low = layer_of(module)
        if low is None:
            continue
        for target in targets:
            high = layer_of(target)
            if high is not None and high != low:
                found[LAYERS[low][0]].add(LAYERS[high][0])
    return found


def picture() -> str:
    """The layers top to bottom, each with the layers it imports (nearest first), in a text block."""
    names = [name for name, _, _ in LAYERS]
    imports = layer_imports()
    width = max(len(name) for name in names)
    lines = ["```text", f"{'layer':<{width}} ─▶ the layers below it that its modules import"]
    for index in range(len(names) - 1, -1, -1):
        name = names[index]
        below = sorted(imports[name], key=names.index, reverse=True)
        lines.append(f"{name:<{width}} ─▶ {' '.join(below) if below else '(nothing of infermux)'}")
        if index:
            lines.append("│")
    lines.append("```")
    return "\n".join(lines)


def committed() -> str:
    """The picture as docs/architecture.md has it now, between the markers."""
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n")


def test_the_architecture_picture_of_the_layers_matches_the_imports() -> None:
    assert committed() == picture(), (
        "docs/architecture.md's picture of the layers no longer matches the imports: regenerate it with "
        "`.venv/bin/python tests/unit/repository/test_imports.py` (and say in the text what the new arrow is for)")


def test_the_picture_leads_architecture_md_after_the_construction_order() -> None:
    text = DOC.read_text()
    first_section = text.index("\n## ")
    assert text[first_section:].startswith("\n## The composition root"), "architecture.md opens with the root"
    assert text.index("order of construction") < text.index(BEGIN) < text.index("\n## ", first_section + 1)


def _rewrite() -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{picture()}\n{END}{tail}")


if __name__ == "__main__":
    _rewrite()
    print(f"rewrote the picture of the layers in {DOC.relative_to(ROOT)}")
