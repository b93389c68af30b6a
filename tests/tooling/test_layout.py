"""The adapter's shape: one room per job, rooms small, imports one way.

Read from the source (``ast``), so the checks need no vLLM: every import of
one ``fuzz.adapter`` module by another counts, function-level ones too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ADAPTER = Path(__file__).resolve().parents[2] / "fuzz" / "adapter"
PACKAGE = "fuzz.adapter"
MAX_LINES = 600
# Modules that are mostly a table of facts, allowed past MAX_LINES.
DATA_TABLES = {
    # The planted bugs: each an edit of vLLM's source, old text -> new text.
    "_planted",
}


def _modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(ADAPTER.glob("*.py"))}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The adapter modules ``path`` imports (the package ``__init__`` as
    ``__init__``), wherever in the file the import stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == PACKAGE:
                # `from fuzz.adapter import _compat` imports the submodule.
                found.update(a.name if a.name in modules else "__init__" for a in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE:
                    found.add("__init__")
                elif alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.split(".")[2])
    found.discard(path.stem)
    return found & set(modules)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_adapter_has_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    assert "_scheduler" in graph["__init__"]  # the walk sees the package's own imports
    circle = _cycle(graph)
    assert circle is None, "fuzz.adapter imports in a circle: " + " -> ".join(circle or ())


def test_cycle_finder_finds_a_planted_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_adapter_modules_stay_small() -> None:
    long = {
        name: n
        for name, path in _modules().items()
        if name not in DATA_TABLES and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"fuzz.adapter modules over {MAX_LINES} lines (split them by job): {long}"
