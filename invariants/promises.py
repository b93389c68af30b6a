"""What the prefix cache promises beyond what each block holds.

Isolation: a prefix-cache hit stays within the namespace vLLM folds into a
block's hash besides the tokens (the request's cache salt). This is the
suite's security claim: a tenant that salts its requests must never be
served, or time, another tenant's cached KV.

Announcements: a KV-aware router (llm-d's KV-cache indexer, Dynamo's router
and the like) never reads the block pool; it learns what a replica has
cached only from the KV events the engine core publishes. They are held to
what the index really holds.

Reads in flight: under async scheduling the step scheduled last is still
running on the device while the next one is planned; what its forward pass
reads (its window, chunk, state) stays out of the free pool until its output
is fed back.

Preemption: a request vLLM preempts is restarted, not paused; it must be
left in a state it can resume from, reading nothing of what it held.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from fuzz.model import EventPayload, Fact, Instance, InvariantViolation, PreemptedRequest, StepObservation
from fuzz.model import group_kind, group_name
from invariants.ownership import read_indices

__all__ = [
    "PROMISE_CHECKS",
    "check_events_carry_namespace",
    "check_events_carry_tokens",
    "check_events_chain",
    "check_events_replay_index",
    "check_hits_after_reset",
    "check_hits_within_namespace",
    "check_in_flight_reads_held",
    "check_lookahead_allocated",
    "check_preempted_resumable",
]

# The vLLM code that builds the events (matched by known-bug signatures).
EVENTS_WHERE = "BlockPool"
EVENTS_ORPHANED = "a BlockStored event of full blocks whose parent no event announced"
EVENTS_ORPHANED_PARTIAL = "a partial entry's BlockStored event whose parent no event announced"
EVENTS_DISAGREE = "replayed KV events disagree with the prefix-cache index"
EVENTS_WRONG_TOKENS = "a BlockStored event's tokens are not its block's"
EVENTS_WRONG_NAMESPACE = "a BlockStored event's adapter, extra keys or medium are not its block's"
CROSS_NAMESPACE_HIT = "a prefix-cache hit across cache salts"
HIT_ACROSS_RESET = "a prefix-cache hit on KV computed before a reset"
IN_FLIGHT_READ_FREED = "a block the step in flight reads freed before its output is fed back"
LOOKAHEAD_UNALLOCATED = "a drafter's lookahead past the blocks allocated"
PREEMPTED_NOT_RESET = "a preempted request keeps what it computed"


def _report(invariant: str, found: Sequence[Any], step: StepObservation, where: str, state: str,
            facts: tuple[Fact, ...] = (), instances: tuple[Instance, ...] = ()) -> None:
    """Raise ``invariant``'s violation for what the step ``found`` (each
    describing itself, each ``instances``' one where given), if it found anything."""
    if not found:
        return
    raise InvariantViolation(
        invariant,
        "\n".join(f.describe() for f in found)
        + f"\n{step.describe()}"
        + (f"\n  scenario: {step.context}" if step.context else ""),
        where=where,
        state=state,
        instances=instances,
        facts=facts,
    )


def _kind(step: StepObservation, group: int | None) -> str | None:
    """The spec kind of ``group`` (None where the step has no record of it)."""
    own = step.ownership
    if group is None or own is None or group >= len(own.groups):
        return None
    return group_kind(own.groups[group])


def _event_facts(found: Sequence[EventPayload]) -> tuple[Fact, ...]:
    """What each wrong announcement says, against the harness's record: the
    field of the ``BlockStored`` entry for the request's key over its first
    ``num_tokens`` tokens, right after the ``schedule()`` that queued it."""
    return tuple(Fact("stored-event", (p.request_id, p.num_tokens, p.field), p.announced, p.expected, after="schedule")
                 for p in found)


