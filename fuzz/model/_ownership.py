"""The shadow model of block ownership: who holds which block after one
``schedule()``, and what the step's allocations and lookups did.

The adapter (:mod:`fuzz.adapter._ownership`) fills one
:class:`OwnershipObservation` per step, right after ``schedule()`` returns
and before ``update_from_output()``: the moment the model runner would run
the step. The checks of :mod:`invariants.ownership` read it.
"""

from __future__ import annotations

import dataclasses

from fuzz.model._kv import GroupInfo

__all__ = ["AllocationRecord", "HeldTable", "LookupRecord", "OwnershipObservation"]


@dataclasses.dataclass(frozen=True)
class HeldTable:
    """One request's block tables, per group, after ``schedule()``."""

    request_id: str
    status: str  # RequestStatus name
    num_tokens: int
    num_prompt_tokens: int
    # Tokens computed before this step, and tokens scheduled in it (0: the
    # request holds blocks but does not run this step).
    computed_before: int
    num_scheduled: int
    tables: tuple[tuple[int, ...], ...]  # per group, block ids (null block included)


@dataclasses.dataclass(frozen=True)
class AllocationRecord:
    """One ``allocate_slots`` call that got past its free-block check: per
    group, what ``get_num_blocks_to_allocate`` counted last before the
    allocation started, and how many blocks the allocation then took out of
    the free pool (new blocks plus evictable cached blocks it touched)."""

    request_id: str
    num_new_tokens: int
    num_new_computed_tokens: int
    num_external_computed_tokens: int
    counted: tuple[int | None, ...]  # None: the group was not asked
    taken: tuple[int, ...]
    # Per group, the vLLM methods ("Class.method") whose calls took blocks.
    takers: tuple[tuple[str, ...], ...]
    raised: bool  # the allocation raised (the pool ran dry, an assert)


@dataclasses.dataclass(frozen=True)
class LookupRecord:
    """One prefix-cache lookup of the coordinator, with the limit its caller
    passed. ``call`` is ``"find_longest_cache_hit"`` (``hits`` holds the
    joint hit once) or ``"find_longest_cache_hit_per_group"`` (one hit per
    group)."""

    call: str
    limit: int
    hits: tuple[int, ...]
    # The request whose block hashes were looked up, where a hit passed the
    # limit on blocks cached before this schedule() ("" otherwise).
    request_id: str = ""


@dataclasses.dataclass(frozen=True)
class OwnershipObservation:
    """Block ownership as the model runner would see it for one step."""

    step: int
    groups: tuple[GroupInfo, ...]
    spans: tuple[tuple[str, int] | None, ...]
    # Per group, which blocks a running request reads (the adapter's
    # read_rules): ("full", 0), ("window", W), ("chunk", C), ("rswa", W),
    # ("state", 0) or ("none", 0).
    read_rules: tuple[tuple[str, int], ...]
    null_block_id: int
    tables: tuple[HeldTable, ...]
    # For every block id in a table, a fresh block or a copy: its ref_cnt,
    # whether it sits in the free queue, whether it is a cached (hashed) block.
    ref_cnt: dict[int, int]
    in_free_queue: frozenset[int]
    cached: frozenset[int]
    # Blocks popped from the free pool in this step's schedule():
    # (block id, request id, group index), in order.
    fresh: tuple[tuple[int, str, int], ...]
    # The step's copy-on-write copies (source, destination).
    copies: tuple[tuple[int, int], ...]
    allocations: tuple[AllocationRecord, ...]
    lookups: tuple[LookupRecord, ...]
    # A producer's sends in flight: (request id, per-group block ids that
    # request_finished handed over). The worker reads them until it reports
    # the send done, so they must stay held (vLLM delays their free).
    sending: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = ()
    # Under async scheduling, the step still in flight as this one is
    # scheduled (its output not fed back yet): its own observation, whose
    # tables and scheduled ranges say what its forward pass reads (its own
    # ``in_flight`` is dropped). The pool state above covers every block of
    # its scheduled requests' tables.
    in_flight: OwnershipObservation | None = None
    # The configuration makes vLLM defer a freed request's blocks while a
    # step that scheduled it is in flight: overlapping batches and a
    # connector that loads (Scheduler.defer_block_free's condition, read from
    # the config, never from the flag).
    defers_frees: bool = False

    def table_of(self, request_id: str) -> HeldTable | None:
        return next((t for t in self.tables if t.request_id == request_id), None)

    def describe(self) -> str:
        lines = [f"block ownership after schedule() of step {self.step}:"]
        for t in self.tables:
            lines.append(
                f"  {t.request_id} ({t.status}, num_tokens={t.num_tokens}, computed {t.computed_before} "
                f"+ {t.num_scheduled} scheduled): tables {[list(g) for g in t.tables]}"
            )
        if self.fresh:
            lines.append("  fresh blocks (id, request, group): " + ", ".join(map(str, self.fresh)))
        for rid, groups in self.sending:
            lines.append(f"  {rid} sending (held until finished_sending): blocks {[list(g) for g in groups]}")
        if self.copies:
            lines.append("  copies (src->dst): " + ", ".join(f"{a}->{b}" for a, b in self.copies))
        return "\n".join(lines)
