"""The source a standalone repro carries: the repro kit's definitions its
program and failing claim need, specialised to the run's configuration.

The kit (:mod:`fuzz.kit`) is real modules; this module reads their source
(:func:`inspect.getsource`) and selects from it, never edits it as text:

* **specialising**: an ``if`` whose test reads only the file's constants
  (``if ASYNC_SCHEDULING:``, ``if WATCH_POOL:``) keeps the branch those
  values take, so a sync file carries no batch queue and a file whose claim
  reads no pool records keeps none;
* **selecting**: from the names the test function uses, the kit
  definitions they reach (and the ones those reach), the constants they
  read and the imports they need; of a kit class without bases (the
  watch, the worker's record), only the methods something calls;
* **dropping** (:mod:`fuzz.repro.prune`'s passes, run until nothing
  changes): what nothing in the file reads; then a helper the file calls
  once moves to its call (:mod:`fuzz.repro.prune_inline`), and the copied
  code loses its type annotations (:mod:`fuzz.repro.prune_annotations`);
* **trimming**: each copied definition's docstring cut to its first
  sentence (where it runs over two lines, its first line's words up to a
  colon; without one, the docstring goes: no fragment) and its
  comment-only lines dropped (read with :mod:`ast` and
  :mod:`tokenize`), except the definitions the file names in full (its
  failing check): the kit stays documented, the file stays short.

Definitions keep the kit's order: the constants, then the connector, the
builders, the models, the watch, the step loop, the checks.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import io
import re
import sys
import tokenize
from collections.abc import Iterable, Mapping

from fuzz.kit import KIT_MODULES
from fuzz.repro.prune import (
    calls_doing_nothing,
    constant_fields,
    never_filled,
    unread_records,
    unused_parameters,
    without_lines,
    without_unused_locals,
)
from fuzz.repro.prune_annotations import without_annotations
from fuzz.repro.prune_defaults import without_default_arguments
from fuzz.repro.prune_inline import inlined_helpers
from fuzz.repro.prune_fields import unread_fields
from fuzz.repro.prune_triage import without_triage
from fuzz.repro.prune_stores import with_literals_inlined, without_overwritten_stores, without_unread_names
from fuzz.repro.trees import parse, walk

__all__ = ["KitSource", "kit_attributes", "kit_definitions", "kit_source", "specialise", "trim"]

# Bases that read nothing of a subclass's own: a class on them counts as
# plain (its records and methods nothing reads may go), like one without.
_PLAIN_BASES = frozenset({"AssertionError", "Exception"})


@dataclasses.dataclass(frozen=True)
class _Def:
    name: str
    module: str
    source: str
    is_plain_class: bool  # a class without bases (but _PLAIN_BASES): its unused methods may go


@dataclasses.dataclass(frozen=True)
class KitSource:
    """What a file carries of the kit: its imports, the constants its code
    reads (names), and the code itself."""

    imports: tuple[str, ...]
    constants: frozenset[str]
    code: str


def _with_comments_above(lines: list[str], start: int) -> int:
    """The first line of the comment block right above line ``start`` (0-based)."""
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return start


@functools.cache
def _module_parts(modules: tuple[str, ...] = KIT_MODULES) -> tuple[dict[str, _Def], dict[str, tuple[str, str | None]]]:
    """Every top-level definition of the kit's ``modules`` (name -> _Def) and
    every name they import from outside the suite (name -> (module,
    attribute or None)). The constants modules (``*_params``) are the
    file's to write, not to copy."""
    defs: dict[str, _Def] = {}
    imports: dict[str, tuple[str, str | None]] = {}
    for name in modules:
        if name.endswith("_params"):
            continue
        source = inspect.getsource(importlib.import_module(name))
        lines = source.splitlines()
        for node in parse(source).body:
            if isinstance(node, ast.ImportFrom):
                if node.module == "__future__" or (node.module or "").startswith(("fuzz", "invariants")):
                    continue
                for alias in node.names:
                    imports[alias.asname or alias.name] = (node.module or "", alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imports[alias.asname or alias.name] = (alias.name, None)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                text = "\n".join(lines[_with_comments_above(lines, first) : node.end_lineno])
                plain = isinstance(node, ast.ClassDef) and all(
                    isinstance(b, ast.Name) and b.id in _PLAIN_BASES for b in node.bases)
                _add(defs, _Def(node.name, name, text, plain))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id.startswith("__"):
                    continue  # __all__: the module's, not the file's
                text = "\n".join(lines[_with_comments_above(lines, node.lineno - 1) : node.end_lineno])
                _add(defs, _Def(node.targets[0].id, name, text, False))
    return defs, imports


def _add(defs: dict[str, _Def], d: _Def) -> None:
    if d.name in defs:
        raise ValueError(f"the kit defines {d.name} twice: in {defs[d.name].module} and {d.module}")
    defs[d.name] = d


def kit_definitions(modules: tuple[str, ...] = KIT_MODULES) -> dict[str, str]:
    """Every definition the kit's ``modules`` can copy into a file: name -> module."""
    return {name: d.module for name, d in _module_parts(modules)[0].items()}


# ---------------------------------------------------------------------------
# Specialising on the file's constants
# ---------------------------------------------------------------------------

_STATIC = (ast.Name, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Load, ast.cmpop, ast.boolop, ast.Not)


def _static_value(test: ast.expr, constants: Mapping[str, object]) -> tuple[bool, bool]:
    """(known, value) of an ``if`` test that reads only ``constants``: names,
    and ``owner.attr`` keys for attributes whose truth the file fixes (read
    only as a test, or through ``not``, ``and``, ``or``: an operand after
    the one that decides need not be known)."""
    if isinstance(test, ast.BoolOp):
        decisive = isinstance(test.op, ast.Or)  # the value that ends the evaluation
        for operand in test.values:
            known, value = _static_value(operand, constants)
            if not known or value == decisive:
                return known, decisive if known else False
        return True, not decisive
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        known, value = _static_value(test.operand, constants)
        return known, known and not value
    if isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name):
        key = f"{test.value.id}.{test.attr}"
        return (True, bool(constants[key])) if key in constants else (False, False)
    for node in walk(test):
        if not isinstance(node, _STATIC) or (isinstance(node, ast.Name) and node.id not in constants):
            return False, False
    code = compile(ast.Expression(test), "<kit>", "eval")
    return True, bool(eval(code, {"__builtins__": {}}, dict(constants)))  # noqa: S307 - names and literals only


