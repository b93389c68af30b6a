"""Leaving vLLM's defaults unsaid in a repro file.

The kit builds vLLM's configs with every argument a drawn scenario may
change (``long_prefill_token_threshold``, ``prefill_schedule_interval``,
the model's ``seed`` ...); a file whose scenario keeps one at the default
vLLM declares for it says nothing by passing it, so
:func:`without_default_arguments` drops that keyword (and with it the
file's constant, once nothing else reads it). A value is dropped only
where it is a literal or one of the file's constants, of the default's own
type and equal to it: passing it or not builds the same config.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from fuzz.repro.prune import _call_items, _cut, _list_cuts, _span
from fuzz.repro.trees import parse, walk

__all__ = ["without_default_arguments"]


def _value(node: ast.expr, constants: Mapping[str, object]) -> tuple[bool, object]:
    if isinstance(node, ast.Constant):
        return True, node.value
    if isinstance(node, ast.Name) and node.id in constants:
        return True, constants[node.id]
    return False, None


def without_default_arguments(source: str, defaults: Mapping[str, Mapping[str, object]],
                              constants: Mapping[str, object]) -> str:
    """``source`` without each keyword argument of a call to a class named in
    ``defaults`` (class name -> field -> declared default) whose value is
    that default."""
    if not any(name in source for name in defaults):
        return source
    cuts = []
    for call in walk(parse(source)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in defaults):
            continue
        declared = defaults[call.func.id]
        items = _call_items(call)
        gone = set()
        for i, item in enumerate(items):
            if not isinstance(item, ast.keyword) or item.arg not in declared:
                continue
            static, value = _value(item.value, constants)
            default = declared[item.arg]
            if static and type(value) is type(default) and value == default:
                gone.add(i)
        cuts += _list_cuts([_span(item) for item in items], gone)
    return _cut(source, cuts) if cuts else source
