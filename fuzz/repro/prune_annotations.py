"""Type annotations out of a repro file's copied kit code.

The kit is typed for the suite's own checks; a repro file is a test a vLLM
contributor reads, and vLLM's tests/v1/core helpers carry no annotations.
:func:`without_annotations` drops them from the copied code (so the
``typing`` and ``collections.abc`` imports they alone needed go too), read
with :mod:`ast` and cut by position. What an annotation does at run time
stays: a class body's annotated fields (a dataclass's) keep theirs.
"""

from __future__ import annotations

import ast

from fuzz.repro.trees import parse, walk

__all__ = ["without_annotations"]

# A signature joined onto one line only where it fits.
_LINE_LENGTH = 100

_Pos = tuple[int, int]  # (line 1-based, column in UTF-8 bytes), as ast gives them


def _offsets(source: str) -> tuple[list[str], list[int]]:
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    return lines, starts


def without_annotations(source: str) -> str:
    """``source`` without its parameters' and returns' annotations, nor a
    function's annotated assignments' (``x: T = v`` becomes ``x = v``);
    a signature that then fits on one line is joined onto it."""
    tree = parse(source)
    lines, starts = _offsets(source)

    def offset(pos: _Pos) -> int:
        line, col = pos
        return starts[line - 1] + len(lines[line - 1].encode()[:col].decode())

    cuts: list[tuple[int, int]] = []
    functions = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for fn in functions:
        args = fn.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, [args.vararg, args.kwarg])]:
            if a.annotation is not None:
                name_end = offset((a.lineno, a.col_offset)) + len(a.arg)
                end = offset((a.annotation.end_lineno, a.annotation.end_col_offset))  # type: ignore[arg-type]
                if source[end : end + 3] == " = ":  # x: T = d becomes x=d
                    cuts += [(end, end + 1), (end + 2, end + 3)]
                cuts.append((name_end, end))
        if fn.returns is not None:
            start = offset((fn.returns.lineno, fn.returns.col_offset))
            arrow = source.rindex("->", 0, start)
            while arrow > 0 and source[arrow - 1] in " \t":
                arrow -= 1
            cuts.append((arrow, offset((fn.returns.end_lineno, fn.returns.end_col_offset))))  # type: ignore[arg-type]
        for node in walk(fn):
            if isinstance(node, ast.AnnAssign) and node.value is not None and node.simple in (0, 1):
                target_end = offset((node.target.end_lineno, node.target.end_col_offset))  # type: ignore[arg-type]
                cuts.append((target_end, offset((node.annotation.end_lineno, node.annotation.end_col_offset))))  # type: ignore[arg-type]
    out = source
    for a, b in sorted(set(cuts), reverse=True):
        out = out[:a] + out[b:]
    return _joined_signatures(out)


def _joined_signatures(source: str) -> str:
    """``source`` with each function header spread over lines joined onto one
    where it fits (its parameters as :func:`ast.unparse` writes them), unless a
    comment stands in it."""
    tree = parse(source)
    lines = source.splitlines()
    headers = []
    for fn in walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first, body = fn.lineno - 1, fn.body[0].lineno - 1
        end = max((i for i in range(first, body) if lines[i].rstrip().endswith(":")), default=first)
        if end > first and not any("#" in line for line in lines[first : end + 1]):
            headers.append((first, end, fn))
    for first, end, fn in sorted(headers, key=lambda h: h[0], reverse=True):
        indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
        prefix = "async def " if isinstance(fn, ast.AsyncFunctionDef) else "def "
        joined = f"{indent}{prefix}{fn.name}({ast.unparse(fn.args)}):"
        if len(joined) <= _LINE_LENGTH:
            lines[first : end + 1] = [joined]
    return "\n".join(lines)