def _hit_bounds(step: StepObservation, bounds: Sequence[tuple[str, int, str]]) -> tuple[Fact, ...]:
    """The hit each admitting ``schedule()`` counted computed for a request
    (where its table says it computes from), against the most the harness's
    record lets it adopt: below the first position ``bounds`` (request,
    position, why) names for it."""
    own = step.ownership  # (none observed: then no facts)
    if not bounds or own is None:
        return ()
    first: dict[str, tuple[int, str]] = {}
    for rid, position, why in bounds:
        if rid not in first or position < first[rid][0]:
            first[rid] = (position, why)
    return tuple(Fact("hit-tokens", (rid, why), held.computed_before, position, "<=", after="schedule")
                 for rid, (position, why) in first.items() if (held := own.table_of(rid)) is not None)


def _foreign_bounds(step: StepObservation) -> list[tuple[str, int, str]]:
    """Each foreign block's first position in its request's hit (where its
    table holds it), and what it holds."""
    own, out = step.ownership, []
    for hit in step.foreign_hits if own is not None else ():
        held = own.table_of(hit.request_id)
        if held is not None and hit.block_id in held.tables[hit.group]:
            index = list(held.tables[hit.group]).index(hit.block_id)
            out.append((hit.request_id, index * own.groups[hit.group].block_size, hit.describe()))
    return out


def _event_instances(step: StepObservation, found: Sequence[EventPayload], state: str) -> tuple[Instance, ...]:
    """One instance per wrong announcement: the request whose key it is, in its group."""
    return tuple(Instance(state, _kind(step, p.group), p.group, (p.request_id,)) for p in found)


def check_lookahead_allocated(step: StepObservation) -> None:
    """A drafter with its own forward pass (EAGLE, a draft model) writes KV
    ``num_lookahead_tokens`` positions past each step it drafts from: every
    attention group's table the runner gets for that step already covers
    them (up to max_model_len), or the drafter writes into blocks the
    request does not own."""
    _report("lookahead-allocated", step.missing_lookahead, step, where="KVCacheManager.allocate_slots", state=LOOKAHEAD_UNALLOCATED,
            facts=tuple(Fact("table-covers", (m.request_id, m.group, m.start, m.num_scheduled, m.lookahead), m.covered,
                             m.needed, ">=", after="schedule") for m in step.missing_lookahead))


def _in_flight_reads_freed(step: StepObservation, facts: list[Fact] | None = None) -> list[tuple[str, str]]:
    """(the vLLM call that freed, what) per request whose step in flight
    reads blocks this ``schedule()`` let go; each block found free as a
    fact in ``facts``, where given."""
    own = step.ownership
    if own is None or own.in_flight is None or (step.error is not None and step.error_where == "schedule"):
        return []
    previous, null = own.in_flight, own.null_block_id
    popped = {bid: rid for bid, rid, _ in own.fresh}
    found: list[tuple[str, str]] = []  # (the vLLM call that freed, what)
    for t in previous.tables:
        if not t.num_scheduled:
            continue
        if (own.table_of(t.request_id) is None or t.request_id in step.preempted) and not own.defers_frees:
            # vLLM frees a finished or preempted request's blocks at once
            # unless a connector could load into them unordered with the step
            # (Scheduler.defer_block_free): the next step's own writes are
            # ordered after the step in flight. A request a prefix-cache
            # reset preempted may be admitted again by this very schedule(),
            # with a table of new blocks.
            continue
        start, end = t.computed_before, t.computed_before + t.num_scheduled
        for group, (g, rule, table) in enumerate(zip(previous.groups, previous.read_rules, t.tables)):
            wanted = read_indices(rule, g.block_size, start, end, t.num_prompt_tokens, len(table))
            problems = []
            for i in wanted:
                bid = table[i] if i < len(table) else null
                if bid == null:
                    continue  # the in-flight step's own read: read-blocks-held judged it
                if bid in popped:
                    problems.append(f"block {bid} (index {i}) handed to {popped[bid]} as a fresh block")
                elif bid in own.in_free_queue or own.ref_cnt.get(bid, 0) <= 0:
                    problems.append(f"block {bid} (index {i}) is free (ref_cnt {own.ref_cnt.get(bid, 0)})")
                    if facts is not None:  # the reference the read in flight needs
                        facts.append(Fact("block-held", (bid, t.request_id, group, i, previous.step, start),
                                          own.ref_cnt.get(bid, 0), 1, ">=", after="schedule"))
            if problems:
                now = own.table_of(t.request_id)
                found.append((
                    "KVCacheManager.allocate_slots" if now is not None else "Scheduler._free_request_blocks",
                    f"step {own.step}: step {previous.step}, still in flight, computes tokens [{start}, {end}) of "
                    f"request {t.request_id} and reads blocks {wanted} of {group_name(g)} ("
                    f"{rule[0]}{'' if not rule[1] else f' {rule[1]}'}) from its table {list(table)}, but this "
                    f"schedule() let them go: " + "; ".join(problems)
                    + (f" (the request is gone or preempted; its blocks must wait for step {previous.step}'s output)"
                       if now is None else f" (its table now {[list(x) for x in now.tables]})"),
                ))
    return found


