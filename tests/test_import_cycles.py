"""No import cycles among dpsummary's modules (issue 30).

Every module under ``dpsummary/`` is parsed with :mod:`ast` (nothing is imported), and each
``import`` / ``from ... import`` of a dpsummary module becomes an edge of one of three kinds:

* ``module``: executed when the module is imported (module body, class bodies, module-level
  ``if`` / ``try`` blocks). A cycle of these edges makes import order matter (a name read from a
  half-initialised module) and ties the modules into one unit: :func:`test_no_module_level_import_cycles`
  fails on any.
* ``deferred``: inside a function body (run on first call; the usual way this package keeps
  ``--help`` light). A cycle through a deferred edge cannot break an import, but it still says two
  modules depend on each other: :func:`test_no_import_cycles_through_deferred_imports` fails on
  any cycle of module-level and deferred edges together that is not in
  :data:`KNOWN_DEFERRED_CYCLES` (a ratchet: each entry says why it is still there).
* ``typing``: under ``if TYPE_CHECKING:`` (never executed). It cannot break an import, but a
  signature that names a module is a dependency all the same (issue 37: the mechanism interface
  named the pipeline's records only for type checking, and tied 11 files into one circle):
  :func:`test_no_import_cycles_through_type_only_imports` fails on any cycle of all three kinds
  together, with no allowance (issue 49 removed the last one, private/mechanism.py <->
  private/score_stats.py, by moving the protocol they shared to private/randomness.py).

The layering issue 37 asks for is checked directly too: the records a mechanism receives live in
``dpsummary/plan.py``, below both the pipeline (``dpsummary/release.py``) and
``dpsummary/mechanisms/``; :func:`test_the_mechanisms_never_name_the_pipeline` fails if any
module of ``dpsummary/mechanisms/`` imports ``dpsummary.release`` by any kind of import, or if
``dpsummary/plan.py`` imports either of them.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module of the package, else
to ``pkg`` itself (``name`` is then an attribute of ``pkg/__init__.py``). Importing a submodule
also runs its parent packages' ``__init__``: that implicit edge is not counted (every package
``__init__`` that re-exports its submodules would otherwise be a cycle with each of them).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "dpsummary"
PACKAGE = PACKAGE_DIR.name


def _module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules_in(package_dir: Path) -> dict[str, Path]:
    return {_module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}


@cache
def _modules() -> dict[str, Path]:
    return _modules_in(PACKAGE_DIR)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module with its kind (``module``, ``deferred`` or ``typing``)."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, kind
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, "typing" if kind == "typing" else "deferred")
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, "module")


def _targets(module: str, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The dpsummary modules an import statement in ``module`` loads."""
    package = module.split(".")[0]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == package and a.name in known]
    is_package = known[module].name == "__init__.py"
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if source.split(".")[0] != package:
        return []
    out = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in known:
            out.append(sub)
        elif source in known:
            out.append(source)
    return out


def _edges_in(known: dict[str, Path]) -> dict[tuple[str, str], set[str]]:
    """``(importer, imported) -> kinds`` over the modules ``known``."""
    edges: dict[tuple[str, str], set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, kind in _imports(tree):
            for target in _targets(name, node, known):
                if target != name:
                    edges.setdefault((name, target), set()).add(kind)
    return edges


@cache
def _edges() -> dict[tuple[str, str], set[str]]:
    """``(importer, imported) -> kinds`` over every dpsummary module."""
    return _edges_in(_modules())


def _graph(kinds: set[str], edges: dict[tuple[str, str], set[str]] | None = None,
           modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in (_modules() if modules is None else modules)}
    for (a, b), ks in (_edges() if edges is None else edges).items():
        if ks & kinds:
            graph[a].add(b)
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); the components of more than one module, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def _a_cycle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle through a strongly connected component (breadth-first back to its first module)."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError("not a strongly connected component")


def cycles(kinds: set[str]) -> list[list[str]]:
    """One representative cycle per strongly connected component of the import graph."""
    graph = _graph(kinds)
    return [_a_cycle(c, graph) for c in _strongly_connected(graph)]


def _describe(found: list[list[str]]) -> str:
    return "; ".join(" -> ".join(c) for c in found)


#: Cycles through deferred imports that exist today, each with why it is still there. A ratchet:
#: a new cycle fails, and so does an entry here once its cycle is gone (delete the entry).
KNOWN_DEFERRED_CYCLES: dict[frozenset[str], str] = {}

#: The pipeline, the package of mechanisms and the records between them (issue 37).
PIPELINE = f"{PACKAGE}.release"
MECHANISMS = f"{PACKAGE}.mechanisms"
RECORDS = f"{PACKAGE}.plan"


def test_no_module_level_import_cycles() -> None:
    """The import-time graph has no cycle (the circle issue 30 names, private/kernel.py ->
    private/mechanism.py -> private/score_stats.py -> private/kernel.py, included)."""
    found = cycles({"module"})
    assert not found, f"import cycles among dpsummary modules: {_describe(found)}"


