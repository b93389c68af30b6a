"""The house has no circle between its packages: a package may use the
packages below it, never one that uses it back (directly or through others).

A unit is a package of ``fuzz/`` (``fuzz.adapter``, ``fuzz.campaign``, ...),
a loose module of ``fuzz/`` (``fuzz.cli``), or a top-level package of the
repository (``invariants``, ``strategies``, ``engine``). Every import counts,
inside functions and under ``TYPE_CHECKING`` too: a deferred import is still
a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_PACKAGES = ("fuzz", "invariants", "strategies", "engine")


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in TOP_PACKAGES:
        return None
    if parts[0] != "fuzz":
        return parts[0]
    if len(parts) == 1:
        return "fuzz"
    return "fuzz." + parts[1]


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    here = _module_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # ``from fuzz import coverage``
    return out


def unit_graph() -> dict[str, set[str]]:
    """Which unit imports which other unit."""
    graph: dict[str, set[str]] = {}
    for top in TOP_PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            source = _unit(_module_of(path))
            if source is None:
                continue
            targets = graph.setdefault(source, set())
            for name in _imports(path):
                target = _unit(name)
                if target is not None and target != source and target != "fuzz":
                    if target.startswith("fuzz.") and not _exists(target):
                        continue  # ``from fuzz import names`` of fuzz/__init__.py
                    targets.add(target)
    return graph


def _exists(unit: str) -> bool:
    rel = Path(*unit.split("."))
    return (ROOT / rel).is_dir() or (ROOT / rel).with_suffix(".py").is_file()


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more units (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_package_imports_a_package_that_imports_it_back() -> None:
    graph = unit_graph()
    found = circles(graph)
    detail = [
        " <-> ".join(c) + ": " + "; ".join(f"{a} -> {sorted(graph[a] & set(c))}" for a in c) for c in found
    ]
    assert not found, "package-level import circles:\n" + "\n".join(detail)


def test_the_circle_finder_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