def check_in_flight_reads_held(step: StepObservation) -> None:
    """Under async scheduling, the step still in flight as this one is
    scheduled reads (per group: full attention its prefix, a sliding window
    or chunk its span, Mamba its resume state) blocks that stay out of the
    free pool until its output is fed back: a running request's skipped
    blocks are freed on the processed-token basis
    (``num_computed_tokens - num_in_flight_tokens``), and where vLLM defers
    frees (a connector that loads, overlapping batches) a request finished
    or preempted in the meantime (by a prefix-cache reset too, admitted
    again at once or not) keeps its blocks until that step's output.
    A block freed early may be reused by a load that is not ordered with the
    step still reading it."""
    facts: list[Fact] = []
    found = _in_flight_reads_freed(step, facts)
    if found:
        raise InvariantViolation(
            "in-flight-reads-held",
            "\n".join(text for _, text in found) + f"\n{step.describe()}"
            + (f"\n  scenario: {step.context}" if step.context else ""),
            where=found[0][0],
            state=IN_FLIGHT_READ_FREED,
            facts=tuple(facts),
        )


def check_hits_within_namespace(step: StepObservation) -> None:
    """Isolation: every block a request adopts from the prefix cache as
    computed (the local blocks handed to allocate_slots) was last written
    for a request of the same namespace: the same cache_salt, LoRA adapter
    and prompt embeddings (none is a namespace of its own), and the same
    images placed in the adopted prefix. vLLM folds them into the block
    hashes, and every later hash chains on them, so no lookup may cross
    namespaces."""
    _report("hits-within-namespace", step.foreign_hits, step, where="KVCacheManager.get_computed_blocks", state=CROSS_NAMESPACE_HIT,
            facts=_hit_bounds(step, _foreign_bounds(step)))


def check_hits_after_reset(step: StepObservation) -> None:
    """After a ``reset_prefix_cache()`` that succeeded, no request adopts
    from the prefix cache, as computed, a position whose KV was computed or
    loaded before the reset: the reset exists to invalidate the cache (RLHF
    flows call it after a weight update), so such a hit serves KV of the old
    weights."""
    _report("hits-after-reset", step.hits_across_reset, step, where="BlockPool.reset_prefix_cache",
            state=HIT_ACROSS_RESET,
            facts=_hit_bounds(step, [(h.request_id, min(h.positions), h.describe()) for h in step.hits_across_reset]))


def check_events_replay_index(step: StepObservation) -> None:
    """After every ``update_from_output()`` that published (KV events on),
    replaying every ``BlockStored``, ``BlockRemoved`` and
    ``AllBlocksCleared`` event so far counts, under each (group, key), as
    many blocks as the prefix-cache index files there: no entry a router
    is told of that a lookup cannot hit (it routes requests to a replica
    that recomputes), none a lookup hits that the router never heard of (a
    hit it never routes to), and none withdrawn twice."""
    _report("events-replay-index", step.event_gaps, step, where=EVENTS_WHERE, state=EVENTS_DISAGREE,
            facts=_withdrawal_facts(step),
            instances=tuple(Instance(EVENTS_DISAGREE, _kind(step, g.group), g.group, (), g.block_ids)
                            for g in step.event_gaps))


