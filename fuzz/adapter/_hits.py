"""What the prefix-cache index holds for one lookup, read at the instant of
the lookup: the model side of the hit-length claim (invariants/hits.py).

A request's hash at a hash-block boundary ``k * hash_block_size`` chains
over every token (and the cache salt) before it, so it names that prefix
alone; the index files a block under (that hash, group) when the block holds
the prefix's last block, full or, for the last hash boundary of a prompt
inside a larger block, partial. This module reads, per group, which prefix
lengths of the request the index has an entry for. It never calls vLLM's
lookup: how long a hit those entries allow is the claim's own rule.

The record is made only for layouts whose rules the claim states: every
group full attention (R-SWA's included), sliding window, chunked local or
Mamba and prefix-cacheable, no context-parallel sharding (DCP/PCP), and a
lookup the request does not skip. Under an EAGLE-style drafter's block drop
the rule is the same for any number of specs: the longest length every
group serves with its own proof (with three or more the coordinator reaches
it by a fixed point that verifies each group's drop once per candidate
length; vLLM issues 32802 and 51771 are about that loop).

vLLM and the standard library only (what differs between vLLM releases,
where the index lives and whether sub-block hits are on, the caller reads).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.core.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager, FullAttentionManager, MambaManager, SlidingWindowManager,
)
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec, SlidingWindowSpec

__all__ = ["index_hold"]


def _drops(manager: Any, alignment: int) -> tuple[int, ...]:
    """Per group, the tokens an EAGLE-style drafter's drop takes off its
    hit (0: none), from the configuration alone: the manager built with the
    drop on, the groups that hold draft layers (``is_eagle_group``; every
    group when none is flagged), and a group looked up together with one of
    them (the same spec) drops with it. A Mamba group never drops; a sliding
    window drops one of its blocks; full attention one hash unit with
    sub-block hits on, else one block."""
    groups = manager.kv_cache_config.kv_cache_groups
    if not getattr(manager, "use_eagle", False):
        return (0,) * len(groups)
    flagged = {i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)} or set(range(len(groups)))
    specs = [g.kv_cache_spec for g in groups]
    drops = []
    for i, spec in enumerate(specs):
        if isinstance(spec, MambaSpec) or not any(specs[j] == spec for j in flagged):
            drops.append(0)
        else:
            block = int(spec.block_size)
            drops.append(block if isinstance(spec, SlidingWindowSpec) else min(alignment, block))
    return tuple(drops)


def _stated(manager: Any) -> bool:
    """The layout is one the hit-length claim predicts for."""
    coordinator = manager.coordinator
    if int(getattr(coordinator, "pcp_world_size", 1) or 1) > 1:
        return False
    for group, single in zip(manager.kv_cache_config.kv_cache_groups, coordinator.single_type_managers):
        spec = group.kv_cache_spec
        # R-SWA looks hits up as full attention (RSWAManager inherits the lookup; it frees decode gaps only).
        full = type(single) is FullAttentionManager or type(single).__name__ == "RSWAManager"
        if not (isinstance(spec, FullAttentionSpec) and full) and not (
            type(spec) is MambaSpec and type(single) is MambaManager
        ) and not (isinstance(spec, SlidingWindowSpec) and type(single) is SlidingWindowManager) and not (
            type(spec) is ChunkedLocalAttentionSpec and type(single) is ChunkedLocalAttentionManager
        ):
            return False
        if not getattr(spec, "prefix_cacheable", True) or max(
            int(getattr(single, "dcp_world_size", 1) or 1), int(getattr(single, "pcp_world_size", 1) or 1)
        ) > 1:
            return False
    return True


def index_hold(
    manager: Any, request: Any, max_cache_hit_length: int | None, cached: dict[Any, Any] | None, partial_hits: bool
) -> dict[str, Any]:
    """The AdmissionObservation fields of the model's index (``cached``: the
    block pool's prefix-cache map; ``partial_hits``: sub-block hits on) for
    ``request``'s lookup by ``manager`` (a KVCacheManager): per group, the
    prefix lengths (multiples of the hash block) the index holds an entry
    for, in every group of its spec (vLLM looks those up together); the hit
    alignment; the caller's limit; per group, the sliding
    window of a sliding-window group and the attention chunk of a
    chunked-local one (0 for any other); per group, the EAGLE drop. Empty (no prediction) for a
    layout the claim does not state, a request that skips the lookup, or a
    release that keeps its index otherwise (``cached`` None)."""
    # Whether vLLM looks at all is its own call (prompt logprobs, skip_reading_prefix_cache): not this claim's.
    lookup_enabled = getattr(manager, "prefix_cache_lookup_enabled", None)
    if not manager.enable_caching or (lookup_enabled is not None and not lookup_enabled(request)):
        return {}
    if getattr(request, "skip_reading_prefix_cache", False) or not _stated(manager):
        return {}
    if cached is None:
        return {}
    coordinator = manager.coordinator
    hash_block = manager.block_pool.hash_block_size
    alignment = hash_block if partial_hits else coordinator.scheduler_block_size
    hashes = list(request.block_hashes)
    specs = [g.kv_cache_spec for g in manager.kv_cache_config.kv_cache_groups]
    own = [
        {(i + 1) * hash_block for i, h in enumerate(hashes) if cached.get(make_block_hash_with_group_id(h, g))}
        for g in range(len(specs))
    ]
    # Groups of one spec are looked up together (the hybrid coordinator's
    # spec groups): each holds a length only where every one of them does.
    held = tuple(
        tuple(sorted(n for n in own[g] if all(n in own[o] for o in range(len(specs)) if specs[o] == specs[g])))
        for g in range(len(specs))
    )
    limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
    windows = tuple(
        int(g.kv_cache_spec.sliding_window) if isinstance(g.kv_cache_spec, SlidingWindowSpec) else 0
        for g in manager.kv_cache_config.kv_cache_groups
    )
    chunks = tuple(
        int(g.kv_cache_spec.attention_chunk_size) if isinstance(g.kv_cache_spec, ChunkedLocalAttentionSpec) else 0
        for g in manager.kv_cache_config.kv_cache_groups
    )
    return {"index_hold": held, "hit_alignment": alignment, "hit_limit": limit, "hit_windows": windows,
            "hit_chunks": chunks, "hit_drops": _drops(manager, alignment)}
