"""Facts about one group every room reads: its expected behaviour (from the
spec-kind table), its kind and name for messages, and the connector answer
the scheduler acts on."""

from __future__ import annotations

from fuzz.model._classification import Behaviour, behaviour_of
from fuzz.model._kv import GroupInfo, cdiv, group_kind, group_name
from fuzz.model._scheduler import AdmissionObservation

__all__ = ["answer_acted_on", "cdiv", "group_behaviour", "group_kind", "group_name"]


def group_behaviour(info: GroupInfo) -> Behaviour:
    """The table's behaviour for the group; a group vLLM says is not
    prefix-cacheable is scratch whatever its class."""
    if not info.prefix_cacheable:
        return Behaviour.SCRATCH
    return behaviour_of(info.spec_class)


def answer_acted_on(adm: AdmissionObservation) -> int | None:
    """The connector's answer as the scheduler acts on it: what it returned,
    except for a request that skips reading the prefix cache, whose answer
    vLLM replaces by 0 right after asking (``Scheduler.schedule``: ``if
    request.skip_reading_prefix_cache: ext_tokens, load_kv_async = 0,
    False``), so no truncation or load follows from it."""
    return 0 if adm.skips_prefix_cache else adm.reply
