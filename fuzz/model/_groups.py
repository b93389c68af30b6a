"""Facts about one group every room reads: its expected behaviour (from the
spec-kind table), its kind and name for messages, and the connector answer
the scheduler acts on."""

from __future__ import annotations

from fuzz.model._classification import Behaviour, behaviour_of
from fuzz.model._kv import GroupInfo, answer_acted_on, cdiv, group_kind, group_name

__all__ = ["answer_acted_on", "cdiv", "group_behaviour", "group_kind", "group_name"]


def group_behaviour(info: GroupInfo) -> Behaviour:
    """The table's behaviour for the group; a group vLLM says is not
    prefix-cacheable is scratch whatever its class."""
    if not info.prefix_cacheable:
        return Behaviour.SCRATCH
    return behaviour_of(info.spec_class)
