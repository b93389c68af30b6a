# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""With fine-grained hash hits, a full-attention group's cached full block
that spans the joint hit must serve the part of it inside the hit.

Claim: the joint prefix hit is the longest prefix every group can serve:
full attention's KV is append-only, so a cached block's first positions
serve any prefix ending inside it (copied on write, as vLLM's own sub-block
hits are).

Broken on 0.33.0 (bug id full-block-past-hybrid-hit-unused), a missed hit:
full attention on 8-token blocks, Mamba on 4 and full attention on 12, one
token per hash unit (sub-block hits on). r0 leaves the 8-token group's
blocks to 80, Mamba's state at 80 and the 12-token group's blocks to 84
cached. r1 shares r0's first 84 tokens: the hit can end at 80 at most
(where Mamba has its state). The 12-token group holds positions 72-83 of
that prefix in one block (filed under the key at 84), but asked for the key
at 80, a partial entry nothing files, it offers its last whole block (72),
where Mamba has no state, and the joint hit falls to 0: 80 cached tokens
are recomputed. With 16-token blocks the second group holds a block ending
at 80 and the hit is 80 (the control).

Upstream: no report found.
"""

import pytest
import torch

from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)

from .test_prefix_caching import make_kv_cache_manager, make_request

pytestmark = pytest.mark.cpu_test

PROMPT = [7 * i for i in range(86)]


def _hit_inside_a_cached_block(second_block_size: int) -> int:
    init_none_hash(sha256)

    def attention(block_size):
        return FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
        )

    mamba = MambaSpec(
        block_size=4,
        shapes=((1,), (1,)),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=163,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["attn8"], attention(8)),
            KVCacheGroupSpec(["mamba"], mamba),
            KVCacheGroupSpec(["attn2"], attention(second_block_size)),
        ],
    )
    manager = make_kv_cache_manager(
        kv_cache_config, max_model_len=256, enable_caching=True, hash_block_size=1
    )
    r0 = make_request("r0", PROMPT, 1, sha256)
    manager.allocate_slots(r0, 80)  # chunk [0, 80): Mamba caches its state at 80
    r0.num_computed_tokens = 80
    manager.allocate_slots(r0, 6)  # chunk [80, 86)
    manager.free(r0)

    r1 = make_request("r1", PROMPT[:84] + list(range(3128, 3143)), 1, sha256)
    _, num_hit_tokens, _ = manager.get_computed_blocks(r1)
    return num_hit_tokens


def test_cached_full_block_serves_a_hit_inside_it():
    num_hit_tokens = _hit_inside_a_cached_block(12)
    assert num_hit_tokens == 80, (
        f"r1 (r0's first 84 tokens and 15 more) hits {num_hit_tokens} tokens: "
        f"the 8-token group holds [0, 80), Mamba the state at 80, and the 12-token "
        f"group holds [72, 84) in one cached block, which serves [72, 80) of it"
    )


def test_second_group_whose_blocks_end_at_the_hit_serves_it():
    assert _hit_inside_a_cached_block(16) == 80
