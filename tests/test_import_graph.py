"""The import graph of the two packages: no circles, and the library never imports the course.

Read from the source (the syntax tree), not by importing: every ``import`` statement counts, at module level and
inside functions alike, since a function-level import closes a circle as soon as that function runs. An edge goes
to the module an import names: ``from a.b import c`` to ``a.b.c`` when that is a module, else to ``a.b``. Importing
``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``; those implicit edges are left out, or a package that
re-exports its submodules' names (``from a.b.c import f`` in ``a/b/__init__.py``) would count as a circle.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("minigrpo", "minigrpo_course")
LIBRARY, COURSE = PACKAGES


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}
    assert len(found) > 100
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of both packages that ``path`` (module ``name``) imports anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in modules:  # `import a.b.c` where c is a name: the nearest module
                    target = target.rpartition(".")[0]
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    found.add(target)
                elif base in modules:
                    found.add(base)
    return found - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def _example_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete circle through ``component``'s first module, for the error message."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return component


def test_no_module_of_either_package_imports_itself_in_a_circle():
    graph = _graph()
    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(" -> ".join(_example_cycle(graph, c)) for c in circles)


def test_the_library_never_imports_the_course():
    graph = _graph()
    wrong = {name: sorted(t for t in targets if t.split(".")[0] == COURSE)
             for name, targets in graph.items() if name.split(".")[0] == LIBRARY}
    wrong = {name: targets for name, targets in wrong.items() if targets}
    assert not wrong, f"minigrpo modules importing minigrpo_course: {wrong}"


def test_the_graph_sees_every_kind_of_import():
    """The reader itself: module-level, function-level, relative and `from package import submodule` imports."""
    graph = _graph()
    assert "minigrpo.infra.checks" in graph["minigrpo.advantages"]               # at module level
    assert "minigrpo.infra.checks" in graph["minigrpo.diffusion.ddpm"]            # from ..infra.checks import ...
    assert "minigrpo.infra.distributed" in graph["minigrpo.diffusion.recipes"]    # inside a function only
    assert "minigrpo_course.grading.notebooks" in graph["minigrpo_course.cli"]   # inside cmd_make_exercises
    assert "minigrpo_course.grading.ex05" in graph["minigrpo_course.grading.ex11"]  # from ...grading import ex05
    assert "minigrpo.cli" in graph["minigrpo_course.cli"]


@pytest.mark.parametrize("graph, circle", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
])
def test_the_circle_finder_on_small_graphs(graph, circle):
    assert _circles(graph) == circle
