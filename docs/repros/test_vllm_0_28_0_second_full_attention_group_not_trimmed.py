"""Repro: get_computed_blocks returns blocks past the hit for a second full-attention group.

Found by the kvtrunc-fuzz scheduler tier (fuzz_scheduler_single_shot, invariant
'computed-adds-up') while running the release matrix on vLLM 0.28.0, then
reduced by hand to the KV cache manager alone.

vLLM version: 0.28.0 (fails); 0.29.0 and later pass.
invariant: every group's lookup result holds exactly the blocks of the hit
(``cdiv(num_computed_tokens, block_size)`` for full attention).
violation: ``get_computed_blocks`` reports 0 computed tokens but the second
full-attention group (block 4) still carries 2 cached blocks; the scheduler
then adopts them (``allocate_slots(num_new_computed_tokens=0,
new_computed_blocks=...)``) and the block table of that group starts with two
prefix-cache blocks whose tokens are recomputed or loaded again.

Cause: ``HybridKVCacheCoordinator.find_longest_cache_hit`` (0.28.0,
vllm/v1/core/kv_cache_coordinator.py:749) trims only the *first* attention
group's blocks to the final hit length ("Truncate full attention blocks to
final hit_length"). Full-attention groups with different block sizes are
separate attention groups, so the second one keeps the blocks of its own,
longer, hit. vLLM 0.29.0 trims every full-attention group ("Truncate every
full-attention group (target and draft) blocks to final hit_length").

Layout: FullAttention(block 8), Mamba(block 4, align), FullAttention(block 4),
hash block 1, scheduler block 8. A 16-token prompt is cached; the replay is
its first 15 tokens. Per-group hits are (8, 0, 12): Mamba has no state inside
the replay, so the joint hit is 0.
"""

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
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.request import Request

SPECS = [
    FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=1, dtype=torch.float32),
    MambaSpec(block_size=4, shapes=((1,), (1,)), dtypes=(torch.float32, torch.float32), mamba_cache_mode="align"),
    FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32),
]
HASH_BLOCK_SIZE = 1
SCHEDULER_BLOCK_SIZE = 8  # LCM of the group block sizes
NUM_BLOCKS = 23
PROMPT = list(range(100, 116))  # 16 tokens
REPLAY = PROMPT[:15]


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
        kv_cache_groups=[KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(SPECS)],
    )
    return KVCacheManager(
        generate_scheduler_kv_cache_config([config]),
        max_model_len=1024,
        scheduler_block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        enable_caching=True,
    )


def test_joint_hit_trims_every_full_attention_group():
    init_none_hash(sha256)
    manager = _make_manager()

    # Cache the prompt the way the scheduler does, then free it.
    prompt = _make_request("prompt", PROMPT)
    blocks, num_hit, _ = manager.get_computed_blocks(prompt)
    assert manager.allocate_slots(prompt, prompt.num_tokens, num_hit, blocks) is not None
    prompt.num_computed_tokens = prompt.num_tokens
    manager.new_step_starts()
    manager.free(prompt)
    manager.new_step_starts()

    replay = _make_request("replay", REPLAY)
    _, per_group_hits = manager.coordinator.find_longest_cache_hit_per_group(
        replay.block_hashes, replay.num_tokens - 1
    )
    assert tuple(per_group_hits) == (8, 0, 12)  # the groups disagree

    blocks, num_computed, _ = manager.get_computed_blocks(replay)
    assert num_computed == 0  # Mamba has no state inside the replay
    # Each full-attention group holds exactly the blocks of the joint hit:
    # cdiv(0, 8) == cdiv(0, 4) == 0. vLLM 0.28.0 returns [[], [], [b4, b5]].
    assert [len(g) for g in blocks.blocks] == [0, 0, 0], [
        [b.block_id for b in g] for g in blocks.blocks
    ]
