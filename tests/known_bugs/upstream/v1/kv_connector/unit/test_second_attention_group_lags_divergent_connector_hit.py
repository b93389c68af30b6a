# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A connector taking divergent local hybrid hits must not crash schedule()
when a second full-attention group lags the first.

Claim: schedule() never raises on a valid state; a request whose groups
hold different cached prefixes is admitted with a hit every group serves.

Broken on 0.33.0 (bug id second-attention-group-lags-divergent-connector-hit):
with supports_divergent_local_hybrid_hits, get_computed_blocks_for_connector
looks every group up on its own and reports the hit of the first
full-attention group as the local prefix; a shorter group only sets
hit_diverged, on the premise that the lagging group is Mamba's. A second
full-attention group (another block size, MLA, a hidden-state cache) can
lag too: the pool evicts each group's blocks on its own. Here group 0
(block 4) holds 13 blocks of the prompt and group 2 (block 16) none: the
local hit is 52 with group 2 empty. With external tokens hit_diverged does
not fall back, the tail branch truncates to the block-aligned 48, and
truncate_computed_blocks asserts num_blocks <= len(group_blocks) for group
2 (3 > 0): the engine core dies. A connector without the capability
reconciles every group (the control).

Upstream: no report found.
"""

import dataclasses
import traceback

import pytest
import torch

from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)

from .utils import (
    create_model_runner_output,
    create_request,
    create_scheduler,
    create_vllm_config,
)

pytestmark = pytest.mark.cpu_test


def _readmit_with_group_2_evicted(divergent_hits: bool):
    vllm_config = create_vllm_config(
        kv_connector="MockKVConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "matched_tokens": 0,
            "is_async": False,
            "supports_divergent_local_hybrid_hits": divergent_hits,
        },
    )
    vllm_config.cache_config.mamba_cache_mode = "align"
    register_all_kvcache_specs(vllm_config)

    def attention(block_size):
        return FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
        )

    mamba = MambaSpec(
        block_size=4,
        shapes=((1,), (1,)),
        dtypes=(torch.float32, torch.float32),
        mamba_cache_mode="align",
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["attn4"], attention(4)),
            KVCacheGroupSpec(["mamba"], mamba),
            KVCacheGroupSpec(["attn16"], attention(16)),
        ],
    )
    scheduler = create_scheduler(
        vllm_config, kv_cache_config=kv_cache_config, hash_block_size=1
    )

    # r0 stays running: MockKVConnector (no SupportsHMA) refuses to finish a
    # request on a hybrid layout.
    r0 = create_request(
        request_id=1, num_tokens=64, common_prefix_len=64, max_tokens=8, block_size=1
    )
    scheduler.add_request(r0)
    for _ in range(2):  # steps 1-2: r0 computes its 64 tokens (48, then 16), cached
        out = scheduler.schedule()
        output = create_model_runner_output([r0])
        if r0.num_computed_tokens < 64:
            output.sampled_token_ids = [[]]  # a prefill chunk samples nothing
        scheduler.update_from_output(out, output)
    attn4, mamba_ids, attn16 = scheduler.kv_cache_manager.get_block_ids(r0.request_id)
    assert len(attn4) == 16 and len(attn16) == 4
    # The pool evicts each group on its own: groups 1 and 2 lose all their
    # blocks of the prompt, group 0 those past 52.
    scheduler.kv_cache_manager.block_pool.evict_blocks(
        set(attn4[13:]) | set(mamba_ids) | set(attn16)
    )

    # From now on the connector holds [48, 63) of the prompt.
    scheduler.connector.config = dataclasses.replace(
        scheduler.connector.config, matched_tokens=15
    )
    r2 = create_request(
        request_id=2, num_tokens=64, common_prefix_len=64, max_tokens=1, block_size=1
    )
    scheduler.add_request(r2)
    try:
        out2 = scheduler.schedule()  # step 2: r2's admission
    except AssertionError as exc:
        out2 = traceback.extract_tb(exc.__traceback__)[-1]  # where vLLM asserted
    return r2, out2


def test_lagging_second_attention_group_with_divergent_hits():
    r2, out2 = _readmit_with_group_2_evicted(divergent_hits=True)
    assert not isinstance(out2, traceback.FrameSummary), (
        f"step 2: schedule() raised AssertionError in {out2.name} "
        f"({out2.line}) admitting request "
        f"{r2.request_id}: group 0 (block 4) hits 52 tokens, group 2 (block 16) "
        f"holds none of them; truncated to 48, truncate_computed_blocks needs 3 "
        f"blocks of group 2 and finds 0"
    )


def test_lagging_second_attention_group_reconciled_without_divergent_hits():
    r2, out2 = _readmit_with_group_2_evicted(divergent_hits=False)
    assert r2.request_id in out2.num_scheduled_tokens