def test_no_import_cycles_through_deferred_imports() -> None:
    graph = _graph({"module", "deferred"})
    comps = {frozenset(c): c for c in _strongly_connected(graph)}
    new = [_a_cycle(c, graph) for k, c in comps.items() if k not in KNOWN_DEFERRED_CYCLES]
    assert not new, f"import cycles among dpsummary modules (deferred imports included): {_describe(new)}"
    gone = [sorted(k) for k in KNOWN_DEFERRED_CYCLES if k not in comps]
    assert not gone, f"these cycles are gone: delete them from KNOWN_DEFERRED_CYCLES: {gone}"


def test_no_import_cycles_through_type_only_imports() -> None:
    """Cycles that need a ``TYPE_CHECKING`` import to close fail too, anywhere in dpsummary/ and
    with no allowance (issue 49): the 11-file circle dpsummary/mechanisms/base.py -> (type-only)
    dpsummary/release.py -> dpsummary/mechanisms/ that issue 37 names, or private/mechanism.py
    <-> private/score_stats.py that issue 49 removed, would fail here. Two modules that need each
    other's types put the shared type in a module below both (private/randomness.py)."""
    graph = _graph({"module", "deferred", "typing"})
    comps = {frozenset(c): c for c in _strongly_connected(graph)}
    new = [_a_cycle(c, graph) for k, c in comps.items() if k not in KNOWN_DEFERRED_CYCLES]
    assert not new, f"import cycles among dpsummary modules (type-only imports included): {_describe(new)}"


def test_a_planted_type_only_cycle_is_found(tmp_path: Path) -> None:
    """The whole path (files parsed, edges kinded, components found) on a planted package: two
    modules that import each other only under ``if TYPE_CHECKING:`` (as private/mechanism.py and
    private/score_stats.py did) form a type-only cycle and nothing else; the same package with
    the shared type moved below both has none."""
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from planted.a import A\n")
    modules = _modules_in(pkg)
    edges = _edges_in(modules)
    assert edges == {("planted.a", "planted.b"): {"typing"}, ("planted.b", "planted.a"): {"typing"}}
    assert _strongly_connected(_graph({"module", "deferred"}, edges, modules)) == []
    assert _strongly_connected(_graph({"module", "deferred", "typing"}, edges, modules)) == [["planted.a", "planted.b"]]
    (pkg / "b.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from planted.types import A\n")
    (pkg / "types.py").write_text("class A: ...\n")
    modules = _modules_in(pkg)
    assert _strongly_connected(_graph({"module", "deferred", "typing"}, _edges_in(modules), modules)) == []


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_mechanisms_never_name_the_pipeline() -> None:
    """No module of dpsummary/mechanisms/ imports dpsummary.release, not even for type checking
    or inside a function: a mechanism receives dpsummary.plan's records, which import neither
    the pipeline nor the mechanisms (issue 37)."""
    assert RECORDS in _modules() and PIPELINE in _modules() and MECHANISMS in _modules()
    edges = _edges()
    upward = sorted(f"{a} -> {b} ({', '.join(sorted(kinds))})" for (a, b), kinds in edges.items()
                    if (_in(a, MECHANISMS) and _in(b, PIPELINE))
                    or (a == RECORDS and (_in(b, PIPELINE) or _in(b, MECHANISMS))))
    assert not upward, ("the mechanisms name the pipeline (import what they need from dpsummary.plan): "
                        + "; ".join(upward))
    assert (PIPELINE, RECORDS) in edges and (f"{MECHANISMS}.base", RECORDS) in edges, \
        "the pipeline and the mechanism interface no longer read dpsummary.plan: update this test"


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The finder itself: a planted three-module circle is found, a chain is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    comps = _strongly_connected(graph)
    assert comps == [["a", "b", "c"]]
    assert _a_cycle(comps[0], graph) == ["a", "b", "c", "a"]
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_import_parser_sees_every_kind_of_import() -> None:
    tree = ast.parse(
        "from . import x\nimport dpsummary.y\nif TYPE_CHECKING:\n    from .z import T\n"
        "def f():\n    from .w import g\nclass C:\n    from .v import h\n"
    )
    kinds = [(type(n).__name__, k) for n, k in _imports(tree)]
    assert kinds == [("ImportFrom", "module"), ("Import", "module"), ("ImportFrom", "typing"),
                     ("ImportFrom", "deferred"), ("ImportFrom", "module")]
    known = {"dpsummary.private.kernel": Path("kernel.py"), "dpsummary.private": Path("__init__.py"),
             "dpsummary.private.mechanism": Path("mechanism.py"), "dpsummary.data": Path("__init__.py")}
    node = ast.parse("from .mechanism import clip_rows\nfrom ..data import Schema\nfrom . import kernel").body
    assert _targets("dpsummary.private.kernel", node[0], known) == ["dpsummary.private.mechanism"]  # type: ignore[arg-type]
    assert _targets("dpsummary.private.kernel", node[1], known) == ["dpsummary.data"]  # type: ignore[arg-type]
    assert _targets("dpsummary.private.kernel", node[2], known) == ["dpsummary.private.kernel"]  # type: ignore[arg-type]
    assert _edges(), "no dpsummary import found: the parser is blind"


if __name__ == "__main__":
    for label, kinds in (("module-level", {"module"}), ("with deferred", {"module", "deferred"}),
                         ("with type-only", {"module", "deferred", "typing"})):
        print(label, _describe(cycles(kinds)) or "none")
