"""Stores a repro file's code makes for nothing.

After :mod:`fuzz.repro.source` specialises the kit to a file's constants,
some statements are left doing no work in that file: a local bound to a
literal only to be passed on once (``connector_output = None`` where the
file has no connector), a record reset right before the next statement
sets it again, a name bound to what a call returns and never read (the
call's effect is what counts). :func:`with_literals_inlined`,
:func:`without_overwritten_stores` and :func:`without_unread_names` take
them out; they read the source with :mod:`ast` and keep every statement
that might matter.
"""

from __future__ import annotations

import ast

from fuzz.repro.prune import _Effects, without_lines
from fuzz.repro.trees import parse, walk

__all__ = ["with_literals_inlined", "without_overwritten_stores", "without_unread_names"]


def with_literals_inlined(source: str) -> str:
    """``source`` with each local a function binds once, at its top level,
    to ``None``, a bool or a number, and reads once after, replaced by that
    literal where it is read (``connector_output = None`` ... ``f(x=connector_output)``:
    ``f(x=None)``)."""
    tree = parse(source)
    cuts: list[tuple[int, int, int, str]] = []  # (line, start col, end col, text), 1-based lines
    drop: set[int] = set()
    for fn in walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        names = [n for n in walk(fn) if isinstance(n, ast.Name)]
        owned = {id(n.value) for n in walk(fn) if isinstance(n, (ast.Attribute, ast.Subscript))}
        owned |= {id(n.func) for n in walk(fn) if isinstance(n, ast.Call)}
        params = {a.arg for a in walk(fn.args) if isinstance(a, ast.arg)}
        for stmt in fn.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Constant) and type(stmt.value.value) in (type(None), bool, int)):
                continue
            name = stmt.targets[0].id
            uses = [n for n in names if n.id == name]
            if name in params or len(uses) != 2 or not isinstance(uses[1].ctx, ast.Load):
                continue
            load = uses[1]
            if (load.lineno, load.col_offset) <= (stmt.lineno, stmt.col_offset) or load.lineno == stmt.lineno:
                continue
            if id(load) in owned:  # x.attr, x[i], x(): a literal there may not parse (1.real) or mean the same
                continue
            cuts.append((load.lineno, load.col_offset, load.end_col_offset or 0, repr(stmt.value.value)))
            drop.add(stmt.lineno - 1)
    if not cuts:
        return source
    lines = source.splitlines()
    for line, start, end, text in sorted(cuts, reverse=True):
        raw = lines[line - 1].encode()
        lines[line - 1] = (raw[:start] + text.encode() + raw[end:]).decode()
    out = "\n".join(line for i, line in enumerate(lines) if i not in drop)
    try:
        parse(out)
    except SyntaxError:
        return source
    return out


# Statements after which the function may be left before the next store.
_LEAVING = (ast.Return, ast.Raise, ast.Break, ast.Continue, ast.Try, ast.With, ast.Yield, ast.YieldFrom, ast.Await)


def without_overwritten_stores(source: str) -> str:
    """``source`` without each ``owner.field = <value that changes nothing>``
    at a function's top level that the next top-level statement naming
    ``owner`` stores again (``watch.preempted = []`` right before
    ``watch.preempted = _preempted_states(...)``): nothing between reads it
    or leaves the function (no ``return``, ``raise``, ``try``, ``with``).
    A call between that raises would leave the record as the step before
    set it; a file's checks read a record after its step returns, and the
    checks that run when ``schedule()`` raises read the pool's records,
    which are emptied in place (``clear()``), never rebound, so this pass
    leaves them alone."""
    effects = _Effects({}, ())
    drop: set[int] = set()
    for fn in walk(parse(source)):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for i, stmt in enumerate(fn.body):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and effects.pure(stmt.value)):
                continue
            target = stmt.targets[0]
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)):
                continue
            owner = target.value.id
            j, later = next(((j, s) for j, s in enumerate(fn.body[i + 1 :], i + 1)
                             if any(isinstance(n, ast.Name) and n.id == owner for n in walk(s))), (0, None))
            if any(isinstance(n, _LEAVING) for s in fn.body[i + 1 : j] for n in walk(s)):
                continue
            if (isinstance(later, ast.Assign) and len(later.targets) == 1 and ast.dump(later.targets[0]) == ast.dump(target)
                    and not any(isinstance(n, ast.Name) and n.id == owner for n in walk(later.value))):
                drop.update(range(stmt.lineno - 1, stmt.end_lineno or stmt.lineno))
    return without_lines(source, drop) if drop else source


def without_unread_names(source: str) -> str:
    """``source`` with ``name = <call>`` turned into ``<call>`` where the
    function (nested functions included) never reads ``name``: what other
    passes leave once the code that read it is specialised away
    (``facts = self.failed_waiting.pop(rid, None)``). Values that change
    nothing go whole elsewhere (:func:`fuzz.repro.prune.without_unused_locals`)."""
    tree = parse(source)
    cuts: list[tuple[int, int, int]] = []  # (line, start col, end col) of "name = "
    for fn in walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        declared = {name for n in walk(fn) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
        read = {n.id for n in walk(fn) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
        inner = {id(s) for d in walk(fn) if d is not fn and isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for s in walk(d)}
        for stmt in walk(fn):
            if (id(stmt) in inner or not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1
                    or not isinstance(stmt.targets[0], ast.Name) or not isinstance(stmt.value, ast.Call)):
                continue
            target = stmt.targets[0]
            if target.id in read or target.id in declared or stmt.value.lineno != target.lineno:
                continue
            cuts.append((target.lineno, target.col_offset, stmt.value.col_offset))
    if not cuts:
        return source
    lines = source.splitlines()
    for line, start, end in sorted(cuts, reverse=True):
        raw = lines[line - 1].encode()
        lines[line - 1] = (raw[:start] + raw[end:]).decode()
    out = "\n".join(lines)
    try:
        parse(out)
    except SyntaxError:
        return source
    return out
