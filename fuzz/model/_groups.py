"""Facts about one group every room reads: its expected behaviour (from the
spec-kind table), its kind and name for messages, and the connector answer
the scheduler acts on."""

from __future__ import annotations

from fuzz.model._classification import Behaviour, behaviour_of, classification_of_kind
from fuzz.model._kv import GroupInfo, Span, SpecDraw, answer_acted_on, cdiv, group_kind, group_name

__all__ = ["answer_acted_on", "cdiv", "group_behaviour", "group_kind", "group_name", "span_of"]


def group_behaviour(info: GroupInfo) -> Behaviour:
    """The table's behaviour for the group; a group vLLM says is not
    prefix-cacheable is scratch whatever its class."""
    if not info.prefix_cacheable:
        return Behaviour.SCRATCH
    return behaviour_of(info.spec_class)


def span_of(group: SpecDraw) -> tuple[str, int, Span] | None:
    """The group's attention span as the table names it: its span parameter,
    that parameter's value and how it skips old tokens (None: it reads every
    earlier token, or it is the uniform-type wrapper)."""
    row = classification_of_kind(group.kind)
    if row.span is None or group.inner:
        return None
    value = group.param(row.span[0])
    return None if value is None else (row.span[0], value, row.span[1])
