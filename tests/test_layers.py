"""The tree shows the architecture (issue 20): the packages are layers, imports point only
downwards, no module imports one that imports it back (lazy imports in functions count,
and imports for type checking only), and no module is over about 600 lines without
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


def _imports(path: Path, modules: dict[str, Path], type_checking: bool = False):
    """``(line, module)`` for every bookfs module ``path`` imports at run time; with
    ``type_checking``, also those it imports for type checking only."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
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
        return None  # the package root: version, lazy Book
    return "vocabulary" if parts[1] in VOCABULARY else parts[1]


MODULES = _modules()
GRAPH = {m: {(line, t) for line, t in _imports(p, MODULES) if t in MODULES and t != m}
         for m, p in MODULES.items()}
#: the same with the imports made for type checking only (``if TYPE_CHECKING:``)
TYPED_GRAPH = {m: {(line, t) for line, t in _imports(p, MODULES, type_checking=True)
                   if t in MODULES and t != m}
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


@pytest.mark.parametrize("graph", ["run time", "type checking too"])
def test_no_import_circle(graph):
    """Tarjan's strongly connected components of the import graph: every one is a single
    module.  Imports made for type checking only count too (issue 36, item 2): a circle
    hidden behind ``if TYPE_CHECKING:`` is still two modules that cannot be read, or
    moved, one without the other."""
    GRAPH_ = GRAPH if graph == "run time" else TYPED_GRAPH
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for _, w in GRAPH_[v]:
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


def _all_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at run time or for type checking, top-level name
    included (``pyfuse3``, ``bookfs.fs.ops``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_append_engine_imports_no_fuse():
    """``bookfs/fs/append/`` runs without a mount (issue 36, item 1): none of its modules,
    nor any bookfs module they import, directly or not, imports pyfuse3."""
    engine = [m for m in MODULES if m.startswith("bookfs.fs.append")]
    assert engine, "bookfs/fs/append/ is gone"
    seen, todo, bad = set(), list(engine), []
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        imports = _all_imports(MODULES[m])
        if any(i == "pyfuse3" or i.startswith("pyfuse3.") for i in imports):
            bad.append(m)
        todo += [i for i in imports if i in MODULES]
    assert not bad, f"the append engine reaches pyfuse3 through {sorted(bad)}"


@pytest.mark.parametrize("package", sorted(m for m, p in MODULES.items()
                                           if p.name == "__init__.py" and m != "bookfs"))
def test_each_package_map_names_its_files(package):
    """A package's docstring is its map (issue 36, item 5: front doors that do not drift):
    it names each of its modules and subpackages as ````name````, one line each."""
    path = MODULES[package]
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    here = path.parent
    names = sorted({p.stem for p in here.glob("*.py") if p.stem not in ("__init__", "__main__")}
                   | {p.name for p in here.iterdir() if (p / "__init__.py").is_file()})
    missing = [n for n in names if f"``{n}``" not in doc]
    assert not missing, f"{path.relative_to(ROOT)}: its map does not name {missing}"


def test_follow_names_the_live_tail_only():
    """In ``bookfs/fs``, "follow" names ``follow/`` (the live tail: ``tail``,
    ``nodes/follow_dir``) and nothing else; a read-only mount's look at its log is the
    ``watch`` (issue 36, item 5)."""
    fs = PKG / "fs"
    modules = sorted(p.relative_to(fs).as_posix() for p in fs.rglob("*follow*.py"))
    assert modules == ["nodes/follow_dir.py"]
    named = []
    for path in fs.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "name", None) or getattr(node, "attr", None) or ""
            if "follower" in name.lower() or name in ("follow", "Following"):
                named.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not named, named


#: the modules that know how a deed is laid out: the byte layouts, the one walk per layout,
#: the framing scan, the checks of damaged logs, and telling the layouts apart
DEED_MODULES = {"layout", "deeds", "framing", "deedcheck", "vere_deeds", "detect"}
#: the names that spell a deed's bytes out
DEED_BYTES = {"DEED_LEN", "DEED_TAIL", "DEED_HEAD", "DEED_OVERHEAD", "DEED_TAIL_SIZE",
              "DEED_HEAD_SIZE", "VERE_DEED_OVERHEAD", "PADDED_DEED_OVERHEAD", "encode_deed",
              "deed_parts", "deed_size", "scan_deeds"}


def test_deeds_are_walked_in_one_place():
    """Every reader and writer of deeds (engines, recovery, index, segments, Spark rows,
    the mount) goes through its layout's walk in ``formats/deeds.py`` (``UIP``,
    ``VERE``); no other module spells a deed's bytes out (issue 36, item 4).  The
    compiled row builder (``spark/_rows.pyx``) is the one twin, held equal by
    ``tests/test_rows.py``."""
    spelled = []
    for path in PKG.rglob("*.py"):
        if path.parent.name == "formats" and path.stem in DEED_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom)
                     else [getattr(node, "id", None) or getattr(node, "attr", None)])
            spelled += [f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                        for n in names if n in DEED_BYTES]
    assert not spelled, spelled
