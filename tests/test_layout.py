"""The package's layout: no import loops inside ``sglang_ssd`` and no runtime file over 450 lines.

The import graph has one node per module of ``sglang_ssd`` (a package is its ``__init__``) and an edge
for every import statement that names another module of the package, wherever it stands: at module
level, inside ``if TYPE_CHECKING:``, or inside a function. Python only trips over a loop among
module-level imports (a partially initialised module), but a loop through a deferred import or a
type-only import is the same tangle of responsibilities, only hidden: the two loops this test was
written against (``draft/attention.py`` with its backends through the backend factory,
``draft/engine.py`` with ``draft/lifetime.py`` through a type-only import) were both of that kind.
So any loop fails, and the message marks each edge as module-level, type-only or deferred.

Relative imports are resolved against the importing module's package. ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``. Importing ``a.b.c`` also runs the
``__init__`` of ``a`` and ``a.b``; those implicit edges are left out, since every package ``__init__``
that imports its own submodules would otherwise form a loop with them.

``importlib.import_module`` and ``__import__`` hide edges from this graph, so the runtime modules may
not use them, save for the lazy names of ``wire/__init__.py`` (targets are its own submodules, none of
which imports the package ``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sglang_ssd"
OFFLINE = PACKAGE / "tools"  # offline tools (training, conversion, checks), not loaded when serving
MAX_LINES = 450
SOURCES = ("*.py", "*.c", "*.cpp", "*.h")
DYNAMIC_IMPORT_ALLOWED = {"sglang_ssd/wire/__init__.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with its kind: "module-level", "type-only" or "deferred"."""
    found = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, kind))
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "deferred")
            elif isinstance(child, ast.If) and is_type_checking(child.test) and kind == "module-level":
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "type-only")
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                visit(child, kind)

    visit(tree, "module-level")
    return found


def owning_module(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    found = [owning_module(n) for n in names if n == "sglang_ssd" or n.startswith("sglang_ssd.")]
    return [t for t in found if t is not None and t != module]


def import_graph() -> dict[str, dict[str, tuple[str, int]]]:
    """module -> {imported module: (kind, line)}; a module-level edge wins over a type-only or deferred
    one between the same pair."""
    rank = {"module-level": 0, "type-only": 1, "deferred": 2}
    graph: dict[str, dict[str, tuple[str, int]]] = {}
    for module, path in MODULES.items():
        edges: dict[str, tuple[str, int]] = {}
        for node, kind in import_nodes(ast.parse(path.read_text(), filename=str(path))):
            for target in targets(module, node):
                if target not in edges or rank[kind] < rank[edges[target][0]]:
                    edges[target] = (kind, node.lineno)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, tuple[str, int]]]) -> list[str] | None:
    """One import loop as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (loop := visit(nxt)):
                return loop
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (loop := visit(start)):
            return loop
    return None


def test_the_graph_sees_relative_and_absolute_imports():
    graph = import_graph()
    # relative imports (draft/engine.py, wire/client.py) resolve against the importing package
    assert "sglang_ssd.draft.lifetime" in graph["sglang_ssd.draft.engine"]
    assert "sglang_ssd.wire.messages" in graph["sglang_ssd.wire.client"]
    assert graph["sglang_ssd.draft.engine"]["sglang_ssd.draft.lifetime"][0] == "module-level"


def test_a_planted_loop_is_found():
    wire = {
        m: {t: e for t, e in edges.items() if t.startswith("sglang_ssd.wire.")}
        for m, edges in import_graph().items()
        if m.startswith("sglang_ssd.wire.")
    }
    assert find_cycle(wire) is None
    wire["sglang_ssd.wire.messages"]["sglang_ssd.wire.client"] = ("deferred", 1)
    loop = find_cycle(wire)
    assert loop is not None and "sglang_ssd.wire.client" in loop and "sglang_ssd.wire.messages" in loop


def test_no_import_cycle():
    graph = import_graph()
    loop = find_cycle(graph)
    if loop:
        steps = []
        for a, b in zip(loop, loop[1:]):
            kind, line = graph[a][b]
            steps.append(f"  {MODULES[a].relative_to(ROOT)}:{line} imports {b} ({kind})")
        raise AssertionError("import loop inside sglang_ssd:\n" + "\n".join(steps))


def test_no_dynamic_imports_in_runtime_modules():
    hits = []
    for path in MODULES.values():
        rel = str(path.relative_to(ROOT))
        if path.is_relative_to(OFFLINE) or rel in DYNAMIC_IMPORT_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in ("import_module", "__import__"):
                    hits.append(f"{rel}:{node.lineno}")
    assert not hits, f"dynamic imports hide edges from the import graph; use plain imports: {hits}"


def runtime_sources() -> list[Path]:
    files = {p for pattern in SOURCES for p in PACKAGE.rglob(pattern)}
    return sorted(p for p in files if not p.is_relative_to(OFFLINE) and "_build" not in p.parts)


def test_no_runtime_file_over_450_lines():
    assert len(runtime_sources()) > 50
    long = {
        str(p.relative_to(ROOT)): n
        for p in runtime_sources()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"runtime files over {MAX_LINES} lines (split them by responsibility): {long}"
