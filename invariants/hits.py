"""How long a prefix-cache hit each lookup serves, against the model's index.

The model's index (``AdmissionObservation.index_hold``, read at the instant
of the lookup by ``fuzz/adapter/_hits.py``) lists, per group, the prefix
lengths of the request that the prefix-cache index files an entry for (an
entry for the prefix of ``L`` tokens in a group of block ``b``: a block
holding positions ``[(L - 1) // b * b, L)`` of that prefix, full when ``b``
divides ``L``, else the partial tail of a prompt).

The rules, stated for layouts whose groups are all full attention or
Mamba (no EAGLE block drop, no DCP/PCP; other layouts carry no
``index_hold`` and get no prediction):

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
* the hit is the longest prefix, a multiple of the hit alignment (the hash
  block with sub-block hits on, else the scheduler block) and no longer
  than the caller's limit (``num_tokens - 1`` by default), that every group
  serves; with a connector that takes divergent hybrid hits, a layout with
  Mamba and one full-attention group gets that group's own reach instead,
  unless some group reaches past it (vLLM's
  ``get_computed_blocks_for_connector``); with more full-attention groups
  no prediction.

A served hit longer than that reads blocks the index does not hold for the
request (a safety violation); a shorter one recomputes tokens that were
cached: a :class:`fuzz.model.MissedHit`, its own outcome.
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.model import AdmissionObservation, InvariantViolation, MissedHit, group_kind

__all__ = ["HIT_CHECKS", "HIT_LONGER", "HIT_SHORTER", "check_hit_matches_index", "predicted_hit"]

# The failing conditions (deduplication and known-bug matching name them).
HIT_LONGER = "a hit longer than the index holds"
HIT_SHORTER = "a missed hit"
WHERE = "KVCacheManager.get_computed_blocks"


def _reach(held: frozenset[int], block: int, alignment: int, limit: int) -> int:
    """How far one group's entries take a lookup capped at ``limit``."""
    full = 0
    while full + block <= limit and full + block in held:
        full += block
    if alignment < block and block % alignment == 0:  # sub-block hits: the first block past the full run
        tails = [n for n in held if full < n < full + block and n <= limit]
        if tails:
            return max(tails)
    return full


def predicted_hit(adm: AdmissionObservation) -> tuple[int, tuple[int, ...]] | None:
    """The longest hit the model's index allows ``adm``'s lookup, with each
    group's reach; None where the claim makes no prediction."""
    if adm.index_hold is None or adm.hit_alignment <= 0 or not adm.groups:
        return None
    mamba = [group_kind(g) == "MambaSpec" for g in adm.groups]
    limit, align = max(adm.hit_limit, 0), adm.hit_alignment
    reaches = []
    states: set[int] | None = None  # the lengths every Mamba group holds a state for
    for held, group, is_mamba in zip(adm.index_hold, adm.groups, mamba):
        if not is_mamba:
            reaches.append(_reach(frozenset(held), group.block_size, align, limit) // align * align)
            continue
        fine = align < group.block_size and group.block_size % align == 0
        mine = {n for n in held if n <= limit and n % align == 0 and (fine or n % group.block_size == 0)}
        states = mine if states is None else states & mine
        reaches.append(max(mine, default=0))
    if states is None:
        return min(reaches), tuple(reaches)
    if adm.divergent_capable:
        # A connector that takes divergent hybrid hits: the local hit is the
        # full-attention group's own, unless a group reaches past it (then
        # the joint hit below).
        full = [r for r, is_mamba in zip(reaches, mamba) if not is_mamba]
        if len(full) != 1:
            return None
        if max(reaches) <= full[0]:
            return full[0], tuple(reaches)
    top = min(r for r, is_mamba in zip(reaches, mamba) if not is_mamba) if not all(mamba) else limit
    return max((n for n in states if n <= top), default=0), tuple(reaches)


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
    kind = InvariantViolation if longer else MissedHit
    raise kind("hit-matches-index", text, where=WHERE, state=HIT_LONGER if longer else HIT_SHORTER)


HIT_CHECKS: tuple[Callable[..., None], ...] = (check_hit_matches_index,)
