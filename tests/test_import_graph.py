"""The kit's layers point one way: no import circle anywhere in the installed package, and the core
(the SPEC resolver, the runner, the contract) imports no transport.

Read from the source with ``ast``, so an import inside a function is an edge like any other: it
runs the first time the function does, and a circle through it is a circle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CORE = ("pytest_cbatch.impls", "pytest_cbatch.runner", "pytest_cbatch.contract")
TRANSPORTS = ("pytest_cbatch.live", "pytest_cbatch.sandbox", "pytest_cbatch.kinds")


def package_folders(root: Path) -> dict[str, Path]:
    """Each installed package under ``pytest_cbatch`` and the checkout folder it comes from (pyproject's package-dir)."""
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = tool["package-dir"]
    return {package: root / folders.get(package, package.replace(".", "/")) for package in tool["packages"]
            if package == "pytest_cbatch" or package in folders}


def modules(folders: Mapping[str, Path]) -> dict[str, Path]:
    """Every module of the package tree, by dotted name (a package by its own name)."""
    found = {}
    for package, folder in folders.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imported_names(name: str, path: Path) -> Iterator[str]:
    """The dotted names an import statement anywhere in the module names (``from X import y`` gives X.y: the
    submodule y, or X itself when y is a name in it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                where = f"{base}.{node.module}" if node.module else base
            else:
                where = node.module or ""
            yield from (f"{where}.{alias.name}" if alias.name != "*" else where for alias in node.names)


def import_graph(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``known`` it imports (the longest known prefix of each imported name)."""
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = set()
        for target in imported_names(name, path):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def reachable(graph: Mapping[str, Iterable[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(modules(package_folders(ROOT)))


def test_the_graph_reads_every_package_and_its_function_level_imports(graph: dict[str, set[str]]) -> None:
    assert {"pytest_cbatch.reference.scheduler_sim", "pytest_cbatch.gpu_checks", "pytest_cbatch.sandbox"} <= set(graph)
    assert len(graph) > 80, sorted(graph)
    assert "pytest_cbatch.contract" in graph["pytest_cbatch.runner"]            # from .contract import ...
    assert "pytest_cbatch.live.replay" in graph["pytest_cbatch.kinds.live"]    # inside a function
    assert "pytest_cbatch.live" in graph["pytest_cbatch.live.backends"]        # from .. import live


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("from . import b\n")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from .sub.b import g\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("from .. import a\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    graph = import_graph(modules({"pkg": tmp_path / "pkg"}))
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_no_import_circle_anywhere_in_the_package(graph: dict[str, set[str]]) -> None:
    found = circles(graph)
    assert not found, "import circles (each a set of modules that import each other, function-level imports " \
                      "included):\n" + "\n".join("  " + " <-> ".join(c) for c in found)


@pytest.mark.parametrize("core", CORE)
def test_the_core_imports_no_transport(graph: dict[str, set[str]], core: str) -> None:
    starts = [name for name in graph if name == core or name.startswith(core + ".")]
    assert starts
    for start in starts:
        transports = sorted(m for m in reachable(graph, start) if m.startswith(TRANSPORTS))
        assert not transports, f"{start} imports, directly or through others, the transport module(s) {transports}"
