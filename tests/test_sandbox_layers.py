"""The sandbox is in layers: no import circle inside ``pytest_cbatch/sandbox/``, the protocol module at the
bottom imports nothing else of the sandbox, and the child's side and the grader's side do not import each
other.  Imports are read with ``ast``, function-level ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_cbatch.sandbox as sandbox

PACKAGE = "pytest_cbatch.sandbox"
FOLDER = Path(sandbox.__file__).parent
CHILD_SIDE = {"child", "child_search"}
GRADER_SIDE = {"process", "search", "proxies"}


def sandbox_imports(source: str, module: str) -> set[str]:
    """The modules of the sandbox package that ``source`` (module ``module`` of it) imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package (level 1) or above it
                base = PACKAGE.rsplit(".", node.level - 1)[0] if node.level > 1 else PACKAGE
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + "."):
                inner = name[len(PACKAGE) + 1:].split(".")[0]
                if (FOLDER / f"{inner}.py").exists() and inner != module:
                    found.add(inner)
    return found


def import_graph() -> dict[str, set[str]]:
    return {path.stem: sandbox_imports(path.read_text(encoding="utf-8"), path.stem)
            for path in sorted(FOLDER.glob("*.py")) if path.stem != "__init__"}


def circle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, as the modules along it, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_sandbox_package_has_no_import_circle() -> None:
    circle = circle_in(import_graph())
    assert circle is None, f"import circle in {PACKAGE}: {' -> '.join(circle or [])}"


def test_the_protocol_module_imports_nothing_else_of_the_sandbox() -> None:
    assert import_graph()["protocol"] == set()


def test_the_child_side_and_the_grader_side_do_not_import_each_other() -> None:
    graph = import_graph()
    assert CHILD_SIDE | GRADER_SIDE <= set(graph), sorted(graph)
    for module in CHILD_SIDE:
        assert not graph[module] & GRADER_SIDE, (module, graph[module])
    for module in GRADER_SIDE:
        assert not graph[module] & CHILD_SIDE, (module, graph[module])


@pytest.mark.parametrize("source, expected", [
    ("from .protocol import encode", {"protocol"}),
    ("def f():\n    from pytest_cbatch.sandbox import child_search\n", {"child_search"}),
    ("import pytest_cbatch.sandbox.search as s", {"search"}),
    ("from ..lifecycle import MACHINES\nfrom . import remote", {"remote"}),
])
def test_imports_are_read_at_every_level(source: str, expected: set[str]) -> None:
    assert sandbox_imports(source, "other") == expected


def test_a_circle_is_found() -> None:
    assert circle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle_in({"a": {"b"}, "b": set()}) is None
