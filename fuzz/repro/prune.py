"""Passes that cut a repro file's copied kit code to what the file uses.

:mod:`fuzz.repro.source` selects and specialises the kit's definitions;
the passes here then drop, from the selected sources, what nothing in the
file reads (each reads the sources with :mod:`ast` and returns source
with whole statements removed, never code rewritten as text):

* a record of the file's own (the watch's, a plain class's ``self.x``)
  that nothing in the file reads, with every store into it whose value
  changes nothing else (:func:`unread_records`, :func:`without_lines`);
* a local nothing reads, and an empty ``{}`` only splatted (``**extra``)
  (:func:`without_unused_locals`);
* what the file fixes for :func:`fuzz.repro.source.specialise` to decide an
  ``if`` on: a record it never fills (:func:`never_filled`), a field a
  plain class sets from a parameter every construction passes the same
  constants (:func:`constant_fields`);
* a call of a function left with nothing to do (:func:`calls_doing_nothing`),
  and a parameter nothing reads, from the signature and every call
  (:func:`unused_parameters`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping

from fuzz.repro.trees import parents as _parents
from fuzz.repro.trees import parse, walk

__all__ = [
    "calls_doing_nothing", "constant_fields", "never_filled", "unread_records", "unused_parameters", "without_lines",
    "without_unused_locals",
]


# The calls a record's store may make and still go with it: builtins and
# container methods that change nothing but what they build.
_PURE_BUILTINS = frozenset("all any bool dict enumerate frozenset getattr hasattr int isinstance len list max min "
                           "range reversed set sorted str sum tuple zip".split())
# (get_block_ids: vLLM's KVCacheBlocks and KVCacheManager read their block ids.)
_PURE_METHODS = frozenset({"copy", "count", "fromkeys", "get", "get_block_ids", "index", "items", "keys", "values"})
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
            node = parse(source).body[0]
            if isinstance(node, ast.FunctionDef):
                self.functions.setdefault(name, []).append(node)
            elif isinstance(node, ast.ClassDef) and name in plain:
                for m in node.body:
                    if isinstance(m, ast.FunctionDef):
                        self.methods.setdefault(m.name, []).append(m)
        self.known: dict[int, bool] = {}
        # The file's classes whose construction changes nothing: no __init__,
        # __post_init__ or __new__ of their own (a dataclass, an Enum's lookup).
        self.constructors = set()
        for source in sources.values():
            node = parse(source).body[0]
            if isinstance(node, ast.ClassDef) and not any(
                    isinstance(m, ast.FunctionDef) and m.name in ("__init__", "__post_init__", "__new__")
                    for m in node.body):
                self.constructors.add(node.name)

    def pure_function(self, fn: ast.FunctionDef) -> bool:
        if id(fn) not in self.known:
            self.known[id(fn)] = False  # recursion: not known pure
            fresh = _fresh_locals(fn)
            self.known[id(fn)] = all(self._pure_node(n, fresh) for n in walk(fn) if n is not fn)
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
            return func.id in _PURE_BUILTINS or func.id in self.constructors
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id in local:
                return True  # a method of a local: what it changes is the function's own
            if func.attr in _PURE_METHODS:
                return True
            return func.attr in self.methods and all(self.pure_function(m) for m in self.methods[func.attr])
        return False

    def pure(self, node: ast.AST | None) -> bool:
        """Whether evaluating ``node`` (an expression) changes nothing."""
        return node is None or all(self._pure_call(n) for n in walk(node) if isinstance(n, ast.Call))


_FRESH = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def _fresh_locals(fn: ast.FunctionDef) -> set[str]:
    """The locals of ``fn`` only ever bound to a container it builds itself
    (a literal, a comprehension, ``dict(...)``, ``list(...)``, ``set(...)``)."""
    fresh: dict[str, bool] = {}
    assigned: set[int] = set()  # the Name nodes those assignments bind
    for node in walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            built = isinstance(value, _FRESH) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("dict", "list", "set")
            )
            fresh[node.targets[0].id] = fresh.get(node.targets[0].id, True) and built
            assigned.add(id(node.targets[0]))
    for node in walk(fn):  # bound any other way (a loop, a tuple, a with): not fresh
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and id(node) not in assigned:
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
    trees = {name: parse(source) for name, source in sources.items()}
    stores: dict[str, list[tuple[str, ast.stmt, bool]]] = {}  # record -> (definition, statement, droppable)
    store_nodes: set[int] = set()
    for name, tree in trees.items():
        # The connector's records too (a vLLM subclass: only its public ones,
        # which no vLLM code reads).
        own = name in plain or (bool(tree.body) and isinstance(tree.body[0], ast.ClassDef))
        owners = ("self", "watch", "connector") if own else ("watch", "connector")
        for stmt in walk(tree):
            found = _store(stmt, owners) if isinstance(stmt, ast.stmt) else None
            if found is not None and name not in plain and found[0].startswith("_"):
                continue
            if found is not None:
                record, attr, rest = found
                store_nodes.add(id(attr))
                stores.setdefault(record, []).append((name, stmt, all(effects.pure(e) for e in rest)))
    read = {n.attr for t in trees.values() for n in walk(t) if isinstance(n, ast.Attribute) and id(n) not in store_nodes}
    read |= {n.attr for n in walk(parse(extra)) if isinstance(n, ast.Attribute)} if extra else set()
    strings = {n.value for t in [*trees.values(), parse(extra)] for n in walk(t)
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
    tree = parse(source)
    effects = _Effects({}, ())
    for node in reversed(list(walk(tree))):  # the innermost blocks first
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
    for fn in walk(parse(source)):
        if not isinstance(fn, ast.FunctionDef):
            continue
        loads = [n for n in walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        stores = [n.id for n in walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        splats = {id(k.value): k for c in walk(fn) if isinstance(c, ast.Call) for k in c.keywords
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


# ---------------------------------------------------------------------------
# Facts the file fixes: records it never fills, fields set once from constants
# ---------------------------------------------------------------------------

_EMPTY_BUILDERS = frozenset({"dict", "list", "set"})
# What may be done to a record and leave it empty: empty it, or read it.
_EMPTYING = frozenset({"clear", "discard", "pop", "remove"})
_READING_CALLS = frozenset("all any bool enumerate len list max min reversed set sorted sum tuple".split())


def _is_empty(value: ast.expr | None) -> bool:
    """``[]``, ``{}``, ``set()``, ``dict()``, ``list()``."""
    if isinstance(value, (ast.List, ast.Set)) and not value.elts or isinstance(value, ast.Dict) and not value.keys:
        return True
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _EMPTY_BUILDERS
            and not value.args and not value.keywords)


def _as_test(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether ``node``'s value is only tested for truth (an ``if``,
    ``while`` or conditional expression's test, through ``not``/``and``/``or``)."""
    parent = parents.get(id(node))
    if isinstance(parent, (ast.If, ast.While, ast.IfExp)) and parent.test is node:
        return True
    if isinstance(parent, (ast.BoolOp, ast.UnaryOp)) and (isinstance(parent, ast.BoolOp) or isinstance(parent.op, ast.Not)):
        return _as_test(parent, parents)
    return False