def _dedent(lines: list[str], by: int) -> list[str]:
    return [line[by:] if line[:by].strip() == "" else line for line in lines]


def _first_static_if(tree: ast.AST, constants: Mapping[str, object]) -> tuple[ast.If, bool] | None:
    for node in walk(tree):  # breadth-first: an outer if before the ones inside it
        if isinstance(node, ast.If):
            known, value = _static_value(node.test, constants)
            if known:
                return node, value
    return None


def specialise(source: str, constants: Mapping[str, object]) -> str:
    """``source`` with every ``if`` on the constants reduced to the branch
    they take (the branch's lines moved out one level; an ``elif`` on a
    constant is refused: the kit writes ``else: if``). A key ``owner.attr``
    of ``constants`` gives that attribute's truth (see :func:`_static_value`)."""
    while True:
        found = _first_static_if(parse(source), constants)
        if found is None:
            return source
        node, value = found
        lines = source.splitlines()
        indent = len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())
        if node.orelse and isinstance(node.orelse[0], ast.If) and node.orelse[0].col_offset == node.col_offset:
            raise ValueError(f"elif on a constant at line {node.lineno}: write else: if")
        if value:
            kept = lines[node.test.end_lineno : node.body[-1].end_lineno]  # type: ignore[misc]
            by = node.body[0].col_offset - indent
        elif node.orelse:
            else_line = next(i for i in range(node.body[-1].end_lineno, node.orelse[0].lineno)  # type: ignore[arg-type]
                             if lines[i].strip().startswith("else"))
            kept = lines[else_line + 1 : node.orelse[-1].end_lineno]
            by = node.orelse[0].col_offset - indent
        else:
            kept = []
        source = "\n".join(lines[: node.lineno - 1] + _dedent(kept, by if kept else 0) + lines[node.end_lineno :])


