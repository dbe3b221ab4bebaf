"""The project's packages import each other without a circle, and shipped code never imports the tests.

Every import counts, wherever it is written: at the top, inside a function, or
under ``if TYPE_CHECKING``. A circle between packages, or between modules of
one package, is a failure. A module's length is no rule here: a module holds
one job, which review judges; slicing a class into files by line count is what
tests/core/test_code_shape.py catches.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "writer", "db", "chat", "daemon", "oplog", "relay", "pusher",
            "chatctl", "cluster", "harness", "loadtest")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
            if ".venv" not in p.parts}


def imported(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The project modules ``module`` imports: ``from a import b`` is module a.b when there is one."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # a.b.c where only a.b is ours: a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    names = set(modules)
    return {name: imported(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", names)
            for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for source, targets in graph.items():
        top = source.split(".")[0]
        packages.setdefault(top, set()).update(t.split(".")[0] for t in targets if t.split(".")[0] != top)
    return packages


def problems() -> set[str]:
    graph = import_graph()
    found = {"package circle: " + " -> ".join([*c, c[0]]) for c in circles(package_graph(graph))}
    for package in PACKAGES:
        inside = {m: {t for t in targets if t.split(".")[0] == package}
                  for m, targets in graph.items() if m.split(".")[0] == package}
        found |= {"module circle: " + " -> ".join([*c, c[0]]) for c in circles(inside)}
    return found


def test_no_import_circle():
    assert problems() == set()


def test_the_check_sees_a_circle_through_a_type_checking_import_and_a_relative_one():
    graph = {
        "a.x": imported(ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from b import y\n"),
                        "a.x", False, {"a.x", "b.y", "b"}),
        "b.y": imported(ast.parse("def f():\n    from . import z\n    import a.x\n"), "b.y", False,
                        {"a.x", "b.y", "b.z", "b"}),
    }
    assert graph == {"a.x": {"b.y"}, "b.y": {"b.z", "a.x"}}
    assert circles(graph) == [["a.x", "b.y"]]
    assert circles(package_graph(graph)) == [["a", "b"]]


def test_the_writer_and_the_api_do_not_import_each_other_and_db_imports_neither():
    packages = package_graph(import_graph())
    assert "api" not in packages["writer"]
    assert not {"api", "writer"} & packages["db"]


def shipped_imports_of_tests(all_imports: dict[str, set[str]]) -> set[str]:
    return {f"{module} imports {name}" for module, names in all_imports.items() for name in names
            if name == "tests" or name.startswith("tests.")}


def every_import() -> dict[str, set[str]]:
    """Each shipped module's imported names, ours or not, as written (absolute)."""
    found: dict[str, set[str]] = {}
    for name, path in project_modules().items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module)
        found[name] = names
    return found


def test_shipped_code_never_imports_the_tests():
    # what ships (the packages, the benchmarks, the cluster) starts servers
    # through harness/, never through the test suite
    assert shipped_imports_of_tests(every_import()) == set()
    assert "tests" not in PACKAGES


def test_the_check_sees_an_import_of_the_tests_inside_a_function():
    tree = ast.parse("def f():\n    from tests.timing import S\n")
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert shipped_imports_of_tests({"loadtest.x": names}) == {"loadtest.x imports tests.timing"}


def test_the_harness_imports_neither_the_benchmarks_nor_the_cluster():
    assert not {"loadtest", "cluster", "tests"} & package_graph(import_graph())["harness"]