def _leaves_empty(node: ast.Attribute, parents: dict[int, ast.AST]) -> bool:
    """Whether this use of a record cannot fill it: an empty value stored,
    a test of its truth, a read of it (``len``, iteration, ``in``, an item),
    or a call that empties it."""
    parent = parents.get(id(node))
    if isinstance(node.ctx, ast.Store):
        return isinstance(parent, (ast.Assign, ast.AnnAssign)) and _is_empty(parent.value) and (
            isinstance(parent, ast.AnnAssign) or parent.targets == [node])
    if isinstance(node.ctx, ast.Del):
        return False
    if _as_test(node, parents) or isinstance(parent, ast.Compare):
        return True
    if isinstance(parent, ast.Attribute):
        call = parents.get(id(parent))
        return isinstance(call, ast.Call) and call.func is parent and parent.attr in _EMPTYING | _PURE_METHODS - {"copy"}
    if isinstance(parent, ast.Subscript):
        return not isinstance(parent.ctx, ast.Store)
    if isinstance(parent, ast.Call):
        return isinstance(parent.func, ast.Name) and parent.func.id in _READING_CALLS and node in parent.args
    return isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is node


def never_filled(sources: Mapping[str, str], plain: Iterable[str], extra: str) -> set[str]:
    """The records of the file's own (``self.x`` of a plain class, the
    ``watch``'s) that stay empty: stored somewhere as an empty container,
    and every use of an attribute of that name anywhere in the file (any
    owner) leaves it empty (:func:`_leaves_empty`); never named in a string
    or a class body. An ``if`` testing one is decided (:func:`record_facts`)."""
    plain = set(plain)
    trees = [parse(source) for source in sources.values()] + ([parse(extra)] if extra else [])
    owned: set[str] = set()
    spoiled: set[str] = set()
    for tree in trees:
        parents = _parents(tree)
        for node in walk(tree):
            if isinstance(node, ast.Attribute):
                if not _leaves_empty(node, parents):
                    spoiled.add(node.attr)
                elif isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id in ("self", "watch"):
                    owned.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                spoiled.add(node.value)
            elif isinstance(node, ast.ClassDef):
                spoiled |= {n.id for s in node.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                            for n in walk(s) if isinstance(n, ast.Name)}
    return owned - spoiled


