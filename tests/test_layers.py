"""The tree shows the architecture (issue 20): the packages are layers, imports point only
downwards, no module imports one that imports it back (lazy imports in functions count;
imports for type checking only do not), and no module is over about 600 lines without
saying why in its docstring. Read from the source with ``ast``, so a violation is named
with its file and line."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "bookfs"

#: The layers, top first (docs/architecture.md). A module may import from its own layer
#: and the ones after it. ``errors``, ``types`` and ``compiled`` are the shared vocabulary, at the bottom.
LAYERS = ["spark", "cli", "fs", "formats", "noun", "vocabulary"]
VOCABULARY = {"errors", "types", "compiled"}
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: dict[str, Path]):
    """``(line, module)`` for every bookfs module ``path`` imports at run time."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "bookfs":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield node.lineno, sub if sub in modules else node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "bookfs":
                    yield node.lineno, alias.name


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) == 1:
        return None  # the package root: version, MOVED, lazy Book
    return "vocabulary" if parts[1] in VOCABULARY else parts[1]


MODULES = _modules()
GRAPH = {m: {(line, t) for line, t in _imports(p, MODULES) if t in MODULES and t != m}
         for m, p in MODULES.items()}


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer = _layer(module)
        assert layer is None or layer in LAYERS, f"{MODULES[module]}: not in a layer {LAYERS}"


def test_imports_point_downwards():
    bad = []
    for module, edges in GRAPH.items():
        mine = _layer(module)
        for line, target in edges:
            theirs = _layer(target)
            if mine is None or theirs is None:
                continue
            if LAYERS.index(theirs) < LAYERS.index(mine):
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {mine} imports "
                           f"{target} ({theirs}, a layer above)")
    assert not bad, "\n".join(bad)


def test_no_import_circle():
    """Tarjan's strongly connected components of the import graph: every one is a single
    module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for _, w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size_is_stated(module):
    path = MODULES[module]
    lines = len(path.read_text().splitlines())
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "600 lines" in doc, (f"{path.relative_to(ROOT)} has {lines} lines; split it, or "
                                f"say in its docstring why it is over 600 lines")
    assert lines <= MAX_LINES * 1.1, f"{path.relative_to(ROOT)} has {lines} lines"


def test_the_tree_reads_like_the_architecture_page():
    """``ls bookfs`` and docs/architecture.md name the same packages and modules."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    for module, path in MODULES.items():
        name = path.name if path.name != "__init__.py" else path.parent.name + "/"
        if name in ("__init__.py", "__main__.py", "bookfs/"):
            continue
        assert name in page, f"docs/architecture.md does not name {path.relative_to(ROOT)}"
    assert sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__") \
        == sorted(set(LAYERS) - {"vocabulary"})
    assert os.path.isfile(PKG / "errors.py") and os.path.isfile(PKG / "types.py")
