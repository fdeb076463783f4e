"""No import circles among the project's modules.

Read with ast only (nothing of the project is imported), so it is fast and
sees what a run may never reach: an import inside a function is still an
edge, because deferring an import hides a circle rather than removing it.

Importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``; those
implicit edges are left out (as import linters do), else every package whose
``__init__`` re-exports a submodule would be a circle with each of its
modules. An explicit ``from a.b import name`` is an edge to ``a.b``.
"""
from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "tools", "wheel_index", "benchmarks")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def _imported(node: ast.AST, module: str, is_package: bool, known) -> list[str]:
    """The project modules one import statement names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            # relative to the package the module is in (a package is its own)
            pkg = module.split(".") if is_package else module.split(".")[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        # `from pkg import sub` imports the submodule; `from mod import name` the module
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:  # `import a.b.attr`-like spellings
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    modules = project_modules(root, packages)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[name] = {t for node in ast.walk(tree)
                       if isinstance(node, (ast.Import, ast.ImportFrom))
                       for t in _imported(node, name, path.name == "__init__.py", modules)}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, iteratively (no recursion limit)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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


def shortest_cycle(graph: dict[str, set[str]], start: str, inside: set[str]) -> list[str]:
    """The shortest circle from start back to it through the component's modules."""
    came_from, queue = {start: None}, deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & inside):
            if child == start:
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return path[::-1] + [start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in no circle of {sorted(inside)}")


def cycles(graph: dict[str, set[str]], component: list[str]) -> list[list[str]]:
    """The shortest circle through each module of a component, each once: every
    edge a fix must cut shows up, without listing every path of a tangle."""
    found = set()
    for start in component:
        ring = shortest_cycle(graph, start, set(component))[:-1]
        at = ring.index(min(ring))  # one spelling per circle, from its first module
        found.add(tuple(ring[at:] + ring[:at]))
    return [list(c) + [c[0]] for c in sorted(found)]


def cycles_touching(package: str, root: Path = REPO) -> list[str]:
    graph = import_graph(root)
    return [" -> ".join(c) for comp in strongly_connected(graph)
            if any(m == package or m.startswith(package + ".") for m in comp)
            for c in cycles(graph, comp)]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    found = cycles_touching(package)
    assert not found, "import circles:\n" + "\n".join(found)


def test_the_check_sees_deferred_relative_and_submodule_imports(tmp_path):
    pkg = tmp_path / "tools"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from tools.sub import b\n")                 # a submodule
    (pkg / "sub" / "b.py").write_text("from . import c\n")                 # relative
    (pkg / "sub" / "c.py").write_text("def f():\n    from ..a import x\n")  # deferred
    (pkg / "d.py").write_text("import tools.a\n")                         # into, not part of, it
    graph = import_graph(tmp_path, ("tools",))
    assert strongly_connected(graph) == [["tools.a", "tools.sub.b", "tools.sub.c"]]
    assert cycles_touching("tools", tmp_path) == [
        "tools.a -> tools.sub.b -> tools.sub.c -> tools.a"]
    (pkg / "sub" / "c.py").write_text("x = 1\n")
    assert cycles_touching("tools", tmp_path) == []
