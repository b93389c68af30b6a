"""Repro: truncate_computed_blocks violates 'no-unexpected-failure'.

Found and shrunk by the kvtrunc-fuzz property suite.

vLLM version: 0.27.1
target: fuzz/targets/target_truncate.py::fuzz_truncate_hybrid
seed: derandomized (ci profile), generated-only
invariant: no-unexpected-failure
violation: [no-unexpected-failure] the call raised although every must-cover group covers endpoint 1 and it is aligned; short whole-state groups: group 1 (MambaSpec, block_size=1) holds 0 < 1

Scenario (as drawn):
    TruncationScenario(Layout([FullAttentionSpec(block_size=1), MambaSpec(block_size=1),
    ChunkedLocalAttentionSpec(block_size=1, attention_chunk_size=1)], hash_block_size=1,
    num_blocks=10), prompts=[(1, 1)], chunk=None, evict_from=[None, None, None], replay=(1,
    1), lookup='per_group', endpoint=EndpointRule(anchor='cover_hit', steps=0, remainder=0))
"""

import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.request import Request

SPECS = [
    FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=1, dtype=torch.float32),
    MambaSpec(block_size=1, shapes=((1,), (1,)), dtypes=(torch.float32, torch.float32), mamba_cache_mode="align"),
    ChunkedLocalAttentionSpec(block_size=1, num_kv_heads=1, head_size=1, dtype=torch.float32, attention_chunk_size=1),
]
HASH_BLOCK_SIZE = 1
SCHEDULER_BLOCK_SIZE = 1  # LCM of the group block sizes
NUM_BLOCKS = 10
MAX_MODEL_LEN = 1024
PREFILL_CHUNK = None
PROMPTS = [
    [0, 10000],
]
REPLAY = [0, 9000]
EVICT_FROM = [None, None, None]
ENDPOINT = 1


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
    return KVCacheManager(
        config,
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        enable_caching=True,
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
    coordinator = manager.coordinator
    limit = request.num_tokens - 1
    if hasattr(coordinator, "find_longest_cache_hit_per_group"):
        blocks, _ = coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)
    else:
        blocks = coordinator.find_longest_cache_hit(request.block_hashes, limit)[0]
    return manager.create_kv_cache_blocks(tuple(blocks))


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

    blocks = _per_group_hit(manager, replay)
    before = [[(id(b), b.block_id, b.ref_cnt, b.block_hash) for b in g] for g in blocks.blocks]
    free_before = manager.block_pool.get_num_free_blocks()
    # Attention-like groups return ENDPOINT // block_size blocks, Mamba
    # groups min(that, what they hold), scratch groups none:
    #   group 0 FullAttentionSpec: block 1, 1 in, expect 1
    #   group 1 MambaSpec: block 1, 0 in, expect 0
    #   group 2 ChunkedLocalAttentionSpec: block 1, 1 in, expect 1
    result = manager.truncate_computed_blocks(blocks, ENDPOINT)
    assert [len(g) for g in result.blocks] == [1, 0, 1]
    for got, given in zip(result.blocks, blocks.blocks):
        assert all(a is b for a, b in zip(got, given))  # a prefix view

    # The input view is untouched: same blocks, refcounts and hashes; no pool change.
    after = [[(id(b), b.block_id, b.ref_cnt, b.block_hash) for b in g] for g in blocks.blocks]
    assert after == before
    assert manager.block_pool.get_num_free_blocks() == free_before
