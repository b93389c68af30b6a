"""Parsed sources for the repro writer's passes, each parsed and walked once.

The writer (:func:`fuzz.repro.source.kit_source`) runs its passes to a fixed
point over the few hundred definitions a file may carry, and a round changes
few of them: most passes read the same source text again and again. Here a
text is parsed once, a node's walk and a tree's parent map are built once,
and every pass reads them from here.

The trees are shared between the passes, so a pass reads them and never
changes them (no attribute set on a node, no node moved): a pass that needs
a changed tree parses its new text.
"""

from __future__ import annotations

import ast
from functools import lru_cache

__all__ = ["parents", "parse", "walk"]

# Writing one file parses about 370 distinct texts, and each further file
# about 30 more (most of the kit is the same from file to file); 28 files
# held 1,232 trees, about 140 MB. The cap bounds a long campaign's memory.
_SIZE = 2048


@lru_cache(maxsize=_SIZE)
def parse(source: str) -> ast.Module:
    """``ast.parse(source)``, shared (raises :class:`SyntaxError` as it does)."""
    return ast.parse(source)


@lru_cache(maxsize=_SIZE)
def walk(node: ast.AST) -> tuple[ast.AST, ...]:
    """Every node under ``node`` (itself included), in :func:`ast.walk`'s order."""
    return tuple(ast.walk(node))


@lru_cache(maxsize=_SIZE)
def parents(tree: ast.AST) -> dict[int, ast.AST]:
    """id(node) -> its parent, for every node under ``tree``."""
    return {id(child): node for node in walk(tree) for child in ast.iter_child_nodes(node)}