def _static(expr: ast.expr, constants: Mapping[str, object]) -> tuple[bool, object]:
    """(known, value) of an expression of the file's constants and literals."""
    allowed = (ast.Name, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Load, ast.cmpop, ast.boolop,
               ast.unaryop, ast.Tuple)
    if not all(isinstance(n, allowed) and (not isinstance(n, ast.Name) or n.id in constants) for n in walk(expr)):
        return False, None
    return True, eval(compile(ast.Expression(expr), "<kit>", "eval"), {"__builtins__": {}}, dict(constants))  # noqa: S307


def constant_fields(sources: Mapping[str, str], plain: Iterable[str], extra: str,
                    constants: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """Per plain class, its fields the file fixes: ``self.x = p`` in its
    ``__init__`` from a parameter ``p`` every construction in the file
    passes the same value of constants (or leaves at its literal default),
    where nothing else stores ``.x`` or names it in a string and the class
    is only ever called. Keys ``self.x``, for :func:`specialise`."""
    trees = {name: parse(source) for name, source in sources.items()}
    every = [*trees.values(), *([parse(extra)] if extra else [])]
    stores: dict[str, int] = {}
    strings: set[str] = set()
    for tree in every:
        for n in walk(tree):
            if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load):
                stores[n.attr] = stores.get(n.attr, 0) + 1
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                strings.add(n.value)
    out: dict[str, dict[str, object]] = {}
    for name in set(plain) & set(trees):
        cls = trees[name].body[0]
        init = next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)  # type: ignore[attr-defined]
        if init is None or init.args.vararg or init.args.kwarg or init.args.kwonlyargs or init.args.posonlyargs:
            continue
        calls = _calls_of(name, every)
        if calls is None:
            continue
        params = [a.arg for a in init.args.args[1:]]
        defaults = dict(zip(params[len(params) - len(init.args.defaults):], init.args.defaults))
        local_stores = [n.id for n in walk(init) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        for stmt in init.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Name)):
                continue
            target, param = stmt.targets[0], stmt.value.id
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
                    and param in params and param not in local_stores and stores.get(target.attr) == 1
                    and target.attr not in strings):
                continue
            values = [_static(_argument(call, params, param, defaults), constants) if _argument(call, params, param, defaults)
                      else (False, None) for call in calls]
            if values and all(known for known, _ in values) and all(v == values[0][1] for _, v in values):
                out.setdefault(name, {})[f"self.{target.attr}"] = values[0][1]
    return out


