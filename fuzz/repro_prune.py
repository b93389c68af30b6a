"""Passes that cut a repro file's copied kit code to what the file uses.

:mod:`fuzz.repro_source` selects and specialises the kit's definitions;
the passes here then drop, from the selected sources, what nothing in the
file reads (each reads the sources with :mod:`ast` and returns source
with whole statements removed, never code rewritten as text):

* a record of the file's own (the watch's, a plain class's ``self.x``)
  that nothing in the file reads, with every store into it whose value
  changes nothing else (:func:`unread_records`, :func:`without_lines`);
* a local nothing reads, and an empty ``{}`` only splatted (``**extra``)
  (:func:`without_unused_locals`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping

__all__ = ["unread_records", "without_lines", "without_unused_locals"]


# The calls a record's store may make and still go with it: builtins and
# container methods that change nothing but what they build.
_PURE_BUILTINS = frozenset("all any bool dict enumerate frozenset getattr hasattr int isinstance len list max min "
                           "range reversed set sorted str sum tuple zip".split())
_PURE_METHODS = frozenset({"copy", "count", "fromkeys", "get", "index", "items", "keys", "values"})
# What a statement may do to a record and still be only its store.
_MUTATORS = frozenset({"add", "append", "clear", "discard", "extend", "insert", "pop", "remove", "setdefault", "update"})


class _Effects:
    """Which of a file's functions and methods change nothing outside their
    own locals (by name: a method counts where every plain-class method of
    that name does), so a store whose value calls only them and the pure
    builtins may be dropped with its record."""

    def __init__(self, sources: Mapping[str, str], plain: Iterable[str]) -> None:
        self.functions: dict[str, list[ast.FunctionDef]] = {}
        self.methods: dict[str, list[ast.FunctionDef]] = {}
        for name, source in sources.items():
            node = ast.parse(source).body[0]
            if isinstance(node, ast.FunctionDef):
                self.functions.setdefault(name, []).append(node)
            elif isinstance(node, ast.ClassDef) and name in plain:
                for m in node.body:
                    if isinstance(m, ast.FunctionDef):
                        self.methods.setdefault(m.name, []).append(m)
        self.known: dict[int, bool] = {}

    def pure_function(self, fn: ast.FunctionDef) -> bool:
        if id(fn) not in self.known:
            self.known[id(fn)] = False  # recursion: not known pure
            fresh = _fresh_locals(fn)
            self.known[id(fn)] = all(self._pure_node(n, fresh) for n in ast.walk(fn) if n is not fn)
        return self.known[id(fn)]

    def _pure_node(self, node: ast.AST, local: set[str]) -> bool:
        if isinstance(node, (ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await, ast.FunctionDef,
                             ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            return _root(node) in local
        if isinstance(node, ast.Call):
            return self._pure_call(node, local)
        return True

    def _pure_call(self, call: ast.Call, local: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in self.functions:
                return all(self.pure_function(f) for f in self.functions[func.id])
            return func.id in _PURE_BUILTINS
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id in local:
                return True  # a method of a local: what it changes is the function's own
            if func.attr in _PURE_METHODS:
                return True
            return func.attr in self.methods and all(self.pure_function(m) for m in self.methods[func.attr])
        return False

    def pure(self, node: ast.AST | None) -> bool:
        """Whether evaluating ``node`` (an expression) changes nothing."""
        return node is None or all(self._pure_call(n) for n in ast.walk(node) if isinstance(n, ast.Call))


_FRESH = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def _fresh_locals(fn: ast.FunctionDef) -> set[str]:
    """The locals of ``fn`` only ever bound to a container it builds itself
    (a literal, a comprehension, ``dict(...)``, ``list(...)``, ``set(...)``)."""
    fresh: dict[str, bool] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            built = isinstance(value, _FRESH) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("dict", "list", "set")
            )
            fresh[node.targets[0].id] = fresh.get(node.targets[0].id, True) and built
            node.targets[0].fresh = True  # type: ignore[attr-defined]
    for node in ast.walk(fn):  # bound any other way (a loop, a tuple, a with): not fresh
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and not getattr(node, "fresh", False):
            fresh[node.id] = False
    return {name for name, ok in fresh.items() if ok}


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _store(stmt: ast.stmt, owners: Iterable[str]) -> tuple[str, ast.Attribute, list[ast.AST | None]] | None:
    """(record, its attribute node, the expressions the statement evaluates
    besides) where ``stmt`` only stores into a record of ``owners``:
    ``o.x = v``, ``o.x[k] = v``, ``o.x |= v``, ``del o.x[k]``, ``o.x.clear()`` (or another mutator)."""
    target: ast.expr | None = None
    rest: list[ast.AST | None] = []
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if len(targets) == 1:
            target, rest = targets[0], [stmt.value]
    elif isinstance(stmt, ast.Delete) and len(stmt.targets) == 1:
        target = stmt.targets[0]
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute):
        if stmt.value.func.attr in _MUTATORS:
            target, rest = stmt.value.func.value, [*stmt.value.args, *(k.value for k in stmt.value.keywords)]
    if isinstance(target, ast.Subscript):
        rest.append(target.slice)
        target = target.value
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in owners:
        return target.attr, target, rest
    return None


def unread_records(sources: Mapping[str, str], plain: Iterable[str], extra: str) -> dict[str, set[int]]:
    """Per definition, the lines (0-based) of the statements that only store
    into a record of the file's own (``self`` of a plain class, the
    ``watch``) that nothing in ``sources`` or ``extra`` reads: neither as an
    attribute nor by name in a string. A record any of whose stores might
    change something else (a call neither pure builtin nor pure file
    code) stays, with all its stores."""
    plain = set(plain)
    effects = _Effects(sources, plain)
    trees = {name: ast.parse(source) for name, source in sources.items()}
    stores: dict[str, list[tuple[str, ast.stmt, bool]]] = {}  # record -> (definition, statement, droppable)
    store_nodes: set[int] = set()
    for name, tree in trees.items():
        owners = ("self", "watch") if name in plain else ("watch",)
        for stmt in ast.walk(tree):
            found = _store(stmt, owners) if isinstance(stmt, ast.stmt) else None
            if found is not None:
                record, attr, rest = found
                store_nodes.add(id(attr))
                stores.setdefault(record, []).append((name, stmt, all(effects.pure(e) for e in rest)))
    read = {n.attr for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Attribute) and id(n) not in store_nodes}
    read |= {n.attr for n in ast.walk(ast.parse(extra)) if isinstance(n, ast.Attribute)} if extra else set()
    strings = {n.value for t in [*trees.values(), ast.parse(extra)] for n in ast.walk(t)
               if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    out: dict[str, set[int]] = {}
    for record, found in stores.items():
        if record in read or record in strings or not all(ok for _, _, ok in found):
            continue
        for name, stmt, _ in found:
            out.setdefault(name, set()).update(range(stmt.lineno - 1, stmt.end_lineno or stmt.lineno))
    return out


def without_lines(source: str, drop: set[int]) -> str:
    """``source`` without the statements on lines ``drop``; a block they
    empty goes too where its header changes nothing, else (an ``if``) its
    test stays as a statement."""
    lines = source.splitlines()
    tree = ast.parse(source)
    effects = _Effects({}, ())
    for node in reversed(list(ast.walk(tree))):  # the innermost blocks first
        for field in ("body", "orelse"):
            body = getattr(node, field, None)
            if not isinstance(body, list) or not body or not isinstance(node, (ast.If, ast.For, ast.With)):
                continue
            if not all(set(range(s.lineno - 1, s.end_lineno or s.lineno)) <= drop for s in body):
                continue
            if field == "orelse" or node.orelse:
                drop.difference_update(range(body[0].lineno - 1, body[-1].end_lineno or 0))  # keep: rare
                continue
            header = node.test if isinstance(node, ast.If) else node.iter if isinstance(node, ast.For) else node
            first, end = node.lineno - 1, node.end_lineno or node.lineno
            if isinstance(node, ast.If) and not effects.pure(header):
                indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
                lines[first] = indent + (ast.get_source_segment(source, header) or "").replace("\n", " ")
                drop.update(range(first + 1, end))
            elif isinstance(node, ast.If) or (isinstance(node, ast.For) and effects.pure(header)):
                drop.update(range(first, end))
            else:
                drop.difference_update(range(body[0].lineno - 1, body[-1].end_lineno or 0))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def _unused_locals(source: str) -> tuple[set[int], list[ast.keyword]]:
    """The lines of ``source``'s statements that bind only locals its
    functions never read, from values that change nothing (``a, b = x, y.z``),
    or only splat, bound to ``{}`` (``extra = {}`` ... ``f(**extra)``); and
    those splats."""
    effects = _Effects({}, ())
    drop: set[int] = set()
    dropped_splats: list[ast.keyword] = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef):
            continue
        loads = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        stores = [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        splats = {id(k.value): k for c in ast.walk(fn) if isinstance(c, ast.Call) for k in c.keywords
                  if k.arg is None and isinstance(k.value, ast.Name)}
        for stmt in fn.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            target = stmt.targets[0]
            names = [target] if isinstance(target, ast.Name) else list(getattr(target, "elts", ()))
            if not names or not all(isinstance(n, ast.Name) and stores.count(n.id) == 1 for n in names):
                continue
            values = stmt.value.elts if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) else [stmt.value]
            bound = {n.id for n in names}  # type: ignore[attr-defined]
            read = [load for load in loads if load.id in bound]
            empty = len(values) == len(names) and all(isinstance(v, ast.Dict) and not v.keys for v in values)
            if effects.pure(stmt.value) and (not read or empty and all(id(load) in splats for load in read)):
                drop.update(range(stmt.lineno - 1, stmt.end_lineno or stmt.lineno))
                dropped_splats += [splats[id(load)] for load in read]
    return drop, dropped_splats


def without_unused_locals(source: str) -> str:
    """``source`` without what :func:`_unused_locals` finds (a splat's line
    where it stands alone, else the splat in its line)."""
    drop, splats = _unused_locals(source)
    if not drop:
        return source
    lines = source.splitlines()
    for k in sorted(splats, key=lambda k: (k.lineno, k.col_offset), reverse=True):
        i, name = k.lineno - 1, ast.get_source_segment(source, k) or ""
        if lines[i].strip().rstrip(",") == name:
            drop.add(i)
        else:
            lines[i] = re.sub(r",\s*" + re.escape(name) + r"(?!\w)", "", lines[i], count=1)
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)
