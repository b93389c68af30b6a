"""Invariants of block ownership, checked after every ``schedule()``.

The shadow model (:class:`fuzz.model.OwnershipObservation`) says which
request holds which block, in every group, at the moment the model runner
would run the step, and what the step's allocations and lookups did. The
admission checks of :mod:`invariants.scheduler` look at a request when it is
admitted; these look at every request holding blocks, every step:

* ``read-blocks-held`` (:func:`check_read_blocks_held`): every block a
  running request reads in this step is held by it, and every block a
  producer's send in flight reads stays held until the send is reported;
* ``same-step-hazard`` (:func:`check_no_same_step_hazard`): no block written
  in this step is read by another request before the write;
* ``reservation-covers-allocation``
  (:func:`check_reservation_covers_allocation`): what ``allocate_slots``
  counted per group covers what it then took from the pool;
* ``lookup-within-limit`` (:func:`check_lookup_within_limit`): no prefix-cache
  hit reaches past the limit its caller passed.

Each check yields every violation it finds (``check.violations(step)``), so
that a known vLLM bug's own signature can be set aside without hiding a
different violation of the same check in the same step.

What a request reads in a step that computes tokens ``[s, e)`` in a group of
block size ``b`` (block indices into its table):

* full attention: ``[0, ceil(e/b))``;
* sliding window ``W``: ``[max(0, s-W+1) // b, ceil(e/b))`` (the window of
  the first computed token; vLLM may retain more, never less);
* chunked local ``C``: ``[(s//C*C) // b, ceil(e/b))`` (the current chunk);
* R-SWA ``W`` with a prompt of ``P`` tokens: ``[0, ceil(P/b))`` and
  ``[max(P, s-W) // b, ceil(e/b))`` (vLLM frees the gap between);
* a recurrent state (Mamba): the state block at the resume boundary,
  ``ceil(s/b) - 1`` (when ``s > 0``), and the block the chunk's final state
  is written to, ``ceil(e/b) - 1``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from fuzz.model import Fact, Instance, InvariantViolation, OwnershipObservation, StepObservation
from fuzz.model import cdiv, group_kind, group_name

__all__ = [
    "HAZARD_COPY_OF_CACHED_NEW_BLOCK",
    "HAZARD_COPY_OF_COPY",
    "HAZARD_COPY_OF_NEW_BLOCK",
    "HAZARD_STATE_ADOPTED",
    "OWNERSHIP_CHECKS",
    "READ_DROPPED_AFTER_WHOLE_LOAD",
    "READ_NOT_HELD",
    "ROLLED_BACK_IN_FLIGHT",
    "WHERE_ASYNC_LANDED",
    "WHERE_ROLLED_BACK",
    "WHERE_SENDING",
    "WHERE_COPY_ON_WRITE",
    "WHERE_NEW_BLOCK",
    "check_lookup_within_limit",
    "check_no_same_step_hazard",
    "check_read_blocks_held",
    "check_reservation_covers_allocation",
    "read_indices",
]

# The vLLM calls that write a block in a step: a same-step hazard names the
# writer as its ``where`` (known-bug signatures tell the copy-on-write chain
# from other hazards by it).
WHERE_COPY_ON_WRITE = "SingleTypeKVCacheManager._apply_cow"
WHERE_NEW_BLOCK = "BlockPool.get_new_blocks"
# A held-block violation of a request whose async load landed in this step
# (its resume point was set there, not at admission).
WHERE_ASYNC_LANDED = "Scheduler._update_waiting_for_remote_kv"
# ... and of a request recomputing what a failed sync load had covered before
# vLLM rolled it back (until it computes past the load's end).
WHERE_ROLLED_BACK = "Scheduler._update_requests_with_invalid_blocks"
# A failed load rolled the request back past the load's end too: over a step in flight.
ROLLED_BACK_IN_FLIGHT = "a recompute after a failed load's rollback over a step in flight"
# read-blocks-held's other states (matched by known-bug signatures): a read of
# blocks the request does not hold, and the recompute of the last prompt token
# after an async load of the whole prompt reading only blocks its group
# dropped at admission (the null block, or past its table).
READ_NOT_HELD = "a read of a block the request does not hold"
READ_DROPPED_AFTER_WHOLE_LOAD = "the last-token recompute after a whole-prompt async load reads a dropped block"
# same-step-hazard's states: what the block read before its same-step write is.
HAZARD_COPY_OF_COPY = "a copy-on-write copy reads another copy's same-step destination"
HAZARD_COPY_OF_CACHED_NEW_BLOCK = "a copy-on-write copy reads a new block another request's allocation cached"
HAZARD_COPY_OF_NEW_BLOCK = "a copy-on-write copy reads a new block of the same step"
HAZARD_STATE_ADOPTED = "a recurrent state adopted as a hit while another request writes it"
# ... and of a producer's send in flight: request_finished handed its blocks
# to the worker and vLLM delayed their free until finished_sending.
WHERE_SENDING = "Scheduler._free_request"


def _observed(step: StepObservation) -> OwnershipObservation | None:
    """The step's ownership, when ``schedule()`` returned normally."""
    if step.error is not None and step.error_where == "schedule":
        return None
    return step.ownership