# ---------------------------------------------------------------------------
# Trimming what a reader of the file can do without
# ---------------------------------------------------------------------------

_DOCUMENTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# The end of a docstring's first sentence: a full stop before a capital, or at the paragraph's end.
_SENTENCE_END = re.compile(r"\.(?=\s+[A-Z]|\s*$)")


# A first sentence longer than this many lines is cut to its first line.
_SUMMARY_LINES = 2


def _summary(doc: str) -> str | None:
    """The first sentence of a docstring's first paragraph (its line breaks
    kept); where the sentence runs longer, its first line's words up to a
    colon or semicolon as a sentence of their own, else None (no fragment)."""
    paragraph = doc.split("\n\n", 1)[0].rstrip()
    end = _SENTENCE_END.search(paragraph)
    sentence = paragraph if end is None else paragraph[: end.end()]
    lines = sentence.splitlines()
    if len(lines) <= _SUMMARY_LINES:
        return sentence
    clause = re.match(r"(.+?)[:;]\s", lines[0])
    return None if clause is None else clause.group(1).rstrip(",") + "."


def trim(source: str) -> str:
    """``source`` with every docstring cut to its first sentence (see
    :func:`_summary`; one it cannot cut goes) and every comment-only line
    dropped; code, trailing comments and one-line docstrings stay as they are."""
    lines = source.splitlines()
    edits: dict[int, tuple[int, list[str]]] = {}  # first line (0-based) -> (end, replacement)
    for node in walk(parse(source)):
        if not isinstance(node, _DOCUMENTED) or not node.body:
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            continue
        start, end = first.lineno - 1, first.end_lineno or first.lineno
        text = lines[start:end]
        doc = ast.get_docstring(node)
        if doc is None or any("\\" in line for line in text):
            continue  # escapes: the source is not the text, keep it
        cut = _summary(doc)
        if cut is None and len(node.body) > 1:
            blank_after = end < len(lines) and not lines[end].strip()
            edits[start] = (end + blank_after, [])  # a sentence too long to cut: the code says it (no gap left)
            continue
        summary = (cut or doc.splitlines()[0]).splitlines()
        if len(summary) == end - start and end - start == 1:
            continue
        indent = " " * first.col_offset
        quote = '"""'
        new = [indent + quote + summary[0]] + [indent + line if line else "" for line in summary[1:]]
        new[-1] += quote
        edits[start] = (end, new)
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comment_only = {
        tok.start[0] - 1 for tok in tokens if tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip()
    }
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i in edits:
            end, new = edits[i]
            out += new
            i = end
            continue
        if i not in comment_only:
            out.append(lines[i])
        i += 1
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Selecting what the file needs
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _names(source: str) -> frozenset[str]:
    """Every name ``source`` reads but its own parameters (a name only
    bound, such as a dataclass field's, or a parameter's, refers to no
    definition of the file)."""
    tree = parse(source)
    params = {
        a.arg for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for a in (*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs, n.args.vararg, n.args.kwarg) if a is not None
    }
    return frozenset(
        n.id for n in walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store) and n.id not in params
    )


@functools.lru_cache(maxsize=8192)
def kit_attributes(source: str) -> frozenset[str]:
    """Every attribute name ``source`` spells (``x.name``)."""
    return frozenset(n.attr for n in walk(parse(source)) if isinstance(n, ast.Attribute))