def _withdrawal_facts(step: StepObservation) -> tuple[Fact, ...]:
    """What the step's queued events lack, right after its ``schedule()``:
    an ``AllBlocksCleared`` where a reset came since the last publish and the
    replay counts more than the index holds; else a ``BlockRemoved`` of each
    key the replay counts and the index no longer files (what the key stands
    for: the harness's record)."""
    over = [g for g in step.event_gaps if g.announced > len(g.block_ids)]
    if any(g.after_reset for g in over):
        return (Fact("cleared-event", (), False, True, after="schedule"),)
    return tuple(sorted((Fact("removed-event", (*g.prefix, g.group, _evicted(step, *g.prefix, g.group)), False, True,
                              after="schedule")
                         for g in over if g.prefix is not None and not g.block_ids), key=lambda f: f.args[:3]))


def _evicted(step: StepObservation, request_id: str, tokens: int, group: int | None) -> int | None:
    """The block the step's allocations evicted that had come back with the
    request's free, from the table index holding its first ``tokens``
    tokens' last block (None: no such eviction this step)."""
    own = step.ownership
    if own is None or group is None:
        return None
    index = tokens // own.groups[group].block_size - 1
    return next((e.freed.block for e in step.evictions
                 if (e.freed.request, e.freed.group, e.freed.index) == (request_id, group, index)), None)


def _chain_violations(step: StepObservation) -> list[InvariantViolation]:
    """One violation per kind of orphaned event (full blocks first): a known
    bug's kind set aside never hides the other."""
    found = []
    for partial in (False, True):
        orphans = [o for o in step.event_orphans if o.partial == partial and not o.sparse]
        if orphans:
            found.append(InvariantViolation(
                "events-chain",
                "\n".join(o.describe() for o in orphans) + f"\n{step.describe()}"
                + (f"\n  scenario: {step.context}" if step.context else ""),
                where="BlockPool.cache_partial_block" if partial else "BlockPool.cache_full_blocks",
                state=EVENTS_ORPHANED_PARTIAL if partial else EVENTS_ORPHANED,
                facts=() if partial else _parent_facts(orphans),
            ))
    return found


def _parent_facts(orphans: Sequence[Any]) -> tuple[Fact, ...]:
    """The parent each orphaned event of full blocks should name, right after
    the ``schedule()`` that queued it: the key of its first block's prefix
    one block shorter (the harness's record of what the key stands for).
    What it names instead: its own prefix (the event names itself), or None."""
    return tuple(Fact("stored-parent", o.prefix, o.prefix[1] if o.parent == o.first_key else None,
                      o.prefix[1] - o.block_size, after="schedule")
                 for o in orphans if o.prefix is not None and o.prefix[1] > o.block_size)


def check_events_chain(step: StepObservation) -> None:
    """In a group that caches every block of a request (full attention),
    every ``BlockStored`` event names as ``parent_block_hash`` a key that
    the events published before it announce in that group (and have not
    withdrawn): a router that keeps the replica's cache as a tree of
    prefixes hangs each announced block under its parent, and drops blocks
    whose parent it never heard of (they are hits it never routes to).

    Sparse groups are left out: a sliding window or chunk drops old blocks
    (null in the table) and a Mamba group in align mode caches a state only
    at some boundaries, and ``BlockPool.cache_full_blocks`` skips null and
    masked blocks while naming the last logical block before the event as
    its parent; vLLM publishes each group's spec kind
    (``kv_cache_spec_kind``) so that a consumer can tell such groups apart,
    and upstream's open work on sparse events (vLLM PR 44488) keeps that
    parent and adds the skipped context beside it."""
    for violation in _chain_violations(step):
        raise violation


check_events_chain.violations = _chain_violations  # type: ignore[attr-defined]


