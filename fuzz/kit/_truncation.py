"""The standalone repro of a truncate_computed_blocks failure (copied out by
:func:`fuzz.repro.truncation_repro`): prompts cached as the scheduler caches
them, per-group hits made to diverge by eviction, the replay's lookup, and
the truncation call with what it must return."""

from __future__ import annotations

import pytest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

from fuzz.kit._truncation_params import (
    DRAFT_GROUPS,
    DRAFTER_KWARGS,
    ENDPOINT,
    EVICT_FROM,
    EXPECTED_LENGTHS,
    HASH_BLOCK_SIZE,
    HYBRID,
    LOOKUP,
    LOUD_FAILURE,
    MAX_MODEL_LEN,
    NUM_BLOCKS,
    PREFILL_CHUNK,
    PROMPTS,
    REPLAY,
    SCHEDULER_BLOCK_SIZE,
    SPECS,
    USE_EAGLE,
)


def _make_request(request_id, token_ids):
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(HASH_BLOCK_SIZE, sha256),
    )


def _make_manager():
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(SPECS)
        ],
    )
    # What the engine core hands the scheduler.
    config = generate_scheduler_kv_cache_config([config])
    drafter = {}
    if USE_EAGLE:
        # The engine's planning flags the groups holding draft layers.
        for i, group in enumerate(config.kv_cache_groups):
            group.is_eagle_group = i in DRAFT_GROUPS
        drafter = dict(use_eagle=USE_EAGLE, **DRAFTER_KWARGS)
    return KVCacheManager(
        config,
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        enable_caching=True,
        **drafter,
    )


def _prefill_and_free(manager, request, chunk):
    """Cache a prompt the way the scheduler does: allocate chunk by chunk, free."""
    blocks, num_hit, _ = manager.get_computed_blocks(request)
    computed, first = num_hit, True
    while computed < request.num_tokens:
        num_new = min(chunk or request.num_tokens, request.num_tokens - computed)
        new = manager.allocate_slots(
            request, num_new, num_hit if first else 0, blocks if first else None
        )
        if new is None:  # pool exhausted: LRU pressure
            break
        first = False
        computed += num_new
        request.num_computed_tokens = computed
        manager.new_step_starts()
    manager.free(request)
    manager.new_step_starts()


def _per_group_hit(manager, request):
    limit = request.num_tokens - 1
    if HYBRID:  # the hybrid coordinator's per-group lookup
        blocks, _ = manager.coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)
    else:  # one group: the unitary coordinator's joint hit is the group's hit
        blocks = manager.coordinator.find_longest_cache_hit(request.block_hashes, limit)[0]
    return manager.create_kv_cache_blocks(tuple(blocks))


def _lookup(manager, replay):
    """The replay's computed blocks, looked up as LOOKUP says."""
    if LOOKUP == "joint":
        return manager.get_computed_blocks(replay)[0]
    else:
        if LOOKUP == "per_group":
            return _per_group_hit(manager, replay)
        else:
            return manager.get_computed_blocks_for_connector(replay)[0]


def test_truncate_computed_blocks_repro():
    init_none_hash(sha256)
    manager = _make_manager()
    for i, tokens in enumerate(PROMPTS):
        _prefill_and_free(manager, _make_request(f"prompt-{i}", tokens), PREFILL_CHUNK)

    # Diverge the per-group hits: drop each group's cached tail from EVICT_FROM on.
    replay = _make_request("replay", REPLAY)
    victims = set()
    for group, cut in enumerate(EVICT_FROM):
        cached = [b.block_id for b in _per_group_hit(manager, replay).blocks[group] if not b.is_null]
        if cut is not None and cached:
            victims.update(cached[cut % (len(cached) + 1):])
    manager.evict_blocks(victims)

    blocks = _lookup(manager, replay)
    before = [[(id(b), b.block_id, b.ref_cnt, b.block_hash) for b in g] for g in blocks.blocks]
    free_before = manager.block_pool.get_num_free_blocks()
    if LOUD_FAILURE:
        # A must-cover (attention-like) group is short, or the endpoint is
        # misaligned: the call must fail loudly.
        with pytest.raises(AssertionError):
            manager.truncate_computed_blocks(blocks, ENDPOINT)
    else:
        # Attention-like groups return ENDPOINT // block_size blocks, Mamba
        # groups min(that, what they hold), scratch groups none (EXPECTED_LENGTHS).
        result = manager.truncate_computed_blocks(blocks, ENDPOINT)
        assert [len(g) for g in result.blocks] == EXPECTED_LENGTHS
        for got, given in zip(result.blocks, blocks.blocks):
            assert all(a is b for a, b in zip(got, given))  # a prefix view
    # The input view is untouched: same blocks, refcounts and hashes; no pool change.
    after = [[(id(b), b.block_id, b.ref_cnt, b.block_hash) for b in g] for g in blocks.blocks]
    assert after == before
    assert manager.block_pool.get_num_free_blocks() == free_before
