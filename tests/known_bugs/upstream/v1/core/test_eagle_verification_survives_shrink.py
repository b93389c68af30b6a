# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Under an EAGLE drafter, a sliding-window group must keep a last block only
where the entry after it proves it, also after another group shrinks the hit.

Claim: the drafter writes a hit's last position's KV with the token after
it, so a group keeps a last block only where its index holds the next entry
under the request's own chain; the joint hit is the longest prefix every
group serves that way.

Broken on 0.33.0 (bug id eagle-verification-survives-shrink), a hit longer
than the rule allows: HybridKVCacheCoordinator.find_longest_cache_hit
verifies each dropping group once per candidate length (eagle_verified): a
lookup with the drop adds the group, only a lookup without it that shrinks
the length clears the set. With no group flagged as holding draft layers
every group drops, Mamba included; the Mamba finder takes no margin and
never drops, so its shrink is a lookup "with the drop" and clears nothing.
Full attention, an 8-token window and Mamba on 4-token blocks; r0 caches 24
tokens (Mamba states at 8 and 24), then the window's entry at 12 is
evicted. For r1 (r0's 24 tokens and 6 more) pass one gives full attention
20, the window 20 (verified), Mamba 8; pass two looks the window up at 8
without the drop and keeps its block [4, 8), whose proof (the entry at 12)
is gone: the hit is 8, the rule allows 0. The drafter may read KV another
request wrote with another next token: worse drafts, not a wrong output.
With the draft groups flagged (Mamba does not drop) the hit is 0 (the
control).

Upstream: no report found (vLLM's comment on eagle_verified cites
https://github.com/vllm-project/vllm/issues/32802 for the once-per-length
verification; vLLM warns about unflagged EAGLE drafters on Mamba models).
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
    SlidingWindowSpec,
)

from .test_prefix_caching import make_kv_cache_manager, make_request

pytestmark = pytest.mark.cpu_test


def _hit_after_the_windows_entry_at_12_is_evicted(flag_draft_groups: bool):
    init_none_hash(sha256)
    full = FullAttentionSpec(
        block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    window = SlidingWindowSpec(
        block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=8
    )
    mamba = MambaSpec(
        block_size=4,
        shapes=((1,), (1,)),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=97,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], full, is_eagle_group=flag_draft_groups),
            KVCacheGroupSpec(["window"], window, is_eagle_group=flag_draft_groups),
            KVCacheGroupSpec(["mamba"], mamba),
        ],
    )
    manager = make_kv_cache_manager(
        kv_cache_config,
        max_model_len=128,
        enable_caching=True,
        hash_block_size=4,
        use_eagle=True,
    )
    r0 = make_request("r0", list(range(24)), 4, sha256)
    manager.allocate_slots(r0, 8)  # chunk [0, 8): Mamba caches its state at 8
    r0.num_computed_tokens = 8
    manager.allocate_slots(r0, 16)  # chunk [8, 24): Mamba caches its state at 24
    _, window_blocks, _ = manager.get_block_ids("r0")
    manager.free(r0)
    # Window block 2 holds [8, 12): the entry at 12, which proves block [4, 8).
    manager.evict_blocks({window_blocks[2]})

    r1 = make_request("r1", list(range(24)) + list(range(900, 906)), 4, sha256)
    blocks, num_hit_tokens, _ = manager.get_computed_blocks(r1)
    return num_hit_tokens, blocks.get_block_ids()[1], window_blocks[2]


def test_window_group_keeps_only_a_block_the_next_entry_proves():
    num_hit_tokens, hit_window_blocks, evicted = (
        _hit_after_the_windows_entry_at_12_is_evicted(flag_draft_groups=False)
    )
    assert num_hit_tokens == 0, (
        f"r1 (30 tokens, the first 24 r0's) hits {num_hit_tokens} tokens: the "
        f"window group keeps blocks {hit_window_blocks}, the last one [4, 8), "
        f"whose proof, its entry at 12 (block {evicted}), was evicted; verified "
        f"at 20, the window is looked up again at 8 without the drop after "
        f"Mamba shrinks the hit"
    )


def test_flagged_draft_groups_keep_only_proven_blocks():
    num_hit_tokens, _, _ = _hit_after_the_windows_entry_at_12_is_evicted(
        flag_draft_groups=True
    )
    assert num_hit_tokens == 0
