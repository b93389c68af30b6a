# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Admitting a request with a synchronous KV-connector load on a Mamba group
("align" mode) must reserve every block the allocation then takes.

Claim: schedule() never raises on a valid state; a request whose blocks do
not fit the free pool waits.

Broken on 0.33.0 (bug id mamba-external-block-undercount):
KVCacheManager.allocate_slots admits when the free blocks cover
get_num_blocks_to_allocate, and MambaManager caps a new request's blocks at
1 (+ a partial hit, + a checkpoint). With external tokens the allocation
takes two: allocate_external_computed_blocks one for the loaded state, then
allocate_new_blocks one for the running state once the scheduled tokens
cross into the next Mamba block. Full attention and Mamba on 8-token blocks,
6 free blocks, a 33-token prompt whose first 32 tokens the connector loads:
the estimate is 5 + 1 = 6, the allocation needs 5 + 2 = 7, and
BlockPool.get_new_blocks raises ValueError inside schedule(): the engine
core dies. A larger pool does not help: the same happens whenever running
requests leave exactly the estimate free. With 7 free blocks the request is
admitted and takes all 7 (the control).

Upstream: https://github.com/vllm-project/vllm/pull/46892
("get_num_blocks_to_allocate provides wrong block count while external cache
hit"), open, not in 0.33.0.
"""

import pytest
import torch

from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)

from .utils import create_request, create_scheduler, create_vllm_config

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 8


def _admit_a_32_token_sync_load(num_free_blocks: int):
    vllm_config = create_vllm_config(
        kv_connector="MockKVConnector",
        kv_role="kv_both",
        block_size=BLOCK_SIZE,
        kv_connector_extra_config={"matched_tokens": 32, "is_async": False},
    )
    vllm_config.cache_config.mamba_cache_mode = "align"
    register_all_kvcache_specs(vllm_config)
    attention = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    mamba = MambaSpec(
        block_size=BLOCK_SIZE,
        shapes=((1,), (1,)),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_free_blocks + 1,  # block 0 is the null block
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["attn"], attention),
            KVCacheGroupSpec(["mamba"], mamba),
        ],
    )
    scheduler = create_scheduler(vllm_config, kv_cache_config=kv_cache_config)
    request = create_request(
        request_id=1, num_tokens=33, max_tokens=1, block_size=BLOCK_SIZE
    )
    scheduler.add_request(request)
    try:
        # Step 1: load [0, 32) synchronously, compute token 32. Full attention
        # needs ceil(33 / 8) = 5 blocks; Mamba one for the loaded state at 32
        # and one for the running state past it: 7 blocks.
        out = scheduler.schedule()
    except ValueError as exc:
        out = exc
    return scheduler, request, out


def test_sync_external_load_into_a_pool_one_block_short_waits():
    scheduler, request, out = _admit_a_32_token_sync_load(num_free_blocks=6)
    assert not isinstance(out, ValueError), (
        f"step 1: schedule() raised ValueError ({out}) admitting request "
        f"{request.request_id} (33 tokens, 32 loaded by the connector): it needs "
        f"5 full-attention blocks and 2 Mamba blocks (the loaded state at 32 and "
        f"the running state), 7 > 6 free, but the admission estimate counts 1 "
        f"Mamba block (6) and admits it"
    )
    assert out.num_scheduled_tokens == {}
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 6


def test_sync_external_load_into_a_pool_that_fits_takes_seven_blocks():
    scheduler, request, out = _admit_a_32_token_sync_load(num_free_blocks=7)
    assert out.num_scheduled_tokens == {request.request_id: 1}
    attention_ids, mamba_ids = scheduler.kv_cache_manager.get_block_ids(
        request.request_id
    )
    assert len(attention_ids) == 5
    # [null, null, null, the loaded state at 32, the running state]
    assert mamba_ids[:3] == [0, 0, 0] and 0 not in mamba_ids[3:]
    assert len(mamba_ids) == 5
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 0
