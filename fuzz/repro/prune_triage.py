"""The suite's triage out of a repro file's carried checks.

A file states a claim with the suite's check itself where the kit carries
it (:data:`fuzz.kit.SUITE_CHECK_MODULES`). Those checks raise violations
with the structured facts a known-bug match reads (the vLLM call to blame,
the failing condition's state, the group kind, vLLM's exception and
frames), which a file never reads: :func:`without_triage` drops those
keyword arguments of every violation the file raises, and with them the
triage helpers that only computed them (the file's other passes take what
nothing calls any more). What fails, and the message, stay as they are.
"""

from __future__ import annotations

import ast

from fuzz.repro.prune import _call_items, _cut, _list_cuts, _span
from fuzz.repro.trees import parse, walk

__all__ = ["without_triage"]

# The violation classes a carried check raises, and the facts only triage reads.
_VIOLATIONS = frozenset({"InvariantViolation", "MissedHit"})
_TRIAGE = frozenset({"where", "state", "group_kind", "exception", "frames", "statement", "facts"})


def without_triage(source: str) -> str:
    """``source`` without the triage keyword arguments of each violation it
    builds (a call of a class in :data:`_VIOLATIONS`)."""
    if not any(name in source for name in _VIOLATIONS):
        return source
    cuts = []
    for call in walk(parse(source)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in _VIOLATIONS):
            continue
        items = _call_items(call)
        gone = {i for i, item in enumerate(items) if isinstance(item, ast.keyword) and item.arg in _TRIAGE}
        cuts += _list_cuts([_span(item) for item in items], gone)
    return _cut(source, cuts) if cuts else source
