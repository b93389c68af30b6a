"""How long a prefix-cache hit each lookup serves, against the model's index.

The model's index (``AdmissionObservation.index_hold``, read at the instant
of the lookup by ``fuzz/adapter/_hits.py``) lists, per group, the prefix
lengths of the request that the prefix-cache index files an entry for (an
entry for the prefix of ``L`` tokens in a group of block ``b``: a block
holding positions ``[(L - 1) // b * b, L)`` of that prefix, full when ``b``
divides ``L``, else the partial tail of a prompt).

The rules, stated for layouts whose groups are all full attention (no
EAGLE block drop, no DCP/PCP; other layouts carry no ``index_hold`` and
get no prediction):

* a group reaches ``L`` when it holds every full block of the prefix below
  ``L // b * b`` and, where ``b`` does not divide ``L``, the partial entry
  for ``L`` itself; with sub-block hits on (the hit alignment is the hash
  block, finer than ``b``) only a partial entry in the first block past
  the run of full ones counts, without them only full blocks;
* every group serves any prefix no longer than its reach (full attention
  reads every position, and a block's KV is append-only);
* the hit is the longest prefix, a multiple of the hit alignment (the hash
  block with sub-block hits on, else the scheduler block) and no longer
  than the caller's limit (``num_tokens - 1`` by default), that every group
  reaches.

A served hit longer than that reads blocks the index does not hold for the
request (a safety violation); a shorter one recomputes tokens that were
cached: a :class:`fuzz.model.MissedHit`, its own outcome.
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.model import AdmissionObservation, InvariantViolation, MissedHit

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
    if adm.index_hold is None or adm.hit_alignment <= 0:
        return None
    limit = max(adm.hit_limit, 0)
    reaches = tuple(
        _reach(frozenset(held), group.block_size, adm.hit_alignment, limit)
        for held, group in zip(adm.index_hold, adm.groups)
    )
    if not reaches:
        return None
    return min(reaches) // adm.hit_alignment * adm.hit_alignment, reaches


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
