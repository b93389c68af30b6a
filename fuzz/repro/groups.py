"""What a scheduler repro file says of each KV-cache group, from the
failing run's layout as the harness derives it: the kit's role for it, the
spec-kind table's behaviour and span rule, and which blocks a step reads
(the constants ``ROLES``, ``BEHAVIOURS``, ``SPANS`` and ``READ_RULES`` of
:mod:`fuzz.kit._params`)."""

from __future__ import annotations

from fuzz import adapter
from fuzz.model import Behaviour, OpLog, group_behaviour, span_of

__all__ = ["behaviours_of", "read_rules_of", "roles_of", "spans_of"]

_ROLE = {Behaviour.MUST_COVER: "must-cover", Behaviour.MAY_BE_SHORT: "whole-state", Behaviour.SCRATCH: "scratch"}


def behaviours_of(log: OpLog) -> list[str]:
    """Per group, how the spec-kind table says it must truncate (Behaviour's value)."""
    return [group_behaviour(g).value for g in log.config.groups]


def roles_of(log: OpLog) -> list[str]:
    """Per group: must-cover, windowed (must-cover, but its attention span
    skips old tokens: the file's checks leave it out), whole-state, scratch."""
    roles = []
    for g, draw in zip(log.config.groups, log.config.draw.layout.groups):
        role = _ROLE.get(group_behaviour(g), "scratch")
        if role == "must-cover" and span_of(draw) is not None:
            role = "windowed"
        roles.append(role)
    return roles


def spans_of(log: OpLog) -> list[tuple[str, int, str] | None]:
    """Per group, its attention span as the harness derives it
    (:func:`fuzz.model.span_of`), the rule spelt by its value."""
    spans = map(span_of, log.config.draw.layout.groups)
    return [None if span is None else (span[0], span[1], span[2].value) for span in spans]


def read_rules_of(log: OpLog) -> list[tuple[str, int]]:
    """Per group, which of a running request's blocks a step reads: the
    ownership model's rule (:func:`invariants.ownership.read_indices`), from
    the layout as the harness derives it."""
    from types import SimpleNamespace

    from fuzz.adapter._ownership import read_rules

    draws = log.config.draw.layout.groups
    spans = [None if s is None else s[:2] for s in spans_of(log)]
    config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=adapter.build_spec(d)) for d in draws])
    return list(read_rules(config, log.config.groups, tuple(spans), tuple(behaviours_of(log))))