def _calls_of(name: str, trees: Iterable[ast.AST]) -> list[ast.Call] | None:
    """Every call of ``name`` in ``trees``; None where ``name`` is used
    otherwise (passed on, stored) or a call splats its arguments."""
    calls = []
    for tree in trees:
        parents = _parents(tree)
        for n in walk(tree):
            if isinstance(n, ast.Name) and n.id == name:
                call = parents.get(id(n))
                if not (isinstance(call, ast.Call) and call.func is n) or any(isinstance(a, ast.Starred) for a in call.args) \
                        or any(k.arg is None for k in call.keywords):
                    return None
                calls.append(call)
    return calls


def _argument(call: ast.Call, params: list[str], param: str, defaults: Mapping[str, ast.expr]) -> ast.expr | None:
    """The expression ``call`` passes for ``param`` (its default where it passes none)."""
    index = params.index(param)
    if index < len(call.args):
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == param), defaults.get(param))


# ---------------------------------------------------------------------------
# Calls that do nothing, parameters nothing reads
# ---------------------------------------------------------------------------


def _does_nothing(fn: ast.FunctionDef) -> bool:
    """A function whose body is at most a docstring and ``pass``."""
    return all(isinstance(s, ast.Pass) or isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in fn.body)


def calls_doing_nothing(sources: Mapping[str, str]) -> dict[str, set[int]]:
    """Per definition, the lines of the statements that only call a file
    function left with nothing to do (its ``if`` on the constants or on a
    record never filled gone), with arguments that change nothing."""
    effects = _Effects({}, ())
    idle = {name for name, source in sources.items()
            if isinstance(fn := parse(source).body[0], ast.FunctionDef) and _does_nothing(fn)}
    out: dict[str, set[int]] = {}
    for name, source in sources.items():
        for stmt in walk(parse(source)):
            if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name)
                    and stmt.value.func.id in idle and effects.pure(ast.Tuple([*stmt.value.args, *(k.value for k in stmt.value.keywords)]))):
                out.setdefault(name, set()).update(range(stmt.lineno - 1, stmt.end_lineno or stmt.lineno))
    return out


def _signature(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.args]