def _without_methods(source: str, keep: set[str]) -> str:
    """A plain class's source without the methods not in ``keep`` (dunders stay)."""
    cls = parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    lines = source.splitlines()
    drop = [
        m for m in cls.body
        if isinstance(m, ast.FunctionDef) and m.name not in keep and not m.name.startswith("__")
    ]
    for m in reversed(drop):
        first = min([m.lineno] + [d.lineno for d in m.decorator_list]) - 1
        first = _with_comments_above(lines, first)
        if first > 0 and not lines[first - 1].strip():
            first -= 1  # the blank line before it
        del lines[first : m.end_lineno]
    return "\n".join(lines)


def kit_source(
    roots: Iterable[str],
    constants: Mapping[str, object],
    *,
    constant_names: Iterable[str] = (),
    extra: str = "",
    more_imports: Mapping[str, tuple[str, str | None]] | None = None,
    modules: tuple[str, ...] = KIT_MODULES,
    in_full: Iterable[str] = (),
    defaults: Mapping[str, Mapping[str, object]] | None = None,
) -> KitSource:
    """The kit code reached from ``roots`` (names a file's own code uses;
    ``extra``: more of that code, whose names count as roots too),
    specialised to ``constants`` (the file's constants whose values an
    ``if`` may read; ``constant_names``: the others it defines): its
    imports (the kit's, and ``more_imports`` for names the file's own code
    uses), the constants it reads, and the definitions in kit order, each
    trimmed (:func:`trim`) but those named ``in_full``; a keyword argument
    equal to the default vLLM declares for it (``defaults``: class name ->
    field -> default) is left unsaid."""
    defs, kit_imports = _module_parts(modules)
    imports = {**kit_imports, **(more_imports or {})}
    names_of_constants = set(constants) | set(constant_names)
    in_full = frozenset(in_full)
    roots = set(roots) | (_names(extra) if extra else set())
    sources = {name: without_default_arguments(specialise(d.source, constants), defaults or {}, constants)
               for name, d in defs.items()}
    kept_methods: dict[str, set[str] | None] = {name: None for name, d in defs.items() if d.is_plain_class}
    tidied: dict[str, str] = {}  # a source -> what the per-definition passes make of it
    while True:
        selected: set[str] = set()
        todo = [n for n in roots if n in defs]
        while todo:
            name = todo.pop()
            if name in selected:
                continue
            selected.add(name)
            todo += [n for n in _names(sources[name]) if n in defs and n not in selected]
        attrs = set(kit_attributes(extra)) if extra else set()
        for name in selected:
            attrs |= kit_attributes(sources[name])
        changed = False
        for name in selected & set(kept_methods):
            if kept_methods[name] != attrs:
                kept_methods[name] = attrs
                pruned = _without_methods(sources[name], attrs)  # attrs only shrink: pruning again is the same
                changed |= pruned != sources[name]
                sources[name] = pruned
        chosen = {name: sources[name] for name in selected}
        for name, lines in unread_records(chosen, selected & set(kept_methods), extra).items():
            dropped = without_lines(sources[name], lines)
            try:
                parse(dropped)
            except SyntaxError:  # a body left empty: the record stays
                continue
            changed |= dropped != sources[name]
            sources[name] = dropped
        chosen = {name: sources[name] for name in selected}
        for name, new in unread_fields(chosen, selected & set(kept_methods), extra).items():
            changed |= _replace(sources, name, new)
        for name in selected:
            if sources[name] not in tidied:  # most definitions come back unchanged from a round
                kept = without_unused_locals(sources[name])
                kept = without_unread_names(with_literals_inlined(without_overwritten_stores(kept)))
                tidied[sources[name]] = without_triage(without_default_arguments(kept, defaults or {}, constants))
            kept = tidied[sources[name]]
            changed |= kept != sources[name]
            sources[name] = kept
        changed |= _prune(sources, selected, selected & set(kept_methods), constants, extra, in_full)
        if not changed:  # what is left: a helper called once moves to its call, one a round
            chosen = {name: sources[name] for name in selected}
            for name, new in inlined_helpers(chosen, selected & set(kept_methods), extra, keep=in_full).items():
                changed |= _replace(sources, name, new)
        if not changed:
            break
    for name in selected:  # typed for the suite; the file is read, not type-checked
        sources[name] = without_annotations(sources[name])
    used: set[str] = set(roots)
    for name in selected:
        used |= _names(sources[name])
    ordered = [name for name in defs if name in selected]  # definition order, module by module
    return KitSource(
        imports=_render_imports({n: imports[n] for n in used if n in imports and n not in defs}),
        constants=frozenset(n for n in used if n in names_of_constants and n not in defs),
        code=_joined([sources[name] if name in in_full else trim(sources[name]) for name in ordered]),
    )


