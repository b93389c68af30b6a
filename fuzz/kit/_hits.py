"""What a standalone repro watches of how long a hit each lookup serves and
which cached blocks survive pool pressure (:mod:`invariants.hits`'s claims;
the eviction order's is the suite's check itself, the hit length's restated
here), with the suite's own rules: the hit the index allows
(``fuzz/model/_hits.py``), the index read at the instant of the lookup
(``fuzz/adapter/_hits.py``), vLLM's free order (``fuzz/model/_evictions.py``)
and the watch of every free and eviction (``fuzz/adapter/_evictions.py``),
all carried by the file as they are.

A lookup shorter than the index allows, and an eviction out of the free
order, are missed hits: performance bugs (cached tokens recomputed), not
wrong results; a lookup longer than the index allows reads blocks the
index does not hold for the prefix (a violation).
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_utils import get_group_id

from fuzz.adapter._evictions import EvictionWatch
from fuzz.adapter._hits import index_hold
from fuzz.kit._build import _describe_groups
from fuzz.kit._params import DIVERGENT_HITS
from fuzz.model._hits import allowed_hit


def _prefix_cache_map(pool):
    """The block pool's prefix-cache index: key -> block (or block id -> block)."""
    return pool.cached_block_hash_to_block._cache


def _index_at_lookup(manager, request, max_cache_hit_length):
    """Per group, the prefix lengths of ``request`` the index holds an entry
    for, the hit alignment and the lookup's limit, read as the lookup
    begins (empty where the claim makes no prediction)."""
    partial = bool(getattr(manager.coordinator, "enable_partial_hash_hits", False))
    return index_hold(manager, request, max_cache_hit_length, _prefix_cache_map(manager.block_pool), partial)


def _watch_frees(scheduler, watch):
    """How every free block came back to the pool, and each cached block an
    allocation evicts (with the blocks still free then): the suite's watch."""
    return EvictionWatch(scheduler, lambda: watch.step, _prefix_cache_map, get_group_id)


def _check_hit_matches_index(scheduler, out, watch, step):
    """Every local prefix-cache lookup of the step served exactly the longest
    hit the index held for the request as the lookup began: shorter is a
    missed hit, longer reads blocks the index does not hold."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    shorter, longer = [], []
    for rid, (served, held) in watch.hits.items():
        allowed = allowed_hit(held["index_hold"], [m.block_size for m in managers],
                              [type(m.kv_cache_spec).__name__ == "MambaSpec" for m in managers],
                              held["hit_alignment"], held["hit_limit"], DIVERGENT_HITS, held["hit_windows"],
                              held["hit_chunks"], held["hit_drops"])
        if allowed is None or served == allowed[0]:
            continue
        what = (
            f"request {rid}'s lookup served a hit of {served} tokens, the index allows {allowed[0]} (per group "
            f"reach {list(allowed[1])}; prefix lengths the index held per group {[list(g) for g in held['index_hold']]}, "
            f"hit alignment {held['hit_alignment']}, limit {held['hit_limit']}"
            + (f", EAGLE drop per group {list(held['hit_drops'])}" if any(held["hit_drops"]) else "") + ")"
        )
        (shorter if served < allowed[0] else longer).append(what)
    assert not longer, (
        f"step {step}: a prefix-cache hit longer than the index holds (it reads blocks the index does not hold "
        f"for this prefix): {'; '.join(longer)}; groups: {_describe_groups()}"
    )
    assert not shorter, (
        f"step {step}: a missed hit (a performance bug: cached tokens recomputed): {'; '.join(shorter)}; "
        f"groups: {_describe_groups()}"
    )

