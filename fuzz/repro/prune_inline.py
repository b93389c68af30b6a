"""Inlining a repro file's one-use helpers where they are called.

:mod:`fuzz.repro.source` selects the kit's definitions a file needs and
:mod:`fuzz.repro.prune` drops what nothing reads; what is left may be a
short helper the file calls once (the step loop's ``_begin_step``,
``_scheduled``, ``_feed``, the builders' ``_make_model_config``), kept
apart in the kit because other files call it elsewhere or with more
branches. :func:`inlined_helpers` moves such a body to its one call, so
the file reads top to bottom. It reads the sources with :mod:`ast` and
moves whole lines (re-indented, the parameters renamed to the names passed,
``return v`` turned into the assignment the call made); a helper it cannot
move that way, or whose body is long enough to earn its name, stays.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping

from fuzz.repro.trees import parse, walk

__all__ = ["inlined_helpers"]

# A helper longer than this many lines of body (its docstring aside) keeps its name.
MAX_INLINED_LINES = 12

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_REFUSED = (ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr, ast.FunctionDef,
            ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Starred, ast.JoinedStr)


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    """``fn``'s statements without its docstring."""
    first = fn.body[0]
    doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    return fn.body[1:] if doc else fn.body


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _names_in(node: ast.AST) -> set[str]:
    """Every name ``node`` spells, but a comprehension's own variables
    inside it (a scope of their own: a name bound beside it is another)."""
    own: set[int] = set()
    for c in walk(node):
        if isinstance(c, _COMPREHENSIONS):
            targets = {n.id for g in c.generators for n in walk(g.target) if isinstance(n, ast.Name)}
            own |= {id(n) for n in walk(c) if isinstance(n, ast.Name) and n.id in targets}
    return {n.id for n in walk(node) if isinstance(n, ast.Name) and id(n) not in own} | {
        a.arg for n in walk(node) if isinstance(n, (ast.FunctionDef, ast.Lambda)) for a in _all_args(n.args)
    }


def _all_args(args: ast.arguments) -> list[ast.arg]:
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, [args.vararg, args.kwarg])]


def _movable(fn: ast.FunctionDef, method: bool) -> list[str] | None:
    """The parameters of a helper whose body may move to its call (those
    of a method without ``self``), or None: plain positional parameters,
    no decorators, none rebound, no nested scope, no f-string (its names'
    positions are not the source's before Python 3.12), no ``return`` but
    a last one, no multi-line string."""
    args = fn.args
    if fn.decorator_list or args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        return None
    body = _body(fn)
    if not body or (body[-1].end_lineno or 0) - body[0].lineno + 1 > MAX_INLINED_LINES:
        return None
    params = [a.arg for a in args.args][1 if method else 0 :]
    for stmt in body:
        for n in walk(stmt):
            if isinstance(n, _REFUSED) or isinstance(n, ast.Return) and n is not body[-1]:
                return None
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load) and n.id in params:
                return None
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.lineno != n.end_lineno:
                return None
    return params


def _comprehension_names(fn: ast.FunctionDef) -> set[str]:
    return {n.id for c in walk(fn) if isinstance(c, ast.comprehension) for n in walk(c.target)
            if isinstance(n, ast.Name)}


def _locals(fn: ast.FunctionDef, params: list[str]) -> set[str]:
    """Every name ``fn``'s body binds, its parameters aside; a comprehension's
    variables only where the body binds them otherwise too (a comprehension
    is a scope of its own)."""
    bound = [n for s in _body(fn) for n in walk(s) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)]
    in_comprehensions = {id(n) for c in walk(fn) if isinstance(c, ast.comprehension) for n in walk(c.target)}
    return {n.id for n in bound if id(n) not in in_comprehensions} - set(params)


def _callers(tree: ast.Module) -> list[tuple[ast.FunctionDef, ast.ClassDef | None]]:
    """The functions of a definition a call may be inlined into: the
    definition itself, or a method of a class definition (never a nested
    function: its closure's names are not checked)."""
    node = tree.body[0]
    if isinstance(node, ast.FunctionDef):
        return [(node, None)]
    if isinstance(node, ast.ClassDef):
        return [(m, node) for m in node.body if isinstance(m, ast.FunctionDef)]
    return []