def _prune(sources: dict[str, str], selected: set[str], plain: set[str], constants: Mapping[str, object],
           extra: str, in_full: frozenset[str]) -> bool:
    """One round of :mod:`fuzz.repro.prune`'s later passes over the selected
    ``sources`` (changed in place): each ``if`` on a record the file never
    fills or on a field it fixes decided, calls that do nothing dropped,
    then parameters nothing reads (the definitions ``in_full`` keep theirs).
    Whether anything changed."""
    changed = False
    chosen = {name: sources[name] for name in selected}
    empty = {f"watch.{r}": () for r in never_filled(chosen, plain, extra)}
    fields = constant_fields(chosen, plain, extra, constants)
    for name in selected:
        facts = {**empty, **{"self." + k[6:]: v for k, v in empty.items()}, **fields.get(name, {})} if name in plain else empty
        if facts:
            decided = specialise(sources[name], {**constants, **facts})
            changed |= _replace(sources, name, decided)
    chosen = {name: sources[name] for name in selected}
    for name, lines in calls_doing_nothing(chosen).items():
        changed |= _replace(sources, name, without_lines(sources[name], lines))
    chosen = {name: sources[name] for name in selected}
    for name, cut in unused_parameters(chosen, plain, extra, keep=in_full).items():
        changed |= _replace(sources, name, cut)
    return changed


def _replace(sources: dict[str, str], name: str, new: str) -> bool:
    """``sources[name] = new`` where ``new`` parses and differs."""
    if new == sources[name]:
        return False
    try:
        parse(new)
    except SyntaxError:  # a body left empty: it stays
        return False
    sources[name] = new
    return True


def _joined(parts: list[str]) -> str:
    """Definitions two blank lines apart (PEP 8), a run of constants one line after another."""
    out = ""
    constant_before = False
    for part in parts:
        constant = isinstance(parse(part).body[0], ast.Assign)
        out += ("\n" if constant and constant_before else "\n\n\n") + part if out else part
        constant_before = constant
    return out


def _render_imports(names: Mapping[str, tuple[str, str | None]]) -> tuple[str, ...]:
    """``import x`` lines then ``from m import (...)`` blocks: standard library first, then the rest."""
    plain = sorted({m for m, attr in names.values() if attr is None})
    froms: dict[str, list[str]] = {}
    for name, (module, attr) in names.items():
        if attr is not None:
            froms.setdefault(module, []).append(attr if attr == name else f"{attr} as {name}")

    def stdlib(module: str) -> bool:
        return module.split(".")[0] in sys.stdlib_module_names

    out: list[str] = []
    for group in (True, False):
        block = [f"import {m}" for m in plain if stdlib(m) == group]
        for module in sorted(m for m in froms if stdlib(m) == group):
            attrs = sorted(froms[module])
            one = f"from {module} import {', '.join(attrs)}"
            block.append(one if len(one) <= 120 else f"from {module} import (\n" + "".join(f"    {a},\n" for a in attrs) + ")")
        if block:
            out += [*block, ""]
    return tuple(out[:-1])