def check_events_carry_tokens(step: StepObservation) -> None:
    """Every block a ``BlockStored`` event announces carries, as a consumer
    slices the event (``token_ids[i * block_size:(i + 1) * block_size]``
    for its ``i``-th key), exactly the tokens of the block its key stands
    for: the last ``block_size`` of the prefix the harness saw a request
    carry that hash over, ``block_size`` being the group's (a partial
    entry's: one hash block, the tokens past its parent). A router that
    matches prompts by tokens routes by what the event says."""
    found = [p for p in step.event_payloads if p.tokens]
    _report("events-carry-tokens", found, step, where=EVENTS_WHERE, state=EVENTS_WRONG_TOKENS,
            facts=_event_facts(found), instances=_event_instances(step, found, EVENTS_WRONG_TOKENS))


def check_events_carry_namespace(step: StepObservation) -> None:
    """Every block a ``BlockStored`` event announces names what the harness
    added the request its key stands for with: its LoRA adapter
    (``lora_name``, ``lora_id``), the extra keys vLLM documents for that
    block (untagged: the adapter's name, each image overlapping the block
    as ``(identifier, offset in the block)``, the cache salt on the first
    block, a prompt-embeddings digest), and the device tier
    (``medium`` "GPU"). A router that keys blocks by adapter or tenant
    reads them from here."""
    found = [p for p in step.event_payloads if not p.tokens]
    _report("events-carry-namespace", found, step, where=EVENTS_WHERE, state=EVENTS_WRONG_NAMESPACE,
            facts=_event_facts(found), instances=_event_instances(step, found, EVENTS_WRONG_NAMESPACE))


@dataclasses.dataclass(frozen=True)
class _NotReset:
    """A preempted request whose state is not the one vLLM restarts it from."""

    request: PreemptedRequest
    wrong: tuple[str, ...]  # "what: found (expected ...)"

    def describe(self) -> str:
        return f"{self.request.describe()}; not reset: " + ", ".join(self.wrong)


def _restart_state(p: PreemptedRequest) -> dict[str, tuple[object, object]]:
    """What vLLM left of ``p`` against what a restart resumes from:
    field -> (found, expected)."""
    return {
        "status": (p.status, "PREEMPTED"),
        "num_computed_tokens": (p.num_computed_tokens, 0),
        "num_output_placeholders": (p.num_output_placeholders, 0),
        "spec_token_ids": (p.num_spec_tokens, 0),
        "blocks held": (sum(p.blocks_held), 0),
    }


def _not_reset(p: PreemptedRequest) -> tuple[str, ...]:
    return tuple(f"{what} {found} (expected {want})" for what, (found, want) in _restart_state(p).items()
                 if found != want)


def _restart_facts(found: Sequence[_NotReset]) -> tuple[Fact, ...]:
    """Each field a preempted request was not reset in, right after the
    ``schedule()`` that preempted it."""
    return tuple(Fact("preempted-request", (n.request.request_id, what), got, want, after="schedule")
                 for n in found for what, (got, want) in _restart_state(n.request).items() if got != want)


def check_preempted_resumable(step: StepObservation) -> None:
    """Right after the ``schedule()`` that preempts a request (vLLM frees
    every block it holds and restarts it: ``Scheduler._preempt_request``),
    the request waits with status PREEMPTED, ``num_computed_tokens == 0``, no
    output placeholders (async scheduling's in-flight share is counted
    stale instead), no drafts (``spec_token_ids`` empty) and no block filed
    under it in any group: admitted again, it reads only what its own
    lookup and connector give it (a request the same ``schedule()``
    admitted again is judged by the admission checks)."""
    found = [_NotReset(p, w) for p in step.preemptions if not p.rescheduled and (w := _not_reset(p))]
    _report("preempted-resumable", found, step, where="Scheduler._preempt_request", state=PREEMPTED_NOT_RESET,
            facts=_restart_facts(found))


PROMISE_CHECKS: tuple[Callable[[StepObservation], None], ...] = (
    check_lookahead_allocated,
    check_in_flight_reads_held,
    check_hits_within_namespace,
    check_hits_after_reset,
    check_events_replay_index,
    check_events_chain,
    check_events_carry_tokens,
    check_events_carry_namespace,
    check_preempted_resumable,
)