def unused_parameters(sources: Mapping[str, str], plain: Iterable[str], extra: str,
                      keep: Iterable[str] = ()) -> dict[str, str]:
    """The definitions changed when each parameter nothing reads goes: from
    a file function's signature (a plain class's ``__init__``, called by
    the class's name) and from every call of it, where each call is in the
    file's kit code (the test ``extra`` passes it nothing) and passes an
    argument that changes nothing. Functions named in ``keep`` keep theirs,
    and every function the parameters its docstring names (``p`` in double backquotes).
    Name -> new source, for the definitions that change."""
    keep = set(keep)
    effects = _Effects({}, ())
    trees = {name: parse(source) for name, source in sources.items()}
    extra_tree = parse(extra) if extra else ast.Module([], [])
    edits: dict[str, list[tuple[tuple[int, int], tuple[int, int]]]] = {}  # name -> spans to cut
    for name, tree in trees.items():
        node = tree.body[0]
        if name in keep:
            continue
        if isinstance(node, ast.ClassDef) and name in set(plain):
            fn = next((m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
            skip = 1
        elif isinstance(node, ast.FunctionDef):
            fn, skip = node, 0
        else:
            continue
        if fn is None or fn.args.vararg or fn.args.posonlyargs or fn.args.kwonlyargs or fn.decorator_list:
            continue
        reads = {n.id for n in walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        reads |= set(re.findall(r"``(\w+)``", ast.get_docstring(fn) or ""))  # one its docstring names stays
        params = _signature(fn)
        unread = [i for i, p in enumerate(params) if i >= skip and p not in reads]
        kwarg_unread = fn.args.kwarg is not None and fn.args.kwarg.arg not in reads
        if not unread and not kwarg_unread:
            continue
        calls = _calls_of(name, [*trees.values(), extra_tree])
        if calls is None:
            continue
        in_extra = {id(n) for n in walk(extra_tree)}
        named = set(params)
        # Drop a parameter only where no call in the test passes it, every call's argument changes nothing.
        drop = []
        for i in unread:
            args = [_passed(call, params[skip:], params[i]) for call in calls]
            if all(a is None or id(call) not in in_extra and effects.pure(a) for call, a in zip(calls, args)):
                drop.append(i)
        if kwarg_unread and not all(k.arg in named for call in calls for k in call.keywords):
            kwarg_unread = False
        if not drop and not kwarg_unread:
            continue
        cut = {params[i] for i in drop}
        for call in calls:
            if id(call) in in_extra:
                continue  # it passes none of them
            owner = next(n for n, t in trees.items() if any(x is call for x in walk(t)))
            items = _call_items(call)
            gone = {j for j, item in enumerate(items)
                    if (item.arg if isinstance(item, ast.keyword) else params[skip + call.args.index(item)]) in cut}
            edits.setdefault(owner, []).extend(_list_cuts([_span(item) for item in items], gone))
        spans = [_span(a, default) for a, default in zip(fn.args.args, [None] * (len(fn.args.args) - len(fn.args.defaults))
                                                             + list(fn.args.defaults))]
        if fn.args.kwarg is not None:
            (line, col), end = _span(fn.args.kwarg)
            spans.append(((line, col - 2), end))  # **name
        gone = set(drop) | ({len(spans) - 1} if kwarg_unread else set())
        edits.setdefault(name, []).extend(_list_cuts(spans, gone))
        break  # one function at a time: its cuts never nest in another's
    return {name: _cut(sources[name], spans) for name, spans in edits.items()}


def _passed(call: ast.Call, params: list[str], param: str) -> ast.expr | None:
    index = params.index(param)
    if index < len(call.args):
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == param), None)


_Span = tuple[tuple[int, int], tuple[int, int]]


def _call_items(call: ast.Call) -> list[ast.AST]:
    return sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))


def _span(node: ast.AST, last: ast.AST | None = None) -> _Span:
    """Where ``node`` stands in its source, to the end of ``last`` (a default) if given."""
    end = last if last is not None else node
    return (node.lineno, node.col_offset), (end.end_lineno, end.end_col_offset)  # type: ignore[attr-defined]


def _list_cuts(spans: list[_Span], gone: set[int]) -> list[_Span]:
    """The cuts that take the items ``gone`` out of a comma-separated list
    of ``spans``: each run of them with the comma before it (after it where
    the run starts the list)."""
    cuts = []
    i = 0
    while i < len(spans):
        if i not in gone:
            i += 1
            continue
        j = i
        while j + 1 in gone:
            j += 1
        if i > 0:
            cuts.append((spans[i - 1][1], spans[j][1]))
        elif j + 1 < len(spans):
            cuts.append((spans[i][0], spans[j + 1][0]))
        else:
            cuts.append((spans[i][0], spans[j][1]))
        i = j + 1
    return cuts


def _cut(source: str, cuts: list[_Span]) -> str:
    """``source`` without the text of ``cuts`` (lines 1-based, columns in UTF-8 bytes, as :mod:`ast` gives them)."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + len(lines[line - 1].encode()[:col].decode())

    out = source
    for (a, b) in sorted({(offset(*s), offset(*e)) for s, e in cuts}, reverse=True):
        out = out[:a] + out[b:]
    return out
