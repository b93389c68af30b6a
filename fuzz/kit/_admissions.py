"""What a standalone repro watches of each admission, for the admission
claims of :mod:`invariants.scheduler` (whose checks the file carries as they
are): each request admitted in a step, kept as an :class:`Admission` under
the field names of the suite's ``AdmissionObservation``, with the spec-kind
table's verdict on each group as the writer resolved it (BEHAVIOURS, SPANS).
"""

from __future__ import annotations

import dataclasses

from fuzz.kit._build import _describe_groups
from fuzz.kit._hits import _groups
from fuzz.kit._params import BEHAVIOURS, DIVERGENT_HITS, NULL_BLOCK, SCHEDULER_BLOCK_SIZE, SPANS
from fuzz.model._kv import Behaviour, Span


@dataclasses.dataclass(frozen=True)
class Admission:
    """One request's trip through the prefix-cache branch of the step that
    admitted it, as the suite's admission claims read an
    ``AdmissionObservation``: the fields they read, under the same names
    (tests/findings/test_repro_kit.py holds them to it)."""

    request_id: str
    step: int
    num_tokens: int
    groups: tuple  # GroupInfo per group
    spans: tuple  # per group, (its span parameter, value) or None
    behaviours: tuple  # per group, Behaviour
    span_rules: tuple  # per group, Span or None
    scheduler_block_size: int
    null_block_id: int
    divergent_capable: bool
    local_hit: int  # the scheduler's local lookup
    local_blocks: tuple
    per_group_hits: tuple  # beside it, each group's own hit and the joint hit
    joint_hit: int
    joint_blocks: tuple
    reply: int | None  # the connector's answer (0 without a connector)
    reply_async: bool
    alloc_local_tokens: int  # what allocate_slots was handed
    alloc_local_blocks: tuple
    alloc_external_tokens: int
    admitted: bool
    num_computed_tokens: int
    connector_external_tokens: int  # what the connector was told to load
    block_table: tuple
    cow_dst_ids: frozenset  # the step's copy-on-write destinations
    skips_prefix_cache: bool

    @property
    def partial_tail(self):
        return self.local_hit % self.scheduler_block_size

    def describe(self):
        return (
            f"request {self.request_id} admitted at step {self.step}: local hit {self.local_hit} (blocks "
            f"{[list(g) for g in self.local_blocks]}), per-group hits {list(self.per_group_hits)}, joint hit "
            f"{self.joint_hit}; connector answer {self.reply}, told to load {self.connector_external_tokens}; "
            f"allocate_slots got {self.alloc_local_tokens} local tokens (blocks "
            f"{[list(g) for g in self.alloc_local_blocks]}) and {self.alloc_external_tokens} external; "
            f"num_computed_tokens={self.num_computed_tokens}, table {[list(g) for g in self.block_table]}; "
            f"groups: {_describe_groups()}"
        )


def _admission(rid, adm, step, copies, async_answers):
    """The watch's record of an admitted request (_Watch.take_admissions) as an Admission."""
    return Admission(
        request_id=rid, step=step, num_tokens=adm["num_tokens"], groups=_groups(),
        spans=tuple(None if s is None else (s[0], s[1]) for s in SPANS),
        behaviours=tuple(Behaviour(b) for b in BEHAVIOURS),
        span_rules=tuple(None if s is None else Span(s[2]) for s in SPANS),
        scheduler_block_size=SCHEDULER_BLOCK_SIZE, null_block_id=NULL_BLOCK, divergent_capable=DIVERGENT_HITS,
        local_hit=adm["local_hit"], local_blocks=tuple(map(tuple, adm["lookup"])),
        per_group_hits=tuple(adm["per_group"]), joint_hit=adm["joint_hit"], joint_blocks=tuple(map(tuple, adm["joint"])),
        reply=adm["answer"], reply_async=bool(async_answers.get(rid)),
        alloc_local_tokens=adm["local"], alloc_local_blocks=tuple(map(tuple, adm["adopted"])),
        alloc_external_tokens=adm["alloc_external"], admitted=True, num_computed_tokens=adm["num_computed_tokens"],
        connector_external_tokens=adm["external"], block_table=tuple(map(tuple, adm["table"])),
        cow_dst_ids=frozenset(dst for _, dst in copies), skips_prefix_cache=adm["skips"],
    )