def _violation(invariant: str, step: StepObservation, own: OwnershipObservation, text: str, **facts: object) -> InvariantViolation:
    message = f"step {own.step}: {text}\n{own.describe()}"
    if step.context:
        message += f"\n  scenario: {step.context}"
    return InvariantViolation(invariant, message, **facts)  # type: ignore[arg-type]


def read_indices(rule: tuple[str, int], block_size: int, start: int, end: int, prompt: int, table_len: int) -> list[int]:
    """Block indices a step computing tokens ``[start, end)`` reads (see the
    module docstring); ``table_len``: the request's block table length after
    ``schedule()`` (where a group with speculative state blocks keeps its
    running state)."""
    kind, value = rule
    last = cdiv(end, block_size)
    if kind == "full":
        return list(range(last))
    if kind == "window":
        return list(range(max(0, start - value + 1) // block_size, last))
    if kind == "chunk":
        return list(range(start // value * value // block_size, last))
    if kind == "rswa":
        head = cdiv(prompt, block_size)
        tail = max(prompt, start - value) // block_size
        return list(range(min(head, last))) + list(range(max(head, tail), last))
    if kind == "state":
        # value: the group's speculative state blocks. Without them the step
        # resumes from the state at ceil(start/b) - 1 and writes the one at
        # ceil(end/b) - 1. With them the worker resumes from the state index
        # it recorded the step before, shifted by the drafts accepted
        # (mamba_utils: prev_state_idx + accept bias, into that step's 1 + k
        # trailing blocks), which ``start`` does not give once rejections
        # have rolled num_computed_tokens back: only the state it writes is
        # claimed, and vLLM writes it into the first of the table's last
        # 1 + k blocks (MambaManager.allocate_new_blocks: "We always save the
        # running state at the last (1 + num_speculative_blocks) block"),
        # which is ceil(end/b) - 1 unless an earlier step over-allocated.
        if value:
            return [table_len - 1 - value if table_len > value else last - 1]
        states = {last - 1}
        if start > 0:
            states.add(cdiv(start, block_size) - 1)
        return sorted(states)
    return []


# ---------------------------------------------------------------------------
# Held blocks
# ---------------------------------------------------------------------------


def _held_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    own = _observed(step)
    if own is None:
        return
    null = own.null_block_id
    holders: Counter[int] = Counter()
    for t in own.tables:
        for table in t.tables:
            holders.update(set(table) - {null})
    fresh_for = {bid: rid for bid, rid, _ in own.fresh}
    # Requests whose async load landed this step: their resume point was set
    # by Scheduler._update_waiting_for_remote_kv, not by the admission.
    landed = {a.request_id for a in step.connector_allocs if a.asked_with is None}
    for t in own.tables:
        if not t.num_scheduled:
            continue
        start, end = t.computed_before, t.computed_before + t.num_scheduled
        for g, rule, table in zip(own.groups, own.read_rules, t.tables):
            wanted = read_indices(rule, g.block_size, start, end, t.num_prompt_tokens, len(table))
            if wanted and wanted[-1] < len(table):
                # Fast path (every step): all real, referenced enough, none free.
                ids = [table[i] for i in wanted]
                if null not in ids and all(
                    holders[b] <= own.ref_cnt[b] and (holders[b] == 1 or b in own.cached) for b in ids
                ) and own.in_free_queue.isdisjoint(ids):
                    continue
            elif not wanted:
                continue
            problems = []
            nulls: list[int] = []  # the indices it reads that hold the null block
            unheld: list[int] = []  # the real blocks among them (not null, not past the table)
            for i in wanted:
                bid = table[i] if i < len(table) else None
                if bid is not None and bid != null:
                    unheld.append(bid)
                if bid is None:
                    problems.append(f"index {i} is past the table's {len(table)} blocks")
                elif bid == null:
                    problems.append(f"index {i} is the null block")
                    nulls.append(i)
                elif own.ref_cnt.get(bid, 0) <= 0:
                    problems.append(f"block {bid} (index {i}) has ref_cnt {own.ref_cnt.get(bid, 0)}")
                elif bid in own.in_free_queue:
                    problems.append(f"block {bid} (index {i}) sits in the free queue")
                elif holders[bid] > 1 and bid not in own.cached:
                    others = [o.request_id for o in own.tables if o is not t and any(bid in tb for tb in o.tables)]
                    problems.append(
                        f"block {bid} (index {i}) is shared with {others} but is no cached prefix block"
                        + (f" (handed to {fresh_for[bid]} as a fresh block this step)" if bid in fresh_for else "")
                    )
                elif holders[bid] > own.ref_cnt[bid]:
                    problems.append(
                        f"block {bid} (index {i}) sits in {holders[bid]} block tables but has ref_cnt {own.ref_cnt[bid]}"
                    )
                else:
                    unheld.pop()  # held: not one of the problems
            if problems:
                whole_load = _recomputes_last_token_after_whole_load(step, t.request_id, start, t.num_prompt_tokens)
                # The first chunk after a whole-prompt async load landed (the
                # last token, or from where a rollback of shared blocks left it).
                after_whole_load = whole_load or (t.request_id in landed and t.request_id in step.whole_prompt_landed)
                state = (
                    # A Mamba state slot, or a read past the load's end: the rollback
                    # over the step in flight left the table laid out for that step.
                    ROLLED_BACK_IN_FLIGHT
                    if t.request_id in step.rolled_back_in_flight
                    and (t.request_id not in step.rolled_back or group_kind(g) == "MambaSpec")
                    else READ_DROPPED_AFTER_WHOLE_LOAD if after_whole_load and not unheld
                    else READ_NOT_HELD
                )
                yield _violation(
                    "read-blocks-held",
                    step,
                    own,
                    f"request {t.request_id} computes tokens [{start}, {end}) and reads blocks "
                    f"{wanted} of {group_name(g)} ({rule[0]}{'' if not rule[1] else f' {rule[1]}'}), "
                    f"but they are not all held by it: " + "; ".join(problems)
                    + f" (table {list(table)})",
                    where=WHERE_ASYNC_LANDED
                    if t.request_id in landed or whole_load
                    else WHERE_ROLLED_BACK
                    if t.request_id in step.rolled_back or t.request_id in step.rolled_back_in_flight
                    else "Scheduler.schedule",
                    group_kind=group_kind(g),
                    state=state,
                    instances=(Instance(state, group_kind(g), g.index, (t.request_id,), tuple(unheld)),),
                    # Right after the schedule(), a real block at each index it reads as the null one.
                    facts=tuple(Fact("table-block", (t.request_id, g.index, i, start, tuple(
                        range(i * g.block_size, min((i + 1) * g.block_size, end))), NULL_READ), null, null, "!=",
                        after="schedule") for i in nulls),
                )
    yield from _sending_violations(own, step)


NULL_READ = "the null block: it holds no KV, the step reads garbage"


def _sending_violations(own: OwnershipObservation, step: StepObservation) -> Iterator[InvariantViolation]:
    """A producer's send in flight reads the blocks request_finished handed
    over until the worker reports it done: each must keep a reference, stay
    out of the free queue and not be handed to another request (a fresh
    block, or a place in its table that is no shared cached block)."""
    null = own.null_block_id
    fresh_for = {bid: rid for bid, rid, _ in own.fresh}
    for rid, groups in own.sending:
        problems = []
        held_ok: set[int] = set()
        for g, ids in enumerate(groups):
            for bid in ids:
                if bid == null:
                    continue
                others = [t.request_id for t in own.tables if t.request_id != rid and any(bid in tb for tb in t.tables)]
                if own.ref_cnt.get(bid, 0) <= 0:
                    problems.append(f"block {bid} (group {g}) has ref_cnt {own.ref_cnt.get(bid, 0)}")
                elif bid in own.in_free_queue:
                    problems.append(f"block {bid} (group {g}) sits in the free queue")
                elif bid in fresh_for and fresh_for[bid] != rid:
                    problems.append(f"block {bid} (group {g}) was handed to {fresh_for[bid]} as a fresh block this step")
                elif others and bid not in own.cached:
                    problems.append(f"block {bid} (group {g}) sits in the tables of {others} but is no cached prefix block")
                else:
                    held_ok.add(bid)
        if problems:
            unheld = tuple(b for ids in groups for b in ids if b != null and b not in held_ok)
            yield _violation(
                "read-blocks-held",
                step,
                own,
                f"request {rid}'s send is in flight (request_finished held its blocks "
                f"{[list(g) for g in groups]} for the worker until finished_sending), but they are not all "
                "held: " + "; ".join(problems),
                where=WHERE_SENDING,
                state=READ_NOT_HELD,
                instances=(Instance(READ_NOT_HELD, None, None, (rid,), unheld),),
            )


def _recomputes_last_token_after_whole_load(step: StepObservation, request_id: str, start: int, prompt: int) -> bool:
    """The request's async load brought its whole prompt and it now computes
    from the last prompt token: the recompute vLLM starts when such a load
    lands (num_computed_tokens = num_tokens - 1), whichever path schedules it
    (a 1-token prompt is admitted again from 0)."""
    return request_id in step.whole_prompt_landed and start == prompt - 1


def check_read_blocks_held(step: StepObservation) -> None:
    """Every block a request scheduled in this step reads (see
    :func:`read_indices`) is a real block of its table that it holds:
    ``ref_cnt > 0``, not in the free queue, and shared with another request
    only as a cached prefix block whose ``ref_cnt`` counts every holder (so
    never handed to another request as a fresh block). The blocks a
    producer's send in flight reads (those ``request_finished`` handed over,
    until ``finished_sending``) are held as well."""
    for violation in _held_violations(step):
        raise violation


check_read_blocks_held.violations = _held_violations  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# Same-step hazards
# ---------------------------------------------------------------------------


def _hazard_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    own = _observed(step)
    if own is None:
        return
    null = own.null_block_id
    written: dict[int, tuple[str, str]] = {}  # block id -> (writer request, where)
    for bid, rid, _ in own.fresh:
        written[bid] = (rid, WHERE_NEW_BLOCK)
    for t in own.tables:
        for table in t.tables:
            for src, dst in own.copies:
                if dst in table:
                    written[dst] = (t.request_id, WHERE_COPY_ON_WRITE)
    located = {}
    for t in own.tables:
        for g, table in zip(own.groups, t.tables):
            for bid in table:
                if bid != null:
                    located.setdefault(bid, (t.request_id, g))
    # Copies run before the step's forward pass: a source written in the
    # same step is read before it is written.
    for src, dst in own.copies:
        if src in written:
            writer, where = written[src]
            reader, g = located.get(dst, ("?", None))
            state = (
                HAZARD_COPY_OF_COPY if where == WHERE_COPY_ON_WRITE
                # The partial-tail block another request's allocation filed in
                # the prefix cache at once, adopted by this request's lookup.
                else HAZARD_COPY_OF_CACHED_NEW_BLOCK if src in own.cached and writer != reader
                else HAZARD_COPY_OF_NEW_BLOCK
            )
            kind = None if g is None else group_kind(g)
            yield _violation(
                "same-step-hazard",
                step,
                own,
                f"copy {src}->{dst} for request {reader} reads block {src}, which this step writes "
                f"({'as a copy-on-write destination' if where == WHERE_COPY_ON_WRITE else 'as a new block'} "
                f"of request {writer}): the copy runs before the write"
                + ("" if g is None else f" ({group_name(g)})"),
                where=where,
                group_kind=kind,
                state=state,
                instances=(Instance(state, kind, None if g is None else g.index, (reader, writer), (src, dst)),),
                facts=(Fact("copied-block", (reader, src, dst, writer, "a copy-on-write destination"
                            if where == WHERE_COPY_ON_WRITE else "a new block"), True, False, after="schedule"),),
            )
    # A recurrent state is read at the start of the step's scan and written
    # at its end: adopting a state block another request writes in the
    # same step starts from a state that does not exist yet. (An attention
    # layer writes the batch's keys and values before it attends, so a
    # same-step attention block is readable; vLLM defers only Mamba hits,
    # MambaManager.cached_blocks_this_step.)
    for adm in step.admissions:
        if not adm.alloc_ok or adm.alloc_local_blocks is None:
            continue
        for g, rule, adopted in zip(own.groups, own.read_rules, adm.alloc_local_blocks):
            if rule[0] != "state":
                continue
            held = own.table_of(adm.request_id)
            kept = set() if held is None else set(held.tables[g.index])
            for bid in adopted:
                # A state the request dropped again in the same allocation
                # (an external load supplies a later one) is never read.
                if bid == null or bid not in kept or bid not in written or written[bid][0] == adm.request_id:
                    continue
                writer, where = written[bid]
                yield _violation(
                    "same-step-hazard",
                    step,
                    own,
                    f"request {adm.request_id} adopts block {bid} of {group_name(g)} as a cached state "
                    f"(adopted {list(adopted)}), but request {writer} writes it in this same step "
                    f"({'copy-on-write destination' if where == WHERE_COPY_ON_WRITE else 'new block'}): "
                    f"the state is read before it exists",
                    where=where,
                    group_kind=group_kind(g),
                    state=HAZARD_STATE_ADOPTED,
                    instances=(Instance(HAZARD_STATE_ADOPTED, group_kind(g), g.index, (adm.request_id, writer), (bid,)),),
                    # The state it resumes from, right after the schedule(): not that block.
                    facts=_adopted_state_facts(adm, g, list(adopted).index(bid), bid, writer),
                )


def _adopted_state_facts(adm: Any, g: Any, index: int, bid: int, writer: str) -> tuple[Fact, ...]:
    """The block at the adopted state's place in the request's table: not
    the one ``writer`` writes in the same step."""
    start = adm.alloc_local_tokens
    if not start:
        return ()
    return (Fact("table-block", (adm.request_id, g.index, index, start, (start - 1,),
                                 f"the state request {writer} writes in this same step: it does not exist yet"),
                 bid, bid, "!=", after="schedule"),)


def check_no_same_step_hazard(step: StepObservation) -> None:
    """No block written in this step (a new block, a copy-on-write
    destination, a new recurrent state) is read by another request in the
    same step before the write: no copy-on-write copy reads it, and no
    recurrent-state group adopts it as a cache hit. Generalises
    ``copy-source-ready`` (copy reading a copy) to every writer and group."""
    for violation in _hazard_violations(step):
        raise violation


check_no_same_step_hazard.violations = _hazard_violations  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# Reservations
# ---------------------------------------------------------------------------

_CORE = "vllm/v1/core/single_type_kv_cache_manager.py:"


def _reservation_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    own = step.ownership  # an allocation that raised inside schedule() counts too
    if own is None:
        return
    for rec in own.allocations:
        total_counted = sum(c or 0 for c in rec.counted)
        # The free-block check compares the sum with a pool that is never
        # negative: a negative sum admits what a zero sum admits, so the pool
        # can only run dry when more than max(sum, 0) blocks are taken (a
        # lone negative count with nothing taken hides nothing).
        if sum(rec.taken) > max(total_counted, 0) and all(t <= max(c or 0, 0) for c, t in zip(rec.counted, rec.taken)):
            # Each group kept to its own count, but a negative count (a group
            # expecting to give blocks back) let the sum admit less than the
            # other groups took.
            yield _violation(
                "reservation-covers-allocation",
                step,
                own,
                f"allocate_slots({rec.request_id}, num_new_tokens={rec.num_new_tokens}) counted "
                f"{total_counted} blocks in all (per group {list(rec.counted)}) but took "
                f"{sum(rec.taken)} (per group {list(rec.taken)}): a negative per-group count "
                f"hides blocks another group takes",
                where=WHERE_ROLLED_BACK if rec.request_id in step.rolled_back else "KVCacheManager.allocate_slots",
                instances=(Instance(requests=(rec.request_id,)),),
                facts=_count_facts(rec),
            )
        for g, counted, taken, takers in zip(own.groups, rec.counted, rec.taken, rec.takers):
            if taken <= max(counted or 0, 0):
                continue
            yield _violation(
                "reservation-covers-allocation",
                step,
                own,
                f"allocate_slots({rec.request_id}, num_new_tokens={rec.num_new_tokens}, "
                f"num_new_computed_tokens={rec.num_new_computed_tokens}, "
                f"num_external_computed_tokens={rec.num_external_computed_tokens}) counted "
                f"{counted} blocks for {group_name(g)} (get_num_blocks_to_allocate) but took {taken} "
                f"from the pool ({', '.join(takers)}){' and raised' if rec.raised else ''}: a pool "
                f"holding exactly the count runs dry",
                where="KVCacheManager.allocate_slots",
                group_kind=group_kind(g),
                frames=tuple(_CORE + name for name in takers),
                instances=(Instance("", group_kind(g), g.index, (rec.request_id,)),),
                facts=_count_facts(rec),
            )


def _count_facts(rec: Any) -> tuple[Fact, ...]:
    """What the coordinator's ``get_num_blocks_to_allocate`` counted for the
    request's ``allocate_slots`` (the sum over groups the free-block check
    compares with the pool), right after the ``schedule()``: at least the
    blocks the allocation then took from the pool (the harness saw them
    taken)."""
    if rec.raised or None in rec.counted:
        return ()
    return (Fact("counted-blocks", (rec.request_id, tuple(rec.counted), tuple(rec.taken)), sum(rec.counted),
                 sum(rec.taken), ">=", after="schedule"),)


def check_reservation_covers_allocation(step: StepObservation) -> None:
    """For every ``allocate_slots`` that passed its free-block check, each
    group took from the pool (new blocks, and evictable cached blocks it
    touched) no more than its ``get_num_blocks_to_allocate`` counted (a
    negative count covers nothing), and all groups together no more than the
    sum the free-block check compared with the pool."""
    for violation in _reservation_violations(step):
        raise violation


check_reservation_covers_allocation.violations = _reservation_violations  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# Lookup limits
# ---------------------------------------------------------------------------


def _lookup_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    own = step.ownership
    if own is None:
        return
    for rec in own.lookups:
        over = [(i, h) for i, h in enumerate(rec.hits) if h > rec.limit]
        if over:
            what = (
                f"the joint hit {rec.hits[0]}"
                if rec.call == "find_longest_cache_hit"
                else "per-group hits " + ", ".join(f"{group_name(own.groups[i])}: {h}" for i, h in over)
            )
            yield _violation(
                "lookup-within-limit",
                step,
                own,
                f"{rec.call}(block_hashes, {rec.limit}) returned {what}, past the limit {rec.limit}",
                where=f"KVCacheCoordinator.{rec.call}",
                group_kind=None if rec.call == "find_longest_cache_hit" else group_kind(own.groups[over[0][0]]),
                # The request's hit as a lookup finds it right before the step's schedule().
                facts=(Fact("cache-hit", (rec.request_id,), max(rec.hits), rec.limit, "<=", after="before"),)
                if rec.request_id and rec.call == "find_longest_cache_hit" else (),
            )
    for adm in step.admissions:
        if adm.local_hit > adm.num_tokens - 1:
            yield _violation(
                "lookup-within-limit",
                step,
                own,
                f"request {adm.request_id}: the scheduler's local lookup hit {adm.local_hit} tokens "
                f"of a {adm.num_tokens}-token prompt, past the limit num_tokens - 1 = {adm.num_tokens - 1}",
                where="Scheduler._get_local_prefix_cache_hit",
            )


def check_lookup_within_limit(step: StepObservation) -> None:
    """No prefix-cache lookup of the step returns a hit, joint or per group,
    longer than the limit its caller passed (the coordinator's
    ``max_cache_hit_length``), and no local hit of an admission reaches the
    prompt's last token (``num_tokens - 1``)."""
    for violation in _lookup_violations(step):
        raise violation


check_lookup_within_limit.violations = _lookup_violations  # type: ignore[attr-defined]


OWNERSHIP_CHECKS: tuple[Callable[[StepObservation], None], ...] = (
    check_read_blocks_held,
    check_no_same_step_hazard,
    check_reservation_covers_allocation,
    check_lookup_within_limit,
)
