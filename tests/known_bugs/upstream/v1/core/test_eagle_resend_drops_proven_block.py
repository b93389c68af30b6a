# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Under an EAGLE drafter, a one-group cache must keep the same prefix hit on
a resent block-aligned prompt as the hybrid coordinator does.

Claim: the drafter writes a hit's last position's KV with the token after
it, so a lookup keeps a last block only when the index holds the block
after it under the request's own chain. A 12-token prompt on 4-token
blocks sent again holds all three blocks: the hit is 8 (block 3 proves
block 2).

Broken on 0.33.0 (bug id eagle-resend-drops-proven-block), a missed hit:
HybridKVCacheCoordinator looks one drop unit past the candidate length (up
to the request's hashed length, past num_tokens - 1) and drops only what
the block after does not prove. UnitaryKVCacheCoordinator (one KV-cache
group) looks no further than num_tokens - 1 and drops the last block it
found: for a prompt of whole blocks the last block is never looked at, and
the hit is 4. The same cache as full attention beside a sliding window
(the hybrid coordinator) hits 8 (the control). Nothing wrong is read; the
extra block is recomputed.

Upstream: no report found (vllm-project/vllm issue 50438,
https://github.com/vllm-project/vllm/issues/50438, proposes keys that would
prove the kept block's draft KV).
"""

import pytest
import torch

from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

from .test_prefix_caching import make_kv_cache_manager, make_request

pytestmark = pytest.mark.cpu_test

FULL = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
WINDOW = SlidingWindowSpec(
    block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=8
)


def _resent_hit(*specs) -> int:
    init_none_hash(sha256)
    groups = [KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)]
    kv_cache_config = KVCacheConfig(
        num_blocks=65, kv_cache_tensors=[], kv_cache_groups=groups
    )
    manager = make_kv_cache_manager(
        kv_cache_config,
        max_model_len=128,
        enable_caching=True,
        hash_block_size=4,
        use_eagle=True,
    )
    first = make_request("first", list(range(12)), 4, sha256)
    manager.allocate_slots(first, 12)  # blocks [0, 4), [4, 8), [8, 12) cached
    manager.free(first)

    again = make_request("again", list(range(12)), 4, sha256)
    _, num_hit_tokens, _ = manager.get_computed_blocks(again)
    return num_hit_tokens


def test_single_group_keeps_the_block_the_next_one_proves():
    num_hit_tokens = _resent_hit(FULL)
    assert num_hit_tokens == 8, (
        f"the same 12-token prompt sent again on one full-attention group "
        f"(4-token blocks, EAGLE) hits {num_hit_tokens} tokens: the index holds "
        f"the blocks ending at 4, 8 and 12, and the block ending at 12 proves the "
        f"one ending at 8, but the unitary coordinator looks only up to token 11"
    )


def test_hybrid_coordinator_keeps_the_block_the_next_one_proves():
    assert _resent_hit(FULL, WINDOW) == 8
