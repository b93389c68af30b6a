"""How long a prefix-cache hit each lookup serves, against the model's index.

The model's index (``AdmissionObservation.index_hold``, read at the instant
of the lookup by ``fuzz/adapter/_hits.py``) lists, per group, the prefix
lengths of the request that the prefix-cache index files an entry for (an
entry for the prefix of ``L`` tokens in a group of block ``b``: a block
holding positions ``[(L - 1) // b * b, L)`` of that prefix, full when ``b``
divides ``L``, else the partial tail of a prompt).

The rules, stated for layouts whose groups are all full attention (R-SWA's
included: it looks hits up as full attention), sliding window, chunked
local or Mamba (no DCP/PCP; other layouts carry no ``index_hold`` and get
no prediction):

* a group reaches ``L`` when it holds every full block of the prefix below
  ``L // b * b`` and, where ``b`` does not divide ``L``, the partial entry
  for ``L`` itself; with sub-block hits on (the hit alignment is the hash
  block, finer than ``b``) only a partial entry in the first block past
  the run of full ones counts, without them only full blocks;
* every full-attention group serves any prefix no longer than its reach
  (it reads every position, and a block's KV is append-only);
* a Mamba group serves exactly the prefixes it holds a state for: an entry
  at that length (at a block boundary of its own, unless sub-block hits
  are on);
* a sliding-window group of window ``W`` serves a whole number of its
  blocks ``L`` when it holds each of the last ``max(1, ceil((W - 1) / b))``
  blocks before ``L`` (those the next token's window reads; fewer near
  token 0), whatever it holds further back
  (``SlidingWindowManager.find_longest_cache_hit``);
* a chunked-local group of chunk ``C`` serves ``L`` when it holds every
  block from ``L // C * C`` up to ``L`` (none at a chunk boundary;
  ``ChunkedLocalAttentionManager.find_longest_cache_hit``), and gets no
  prediction where ``C`` is not whole blocks or the hit alignment is not
  its block;
* a group an EAGLE-style drafter drops for (it holds draft layers, or
  is looked up with one that does; every group when none is flagged;
  never a Mamba group) serves a length ``L`` only where it would also
  serve ``L`` without the drop and holds the entry past it by the drop
  unit (one hash unit for full attention with sub-block hits on, else one
  of its blocks): the drafter wrote the KV at ``L - 1`` with the token at
  ``L``, and only an entry past ``L`` under the request's own chain proves
  that token the request's (the entry may lie past the caller's limit); a
  dropping sliding window needs ``ceil((W - 1) / b)`` blocks before ``L``
  (none for a one-token window) and that entry;
* the hit is the longest prefix, a multiple of the hit alignment (the hash
  block with sub-block hits on, else the scheduler block) and no longer
  than the caller's limit (``num_tokens - 1`` by default), that every group
  serves (the hybrid coordinator's fixed point); with a connector that takes divergent hybrid hits, a layout with
  Mamba and one full-attention group gets that group's own reach instead,
  unless some group reaches past it (vLLM's
  ``get_computed_blocks_for_connector``); with more full-attention groups
  no prediction.

(The rule is :func:`fuzz.model.allowed_hit`, standard library only.)

A served hit longer than that reads blocks the index does not hold for the
request (a safety violation); a shorter one recomputes tokens that were
cached: a :class:`fuzz.model.MissedHit`, its own outcome.

Which cached blocks survive pool pressure (``check_eviction_order``, a step
check) follows vLLM's documented free order (``BlockPool.free_blocks``,
``SingleTypeKVCacheManager.free``): a block that comes back with no key goes
to the front of the free queue, a cached one to its end, and allocations
take from the front. From how each free block came back
(:class:`fuzz.model.FreedBlock`, never the queue itself) the claim states
only a partial order, each rule a consequence of that one:

* (a) a free block with no key when it came back (or free since the pool
  was built) is reused before any block that came back cached;
* (b) within one request's free of one group, its later table blocks
  before its earlier ones (the free goes tail first);
* (c) a block that came back cached at an earlier step before one that
  came back cached at a later step.

Blocks freed in the same step by different requests, groups or paths are
unordered. Blocks that leave a running request's table (a sliding-window or
chunked-local group dropping blocks its window has passed, R-SWA's gap, a
Mamba group retiring an old state) and copy-on-write retentions come back
through ``free_blocks`` too: rules (a) and (c) hold for them, rule (b) is not
stated for them (no request's free is in progress). A cached block evicted
while a block the order puts ahead of it is still free (not handed out, not
adopted by a hit) was evicted out of order: a missed hit waiting to happen
(its keys are gone while the block that should have gone keeps its own).
The order is :func:`fuzz.model.reused_before` (a repro carries it too, with
the harness's watch of the frees, ``fuzz/adapter/_evictions.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from fuzz.model import (
    AdmissionObservation,
    Fact,
    GroupInfo,
    InvariantViolation,
    MissedHit,
    StepObservation,
    allowed_hit,
    describe_out_of_order,
    evicted_out_of_order,
    group_kind,
    reused_before,
)

__all__ = [
    "EVICTED_OUT_OF_ORDER", "HIT_CHECKS", "HIT_LONGER", "HIT_LONGER_WITHOUT_EAGLE_PROOF", "HIT_SHORTER",
    "HIT_STEP_CHECKS", "adopted_fact", "check_eviction_order", "check_hit_matches_index", "first_difference",
    "predicted_hit", "reused_before", "served_fact", "state_bound",
]

# The failing conditions (deduplication and known-bug matching name them).
HIT_LONGER = "a hit longer than the index holds"
# ... where every group serves the hit without its EAGLE drop, and a dropping
# group lacks only the entry past it that proves the drafter's last position.
HIT_LONGER_WITHOUT_EAGLE_PROOF = "a hit longer than the index allows that only a dropping group's EAGLE proof refuses"
HIT_SHORTER = "a missed hit"
# ... where a full-attention group holds a full block past the hit but no
# entry at the hit's length inside it (a block size that does not divide it),
# or, under an EAGLE drop, none at the length one drop past the hit that
# proves it.
HIT_SHORTER_INSIDE_A_FULL_BLOCK = "a missed hit inside a cached full block of a full-attention group"
# ... where a lone EAGLE-dropping group's proof of the hit is an entry past
# the caller's limit, and the lookup served what the index allows without it
# (a lookup that reads no further than the limit: a block less, or on a
# sliding window the whole hit).
HIT_SHORTER_EAGLE_PROOF_PAST_LIMIT = "a missed hit whose EAGLE drop is proven by an entry past the caller's limit"
# ... where a dropping sliding-window group holds every block from token 0
# past the hit, a run shorter than its window, on blocks finer than the alignment.
HIT_SHORTER_EAGLE_WINDOW_FROM_ZERO = (
    "a missed hit of a sliding window under an EAGLE drop whose run from token 0 is shorter than its window"
)
HIT_WHERE = "KVCacheManager.get_computed_blocks"
EVICTED_OUT_OF_ORDER = "a cached block evicted while one the free order puts ahead of it stays free"
EVICTION_WHERE = "BlockPool.get_new_blocks"


def predicted_hit(adm: AdmissionObservation) -> tuple[int, tuple[int, ...]] | None:
    """The longest hit the model's index allows ``adm``'s lookup, with each
    group's reach (:func:`fuzz.model.allowed_hit`); None where the claim
    makes no prediction."""
    if adm.index_hold is None or not adm.groups:
        return None
    return allowed_hit(
        adm.index_hold,
        [g.block_size for g in adm.groups],
        [group_kind(g) == "MambaSpec" for g in adm.groups],
        adm.hit_alignment,
        adm.hit_limit,
        adm.divergent_capable,
        adm.hit_windows,
        adm.hit_chunks,
        adm.hit_drops,
    )


def check_hit_matches_index(adm: AdmissionObservation, context: str = "") -> None:
    """The local hit the scheduler's lookup returned is exactly the longest
    hit the model's index allows: longer is an InvariantViolation, shorter
    a MissedHit."""
    predicted = predicted_hit(adm)
    if predicted is None or adm.local_hit == predicted[0]:
        return
    hit, reaches = predicted
    longer = adm.local_hit > hit
    text = (
        f"request {adm.request_id} at step {adm.step}: the lookup served a hit of {adm.local_hit} tokens, "
        f"the index allows {hit} (per group reach {list(reaches)}, block sizes "
        f"{[g.block_size for g in adm.groups]}, hit alignment {adm.hit_alignment}, limit {adm.hit_limit}): "
        + ("it reads blocks the index does not hold for this prefix" if longer
           else f"{hit - adm.local_hit} cached token(s) recomputed")
        + f"\n{adm.describe()}"
        + (f"\n  scenario: {context}" if context else "")
    )
    if longer:
        raise InvariantViolation("hit-matches-index", text, where=HIT_WHERE, state=_excess(adm),
                                 facts=_hit_facts(adm, hit))
    raise MissedHit("hit-matches-index", text, where=HIT_WHERE, state=_shortfall(adm, hit, reaches),
                    facts=_hit_facts(adm, hit))


def _hit_facts(adm: AdmissionObservation, hit: int) -> tuple[Fact, ...]:
    """The hit the admitting ``schedule()`` counted computed, where nothing
    but the lookup adds to it (no external tokens, no truncation)."""
    if not adm.admitted or adm.reply or adm.connector_external_tokens or adm.truncated_at is not None:
        return ()
    return (Fact("hit-tokens", (adm.request_id,), adm.local_hit, hit, step=adm.step, after="schedule"),)


# The facts of the admission claims of invariants/scheduler.py: what the
# admitting schedule() left in the request, as an upstream repro asserts it.
def served_fact(adm: AdmissionObservation, bound: int, relation: str, why: str) -> tuple[Fact, ...]:
    """The tokens the admitting ``schedule()`` counted computed for the
    request (local and external), against ``bound``: ``why``."""
    return (Fact("hit-tokens", (adm.request_id, why), adm.num_computed_tokens, bound, relation, step=adm.step,
                 after="schedule"),)


def adopted_fact(adm: AdmissionObservation, group: int, index: int, why: str) -> tuple[Fact, ...]:
    """The block at ``index`` of the request's table in ``group`` right
    after the admitting ``schedule()``, which may not be there: ``why``
    (none where the table is shorter)."""
    table = adm.block_table[group] if group < len(adm.block_table) else ()
    if index >= len(table) or adm.num_computed_tokens is None:
        return ()
    size, start = adm.groups[group].block_size, adm.num_computed_tokens
    positions = tuple(range(index * size, min((index + 1) * size, start)))
    return (Fact("table-block", (adm.request_id, group, index, start, positions, why), table[index], table[index], "!=",
                 step=adm.step, after="schedule"),)


def state_bound(adm: AdmissionObservation, group: GroupInfo, adopted: Sequence[int]) -> int:
    """Where the last state among a whole-state group's ``adopted`` blocks
    ends (0: none): the furthest a request may resume without external tokens."""
    return max([(j + 1) * group.block_size for j, b in enumerate(adopted) if b != adm.null_block_id], default=0)


def first_difference(found: Sequence[int], wanted: Sequence[int]) -> int:
    """The first index where two block lists differ (one ends first: its length)."""
    return next((i for i, (a, b) in enumerate(zip(found, wanted)) if a != b), min(len(found), len(wanted)))


def _excess(adm: AdmissionObservation) -> str:
    """Which longer hit: on three or more distinct specs with a Mamba group,
    one every group serves without its EAGLE drop (the hit the index allows
    with no drop and the served length as the limit is the served length
    itself), refused only because sliding-window groups lack the entry past
    it that proves their drop; or any other."""
    assert adm.index_hold is not None
    served, drops = adm.local_hit, adm.hit_drops or (0,) * len(adm.groups)
    windows = adm.hit_windows or (0,) * len(adm.groups)
    specs = {(g.spec_class, g.block_size, w) for g, w in zip(adm.groups, windows)}
    unproven = [w for held, drop, w in zip(adm.index_hold, drops, windows) if drop and served + drop not in held]
    if len(specs) >= 3 and any(group_kind(g) == "MambaSpec" for g in adm.groups) and unproven and all(unproven):
        blind = predicted_hit(dataclasses.replace(adm, hit_drops=(), hit_limit=served))
        if blind is not None and blind[0] == served:
            return HIT_LONGER_WITHOUT_EAGLE_PROOF
    return HIT_LONGER


def _shortfall(adm: AdmissionObservation, hit: int, reaches: tuple[int, ...]) -> str:
    """Which missed hit: a lone EAGLE-dropping group's that served exactly
    what the index allows a lookup reading nothing past the caller's limit,
    where the model's proof is an entry past it; one alignment unit short,
    where a dropping sliding window's run of blocks from token 0 is shorter
    than its window; one where a full-attention group reaches past the hit through a
    cached full block but files no entry at the hit's length (its block size
    does not divide it); or any other."""
    assert adm.index_hold is not None
    windows = adm.hit_windows or (0,) * len(adm.groups)
    chunks = adm.hit_chunks or (0,) * len(adm.groups)
    drops = adm.hit_drops or (0,) * len(adm.groups)
    # One group (vLLM's unitary coordinator): what the index allows without its entries past the limit.
    if len(adm.groups) == 1 and drops[0]:
        within = tuple(tuple(n for n in held if n <= adm.hit_limit) for held in adm.index_hold)
        blind = predicted_hit(dataclasses.replace(adm, index_hold=within))
        if blind is not None and adm.local_hit == blind[0]:
            return HIT_SHORTER_EAGLE_PROOF_PAST_LIMIT
    for g, held, window, drop in zip(adm.groups, adm.index_hold, windows, drops):
        run = hit // g.block_size + 1  # blocks from token 0 through the one past the hit
        need = -(-(window - 1) // g.block_size) + 1  # the blocks vLLM's dropping search looks for
        if window and drop and g.block_size < adm.hit_alignment and run < need \
                and adm.local_hit == max(0, hit - adm.hit_alignment) and all(
            k * g.block_size in held for k in range(1, run + 1)
        ):
            return HIT_SHORTER_EAGLE_WINDOW_FROM_ZERO
    for g, held, reach, window, chunk, drop in zip(adm.groups, adm.index_hold, reaches, windows, chunks, drops):
        full = group_kind(g) != "MambaSpec" and not window and not chunk
        if full and hit % g.block_size and hit not in held and reach > hit:
            return HIT_SHORTER_INSIDE_A_FULL_BLOCK
        # The same with an EAGLE drop: the group proves the hit by an entry one
        # drop past it, and the length that proves it lies inside a cached full block.
        proof = hit + drop
        if full and drop and proof % g.block_size and proof not in held and any(
            n - g.block_size < proof < n for n in held
        ):
            return HIT_SHORTER_INSIDE_A_FULL_BLOCK
    return HIT_SHORTER


def check_eviction_order(step: StepObservation) -> None:
    """Every cached block an allocation evicted (``BlockPool.get_new_blocks``)
    was, by vLLM's documented free order, the first of the free blocks still
    free: none that the order's rules (a)-(c) put ahead of it survived the
    eviction. A survivor ahead of it is a missed hit: the pool dropped keys
    the order would have kept."""
    found = evicted_out_of_order(step.evictions)
    if not found:
        return
    raise MissedHit(
        "eviction-order",
        f"step {step.step}: the pool evicted cached block(s) out of vLLM's free order (tail blocks of a "
        "request's free first, blocks with no key before cached ones, earlier frees first):\n"
        + describe_out_of_order(found)
        + f"\n{step.describe()}",
        where=EVICTION_WHERE,
        state=EVICTED_OUT_OF_ORDER,
        facts=_eviction_facts(step, found),
    )


def _eviction_facts(step: StepObservation, found: list) -> tuple[Fact, ...]:
    """Per out-of-order eviction, one block the order puts ahead of it that
    the step left cached: right after its ``schedule()``, the evicted
    block's entry must still be there, or that block's gone too. Each as
    (request, tokens) of the entries (a request's free tells both)."""
    own = step.ownership
    taken = {ev.freed.block for ev in step.evictions}
    facts = []
    for ev, ahead in found:
        b = ev.freed
        kept = [(c, why) for c, why in ahead if c.block not in taken and c.request is not None
                and c.group == b.group and c.index is not None]
        if own is None or b.request is None or b.index is None or b.group is None or not kept:
            continue
        (c, why), size = kept[0], own.groups[b.group].block_size
        facts.append(Fact("evicted-before", (b.request, (b.index + 1) * size, c.request, (c.index + 1) * size, b.group,
                                             b.block, c.block, why), False, True, after="schedule"))
    return tuple(facts)


HIT_CHECKS: tuple[Callable[..., None], ...] = (check_hit_matches_index,)
# Step checks (invariants/scheduler.py runs them after the others).
HIT_STEP_CHECKS: tuple[Callable[[StepObservation], None], ...] = (check_eviction_order,)
