"""What the prefix cache must still serve, against the harness's own model
of it (``fuzz/adapter/_cache_model.py``), never against vLLM's index read
back.

The model files, for every request a ``SchedulerOutput`` schedules, each
full block its allocation cached (up to ``min(num_computed + scheduled,
num_tokens)``, less MTP's re-prefillable tokens, cut to a whole scheduler
block by the hybrid coordinator without sub-block hits, as far as its
hashes reach), under the request's own key at that block's end, and forgets an
entry only when vLLM's policy lets it go: the block handed out by
``get_new_blocks``, evicted by id, copied over, or a reset that succeeded.
Frees keep every key (``BlockPool.free_blocks`` only queues the block).
Stated for layouts whose groups are all full attention
(``FullAttentionManager``, one pool, no DCP/PCP), full blocks only.

* ``cache-keeps-entries``: after every step, each entry the model files is
  in the index, under its key, on its block. A missing one is a missed hit
  waiting to happen (:class:`fuzz.model.MissedHit`).
* ``hit-reaches-model``: each lookup the hit-length claim states serves at
  least the model's guaranteed hit: the longest run of full blocks from
  token 0 that every group files under the request's keys, capped at the
  caller's limit, cut to the hit alignment, less an EAGLE drop. Shorter is
  a missed hit.
* ``caching-off-caches-nothing``: an engine started with prefix caching off
  (the configuration's flag, not vLLM's) files no entry in the index, in
  any layout: after every step the index is empty. An entry there names KV
  the engine was told never to share (a later lookup, or a connector
  reading the index, could serve it).
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.model import Fact, Instance, InvariantViolation, MissedHit, StepObservation, group_kind

__all__ = ["CACHED_WHILE_OFF", "CACHE_CHECKS", "ENTRY_FORGOTTEN", "HIT_BELOW_MODEL",
           "check_cache_keeps_entries", "check_caching_off_caches_nothing", "check_hit_reaches_model"]

# The failing conditions (deduplication and known-bug matching name them).
ENTRY_FORGOTTEN = "a full-block entry the cache must keep is gone from the index"
HIT_BELOW_MODEL = "a hit shorter than the cache model guarantees"
ENTRY_WHERE = "BlockPool"  # whichever of its calls dropped the keys
HIT_WHERE = "KVCacheManager.get_computed_blocks"
CACHED_WHILE_OFF = "an entry in the prefix-cache index with prefix caching off"
CACHED_WHILE_OFF_WHERE = "KVCacheCoordinator.cache_blocks"


def _kind(step: StepObservation, group: int) -> str | None:
    """The spec kind of ``group`` (None where the step has no record of it)."""
    own = step.ownership
    return group_kind(own.groups[group]) if own is not None and group < len(own.groups) else None


def check_cache_keeps_entries(step: StepObservation) -> None:
    """Every entry the cache model files is still in the index after the step."""
    if step.error or not step.forgotten_entries:
        return
    raise MissedHit(
        "cache-keeps-entries",
        f"step {step.step}: {len(step.forgotten_entries)} prefix-cache entr(ies) the cache must still "
        "serve are gone from the index (frees keep keys; only an allocation of the block, an eviction by "
        "id or a reset drops them):\n  "
        + "\n  ".join(e.describe() for e in step.forgotten_entries)
        + f"\n{step.describe()}"
        + (f"\n  scenario: {step.context}" if step.context else ""),
        where=ENTRY_WHERE,
        state=ENTRY_FORGOTTEN,
        # One instance per entry: the request that filed it, its group and block.
        instances=tuple(Instance(ENTRY_FORGOTTEN, _kind(step, e.group), e.group, (e.request_id,), (e.block,))
                        for e in step.forgotten_entries),
        # The blocks the index holds under the request's key for its first
        # ``tokens`` tokens in the group: the one the model filed it on.
        facts=tuple(Fact("cached-blocks", (e.request_id, e.tokens, e.group), (), (e.block,))
                    for e in step.forgotten_entries),
    )


def check_hit_reaches_model(step: StepObservation) -> None:
    """Every lookup of the step served at least the cache model's guaranteed hit."""
    if step.error or not step.short_hits:
        return
    raise MissedHit(
        "hit-reaches-model",
        f"step {step.step}: lookup(s) served less than the entries the cache must still hold allow:\n  "
        + "\n  ".join(h.describe() for h in step.short_hits)
        + f"\n{step.describe()}"
        + (f"\n  scenario: {step.context}" if step.context else ""),
        where=HIT_WHERE,
        state=HIT_BELOW_MODEL,
        # One instance per lookup: its request and the blocks of the guaranteed
        # hit (a lookup's hit is joint: no group of its own).
        instances=tuple(Instance(HIT_BELOW_MODEL, requests=(h.request_id,),
                                 blocks=tuple(b for blocks in h.blocks for b in blocks))
                        for h in step.short_hits),
        # The tokens the admitting schedule() counts computed for the request:
        # at least the model's guaranteed hit.
        facts=tuple(Fact("hit-tokens", (h.request_id,), h.served, h.guaranteed, ">=", after="schedule")
                    for h in step.short_hits),
    )


def check_caching_off_caches_nothing(step: StepObservation) -> None:
    """With prefix caching off, the index holds no entry after the step."""
    if step.error or not step.cached_while_off:
        return
    raise InvariantViolation(
        "caching-off-caches-nothing",
        f"step {step.step}: the engine runs with prefix caching off (--no-enable-prefix-caching), yet its "
        f"prefix-cache index holds {len(step.cached_while_off)} entr(ies):\n  "
        + "\n  ".join(e.describe() for e in step.cached_while_off)
        + f"\n{step.describe()}"
        + (f"\n  scenario: {step.context}" if step.context else ""),
        where=CACHED_WHILE_OFF_WHERE,
        state=CACHED_WHILE_OFF,
        instances=tuple(Instance(CACHED_WHILE_OFF, _kind(step, e.group), e.group, (), (e.block,))
                        for e in step.cached_while_off),
    )


# Step checks (invariants/scheduler.py runs them with the other missed hits, last).
CACHE_CHECKS: tuple[Callable[[StepObservation], None], ...] = (
    check_hit_reaches_model, check_cache_keeps_entries, check_caching_off_caches_nothing)
