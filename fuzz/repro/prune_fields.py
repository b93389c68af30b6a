"""The fields of a repro file's records that nothing in the file reads.

A file carries a kit record (a dataclass: ``Admission``, ``HitLookup``) with
every field the suite's checks may read; the claim a file states reads some
of them. :func:`unread_fields` drops, from each dataclass the file defines,
the fields no code of the file reads (as an attribute, by name in a string,
or as a keyword of another call such as ``dataclasses.replace``), and the
keyword arguments that filled them in every construction; the values those
arguments computed go with them, and the file's other passes take what
nothing calls any more. A field some construction fills by position or
through ``**`` stays, and so does one whose value might change something.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping

from fuzz.repro.prune import _call_items, _cut, _Effects, _list_cuts, _span
from fuzz.repro.trees import parse, walk

__all__ = ["unread_fields"]


def _is_dataclass(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "dataclass"


def unread_fields(sources: Mapping[str, str], plain: Iterable[str], extra: str) -> dict[str, str]:
    """Per definition of ``sources`` that changes, its source without the
    unread fields of the file's dataclasses and the arguments that filled
    them (``extra``: more of the file's code, read but not changed)."""
    trees = {name: parse(source) for name, source in sources.items()}
    classes: dict[str, ast.ClassDef] = {}  # class -> its definition (one per name)
    for name, tree in trees.items():
        node = tree.body[0] if tree.body else None
        if isinstance(node, ast.ClassDef) and any(_is_dataclass(d) for d in node.decorator_list):
            classes[node.name] = node
    if not classes:
        return {}
    every = [*trees.values(), parse(extra)] if extra else list(trees.values())
    read: set[str] = set()
    constructions: dict[str, list[tuple[str, ast.Call]]] = {cls: [] for cls in classes}
    for name, tree in zip([*trees, None], every):
        for node in walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                read.add(node.value)
            elif isinstance(node, ast.Call):
                cls = node.func.id if isinstance(node.func, ast.Name) else None
                if cls in classes and name is not None:
                    constructions[cls].append((name, node))
                else:
                    read |= {k.arg for k in node.keywords if k.arg is not None}
            elif isinstance(node, ast.Name) and node.id in classes and name is None:
                constructions.pop(node.id, None)  # built by the file's own code: it stays as it is
    effects = _Effects(sources, plain)
    body_cuts: dict[str, list[tuple[int, int]]] = {}
    call_cuts: dict[str, list] = {}
    for cls, calls in constructions.items():
        node = classes[cls]
        fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        if any(any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args)
               for _, call in calls):
            continue
        home = next(name for name, tree in trees.items() if tree.body and tree.body[0] is node)
        if any(name == home for name, _ in calls):
            continue  # it builds itself: left as it is
        by_position = set(fields[: max((len(call.args) for _, call in calls), default=0)])
        gone = {f for f in fields if f not in read and f not in by_position}
        for _, call in calls:
            gone -= {k.arg for k in call.keywords if k.arg in gone and not effects.pure(k.value)}
        if not gone:
            continue
        body_cuts[home] = [(s.lineno, s.end_lineno or s.lineno) for s in node.body
                           if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id in gone]
        for name, call in calls:
            items = _call_items(call)
            dropped = {i for i, item in enumerate(items) if isinstance(item, ast.keyword) and item.arg in gone}
            call_cuts.setdefault(name, []).extend(_list_cuts([_span(item) for item in items], dropped))
    out: dict[str, str] = {}
    for name, cuts in call_cuts.items():
        out[name] = _cut(sources[name], cuts)
    for name, spans in body_cuts.items():  # a class's own definition has no construction of it
        lines = sources[name].splitlines()
        for first, last in sorted(spans, reverse=True):
            del lines[first - 1 : last]
        out[name] = "\n".join(lines)
    return out
