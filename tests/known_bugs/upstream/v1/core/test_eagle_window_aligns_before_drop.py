# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Under an EAGLE drafter, a sliding-window group on blocks finer than the
hit alignment must drop the EAGLE block before it rounds to the alignment.

Claim: the joint prefix hit is the longest aligned prefix every group
serves with its EAGLE block dropped; here 8 tokens.

Broken on 0.33.0 (bug id eagle-window-aligns-before-drop), a missed hit:
full attention on 8-token blocks beside a sliding window of 64 tokens on
4-token blocks, so the hit alignment is 8. r0's 17 tokens leave full
attention's blocks [0, 16) and the window's [0, 16) cached. For r1 (r0's
17 tokens and 4 more) full attention reaches 16 and drops to 8; the window
group, asked for 8 plus its 4-token margin, finds fewer blocks than its
window needs and falls back to the run from token 0 (12 tokens); it rounds
that down to the alignment (8), then drops the EAGLE block (4), then rounds
again: 0. Dropping first gives 8, which the window and the EAGLE proof
serve. A whole alignment unit is recomputed on every prompt shorter than
the window. An 8-token window (its search finds a full run) hits 8 (the
control).

Upstream: no report found (vLLM's comment on that code names hybrid models
whose groups have different page sizes, Gemma 4, as where it arises).
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


def _second_hit(sliding_window: int) -> int:
    init_none_hash(sha256)
    kv_cache_config = KVCacheConfig(
        num_blocks=65,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["full"],
                FullAttentionSpec(
                    block_size=8, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            ),
            KVCacheGroupSpec(
                ["window"],
                SlidingWindowSpec(
                    block_size=4,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=sliding_window,
                ),
            ),
        ],
    )
    manager = make_kv_cache_manager(
        kv_cache_config,
        max_model_len=128,
        enable_caching=True,
        hash_block_size=4,
        use_eagle=True,
    )
    r0 = make_request("r0", list(range(17)), 4, sha256)
    manager.allocate_slots(r0, 17)  # r0's prompt: blocks [0, 16) of both groups cached
    manager.free(r0)

    r1 = make_request("r1", list(range(21)), 4, sha256)
    _, num_hit_tokens, _ = manager.get_computed_blocks(r1)
    return num_hit_tokens


def test_window_longer_than_the_prefix_serves_the_hit():
    num_hit_tokens = _second_hit(sliding_window=64)
    assert num_hit_tokens == 8, (
        f"r1 (21 tokens, the first 17 r0's) hits {num_hit_tokens} tokens: full "
        f"attention (8-token blocks) serves 16 and drops its EAGLE block to 8, "
        f"the 64-token window (4-token blocks) holds [0, 16), but it rounds its "
        f"run of 12 down to 8 before dropping the EAGLE block, then to 0"
    )


def test_window_whose_search_finds_its_run_serves_the_hit():
    assert _second_hit(sliding_window=8) == 8