def _statement_of(call: ast.Call, fn: ast.FunctionDef) -> tuple[ast.stmt, str | None] | None:
    """The statement of ``fn`` that is ``call`` (``f(...)``, ``x = f(...)``,
    ``return f(...)``) and the name it assigns; None when the call is part
    of a larger expression or inside a nested scope."""
    for stmt in walk(fn):
        if isinstance(stmt, _SCOPES) and stmt is not fn:
            if any(n is call for n in walk(stmt)):
                return None
            continue
        if isinstance(stmt, (ast.Expr, ast.Return)) and stmt.value is call:
            return stmt, None
        if (isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            return stmt, stmt.targets[0].id
    return None


# Calls a body may make and still read an attribute passed to it as the caller would have.
_READING_BUILTINS = frozenset("all any bool dict enumerate frozenset len list max min range set sorted str sum tuple "
                              "zip".split())


def _attribute_chain(node: ast.expr) -> bool:
    """``a``, ``a.b``, ``a.b.c``: read, never called."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _arguments(call: ast.Call, fn: ast.FunctionDef, params: list[str], source: str,
               bind: bool) -> tuple[dict[str, str], list[tuple[str, str]]] | None:
    """Parameter -> the text the body reads in its place (the name or
    literal passed, or the literal default; an attribute like ``watch.step``
    where nothing between the call and the body's one expression can
    change it), and, where ``bind``, the parameters bound first to what
    the call passes them (``done = _worker_done(out, watch)``, in the
    call's order, one line each); None where a call passes anything else
    or splats."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    if len(call.args) > len(params):
        return None
    passed: dict[str, ast.expr] = dict(zip(params, call.args))
    for k in call.keywords:
        if k.arg not in params or k.arg in passed:
            return None
        passed[k.arg] = k.value
    defaults = dict(zip(params[len(params) - len(fn.args.defaults):], fn.args.defaults))
    body = _body(fn)
    calls_nothing = len(body) == 1 and isinstance(body[0], ast.Return) and all(
        isinstance(n.func, ast.Name) and n.func.id in _READING_BUILTINS for n in walk(body[0]) if isinstance(n, ast.Call))
    in_order = sorted(passed.items(), key=lambda item: (item[1].lineno, item[1].col_offset))
    out: dict[str, str] = {}
    bound: list[tuple[str, str]] = []
    for i, (p, value) in enumerate(in_order):
        text = ast.get_source_segment(source, value) or ""
        simple = isinstance(value, (ast.Name, ast.Constant)) or isinstance(value, ast.Tuple) and not value.elts
        later_simple = all(isinstance(v, (ast.Name, ast.Constant)) or _attribute_chain(v) for _, v in in_order[i + 1 :])
        if simple or _attribute_chain(value) and calls_nothing and later_simple:
            out[p] = text
        elif bind and value.lineno == value.end_lineno:
            bound.append((p, text))
        else:
            return None
    for p in params:
        if p in passed:
            continue
        value = defaults.get(p)
        if not (isinstance(value, ast.Constant) or isinstance(value, ast.Tuple) and not value.elts):
            return None
        out[p] = ast.unparse(value)  # type: ignore[arg-type]
    return out, bound


def _renamed_lines(source: str, stmts: list[ast.stmt], names: Mapping[str, str]) -> list[str]:
    """The lines of ``stmts`` with each name of ``names`` replaced (by position)."""
    lines = source.splitlines()
    first, last = stmts[0].lineno - 1, stmts[-1].end_lineno or stmts[-1].lineno
    spans = sorted(((n.lineno - 1, n.col_offset, n.end_col_offset, names[n.id]) for s in stmts for n in walk(s)
                    if isinstance(n, ast.Name) and n.id in names and names[n.id] != n.id), reverse=True)
    for line, start, end, new in spans:
        text = lines[line].encode()
        lines[line] = (text[:start] + new.encode() + text[end:]).decode()  # type: ignore[operator]
    return lines[first:last]


def _reindented(lines: list[str], by: int, to: int) -> list[str]:
    return [" " * to + line[by:] if line.strip() else "" for line in lines]


def _inline_one(sources: Mapping[str, str], name: str, fn: ast.FunctionDef, owner: str, method: str | None,
                calls: list[tuple[str, ast.Call]]) -> dict[str, str] | None:
    """The caller's new source with ``fn`` (a function named ``name``, or
    the method ``method`` of the class ``owner``) inlined at its one call."""
    params = _movable(fn, method is not None)
    if params is None or len(calls) != 1:
        return None
    caller_name, call = calls[0]
    if caller_name == owner and method is None or caller_name.startswith("test_"):
        return None  # a test function (the truncation repro's) is the program: its helpers name its steps
    caller_source = sources[caller_name]
    caller_tree = parse(caller_source)
    call = next(n for n in walk(caller_tree) if isinstance(n, ast.Call)
                and (n.lineno, n.col_offset) == (call.lineno, call.col_offset))
    found = None
    for caller, cls in _callers(caller_tree):
        if method is not None and (cls is None or cls.name != owner or not caller.args.args
                                   or caller.args.args[0].arg != fn.args.args[0].arg):
            continue
        if any(n is call for n in walk(caller)):
            found = _statement_of(call, caller)
            break
    else:
        return None
    passed = _arguments(call, fn, params, caller_source, bind=found is not None)
    if passed is None:
        return None
    args, bound = passed
    if found is None:
        out = _expression_inlined(sources[owner], fn, params, caller_source, caller, call, args)
        return None if out is None else _without_method(caller_name, out, method)
    stmt, target = found
    body = _body(fn)
    last = body[-1]
    returned = last.value if isinstance(last, ast.Return) else None
    if isinstance(stmt, ast.Assign) and returned is None:
        return None  # x = f() where f returns None: leave it
    if isinstance(stmt, ast.Expr) and isinstance(last, ast.Return) and returned is not None:
        return None
    if isinstance(stmt, ast.Return) and not isinstance(last, ast.Return):
        return None  # return f() where f falls off its end: the caller would go on
    local = _locals(fn, params)
    caller_names = _names_in(caller)
    renames = {p: a for p, a in args.items()}
    free = {n.id for s in body for n in walk(s) if isinstance(n, ast.Name)} - set(params) - local
    free -= _comprehension_names(fn)
    if isinstance(stmt, ast.Assign) and isinstance(returned, ast.Name) and returned.id in local:
        renames[returned.id] = target  # type: ignore[assignment]  # the local it returns is the caller's name
        local = local - {returned.id}
        body = body[:-1]
    local |= {p for p, _ in bound}  # bound before the body: the caller's locals now
    if local & caller_names or _comprehension_names(fn) & {n for text in renames.values() for n in _names_in(parse(text))}:
        return None
    if method is not None:
        free.discard(fn.args.args[0].arg)
    caller_bound = {n.id for n in walk(caller) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    caller_bound |= {a.arg for a in _all_args(caller.args)}
    if free & caller_bound or target is not None and target in _names_in(fn) - {renames.get(target, "")}:
        return None
    fn_source = sources[owner]
    indent = body[0].col_offset if body else 0
    lines = _renamed_lines(fn_source, body, renames) if body else []
    moved = [" " * stmt.col_offset + f"{p} = {text}" for p, text in bound] + _reindented(lines, indent, stmt.col_offset)
    if isinstance(stmt, ast.Assign) and body and body[-1] is last and isinstance(last, ast.Return):
        head = " " * stmt.col_offset + "return "
        i = len(bound) + (last.lineno - 1) - (body[0].lineno - 1)
        assert moved[i].startswith(head)
        moved[i] = " " * stmt.col_offset + f"{target} = " + moved[i][len(head):]
    if isinstance(stmt, ast.Expr) and isinstance(last, ast.Return):
        moved = moved[: len(bound) + (last.lineno - 1) - (body[0].lineno - 1)]  # a bare return at the end
    caller_lines = caller_source.splitlines()
    new = caller_lines[: stmt.lineno - 1] + moved + caller_lines[stmt.end_lineno or stmt.lineno :]
    out = "\n".join(new)
    try:
        parse(out)
    except SyntaxError:
        return None
    return _without_method(caller_name, out, method)


def _expression_inlined(fn_source: str, fn: ast.FunctionDef, params: list[str], caller_source: str,
                        caller: ast.FunctionDef, call: ast.Call, args: Mapping[str, str]) -> str | None:
    """The caller's source with ``call`` replaced by the expression ``fn``
    returns (its only statement, on one line), the parameters renamed:
    parenthesised unless it is a name, attribute, item, call or literal."""
    body = _body(fn)
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    value = body[0].value
    if value.lineno != value.end_lineno or call.lineno != call.end_lineno:
        return None
    local = _locals(fn, params)
    free = _names_in(value) - set(params) - local - _comprehension_names(fn)
    if _comprehension_names(fn) & {n for text in args.values() for n in _names_in(parse(text))}:
        return None
    if method_self := (fn.args.args[0].arg if fn.args.args and params != [a.arg for a in fn.args.args] else None):
        free.discard(method_self)
    caller_bound = {n.id for n in walk(caller) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    caller_bound |= {a.arg for a in _all_args(caller.args)}
    if free & caller_bound or local & (_names_in(caller) | set(args.values())):
        return None
    segment = ast.get_source_segment(fn_source, value) or ""
    expr = "\n".join(_renamed_lines(segment, [parse(segment).body[0]], dict(args)))
    atomic = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant, ast.List, ast.Dict, ast.Set,
              ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.Tuple)
    if not isinstance(value, atomic) or isinstance(value, ast.Tuple):
        expr = f"({expr})"
    lines = caller_source.splitlines()
    raw = lines[call.lineno - 1].encode()
    lines[call.lineno - 1] = (raw[: call.col_offset] + expr.encode() + raw[call.end_col_offset:]).decode()  # type: ignore[operator]
    out = "\n".join(lines)
    try:
        parse(out)
    except SyntaxError:
        return None
    return out


# A helper whose whole body is ``return <expression>`` on one line this short
# is read more easily where it is called, however often.
MAX_EVERYWHERE_CHARACTERS = 40


def _in_test(call: ast.Call, caller: ast.AST) -> bool:
    """``call`` is what an ``if``/``while`` tests, or what ``not`` negates there."""
    for node in walk(caller):
        if isinstance(node, (ast.If, ast.While)):
            test = node.test
            if test is call or isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and test.operand is call:
                return True
    return False


def _inlined_everywhere(sources: Mapping[str, str], fn: ast.FunctionDef, owner: str,
                        callers: list[str]) -> dict[str, str] | None:
    """The callers' new sources with every call of ``fn``, a one-line
    ``return`` of a short expression, replaced by that expression (``bool(x)``
    tested by an ``if`` or ``while`` by ``x``); None where one call cannot be."""
    params = _movable(fn, False)
    body = _body(fn)
    if params is None or len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    value = body[0].value
    segment = ast.get_source_segment(sources[owner], value) or ""
    if value.lineno != value.end_lineno or len(segment) > MAX_EVERYWHERE_CHARACTERS:
        return None
    truth = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "bool" \
        and len(value.args) == 1 and not value.keywords
    out: dict[str, str] = {}
    for caller_name in dict.fromkeys(callers):
        source = out.get(caller_name, sources[caller_name])
        while True:
            tree = parse(source)
            call = next((n for n in walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                         and n.func.id == fn.name), None)
            if call is None:
                break
            caller = next((c for c, _ in _callers(tree) if any(n is call for n in walk(c))), None)
            passed = None if caller is None else _arguments(call, fn, params, source, bind=False)
            if caller is None or passed is None:
                return None
            one = fn
            if truth and _in_test(call, caller):  # bool(x) where only its truth is read: x
                one = ast.FunctionDef(fn.name, fn.args, [ast.Return(value.args[0], lineno=value.lineno,
                                                                    col_offset=value.args[0].col_offset)],
                                      [], None, None, lineno=fn.lineno, col_offset=fn.col_offset)
                ast.fix_missing_locations(one)
            new = _expression_inlined(sources[owner], one, params, source, caller, call, passed[0])
            if new is None:
                return None
            source = new
        out[caller_name] = source
    return out


def _without_method(caller_name: str, out: str, method: str | None) -> dict[str, str]:
    """``{caller_name: out}``, the inlined ``method`` (if one) gone from its class (the caller's)."""
    if method is None:
        return {caller_name: out}
    tree = parse(out)
    cls_node = tree.body[0]
    assert isinstance(cls_node, ast.ClassDef)
    m = next(x for x in cls_node.body if isinstance(x, ast.FunctionDef) and x.name == method)
    lines = out.splitlines()
    start = m.lineno - 1
    if start > 0 and not lines[start - 1].strip():
        start -= 1
    del lines[start : m.end_lineno]
    return {caller_name: "\n".join(lines)}


def inlined_helpers(sources: Mapping[str, str], plain: Iterable[str], extra: str,
                    keep: Iterable[str] = ()) -> dict[str, str]:
    """The definitions changed by moving one helper's body to its only
    call: a file function, or a method of a plain class called once as
    ``self.m(...)`` in that class, named nowhere else in the file (the test
    ``extra`` included, nor in a string), whose call is a whole statement
    (``f(...)``, ``x = f(...)``, ``return f(...)``) passing names or
    literals; neither the helper nor its caller in ``keep``, and no name
    of the helper's clashing with one of the caller's. One helper per call
    (the next round sees the moved code). Name -> new source."""
    keep = set(keep)
    plain = set(plain)
    trees = {name: parse(source) for name, source in sources.items()}
    every = [*trees.values(), *([parse(extra)] if extra else [])]
    names: dict[str, int] = {}
    attrs: dict[str, int] = {}
    strings: set[str] = set()
    for tree in every:
        tops = {id(tree.body[0])} if tree.body else set()
        if tree.body and isinstance(tree.body[0], ast.ClassDef):
            tops |= {id(m) for m in tree.body[0].body}
        for n in walk(tree):
            if isinstance(n, ast.Name):
                names[n.id] = names.get(n.id, 0) + 1
            elif isinstance(n, ast.Attribute):
                attrs[n.attr] = attrs.get(n.attr, 0) + 1
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                strings.add(n.value)
            elif isinstance(n, ast.FunctionDef) and id(n) not in tops:
                names[n.name] = names.get(n.name, 0) + 1  # a nested def of the same name
    for name, tree in sorted(trees.items()):  # by name: the file must not depend on a set's order
        if name in keep:
            continue
        node = tree.body[0]
        candidates: list[tuple[ast.FunctionDef, str | None, list[tuple[str, ast.Call]]]] = []
        if isinstance(node, ast.FunctionDef) and names.get(name) == 1 and name not in strings:
            calls = [(owner, n) for owner, t in trees.items() for n in walk(t)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name]
            candidates.append((node, None, calls))
        elif (isinstance(node, ast.FunctionDef) and name not in strings and names.get(name, 0) > 1
              and name not in _names_in(parse(extra) if extra else ast.Module([], []))):
            calls = [(owner, n) for owner, t in trees.items() for n in walk(t)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name]
            if len(calls) == names[name] and not any(caller in keep for caller, _ in calls):
                changed = _inlined_everywhere(sources, node, name, [caller for caller, _ in calls])
                if changed:
                    return changed
        elif isinstance(node, ast.ClassDef) and name in plain:
            for m in node.body:
                if (isinstance(m, ast.FunctionDef) and not m.name.startswith("__") and attrs.get(m.name) == 1
                        and m.name not in strings and names.get(m.name, 0) == 0):
                    calls = [(name, n) for n in walk(node) if isinstance(n, ast.Call)
                             and isinstance(n.func, ast.Attribute) and n.func.attr == m.name
                             and isinstance(n.func.value, ast.Name) and n.func.value.id == m.args.args[0].arg]
                    candidates.append((m, m.name, calls))
        for fn, method, calls in candidates:
            if any(caller in keep for caller, _ in calls):
                continue
            changed = _inline_one(sources, name, fn, name, method, calls)
            if changed:
                return changed
    return {}
