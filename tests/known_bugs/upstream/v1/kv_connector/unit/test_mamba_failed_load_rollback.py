# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A failed synchronous KV load on a Mamba group ("align" mode) must roll the
request back to a point where a Mamba state exists.

Claim (kv_load_failure_policy="recompute"): after invalid_block_ids, the
request resumes at a token whose state its blocks hold (here the load's
start, 0), never past a null block.

Broken on 0.33.0 (bug id mamba-failed-load-rollback):
_update_requests_with_invalid_blocks walks the request's block table and
sets num_computed_tokens = idx * block_size at the first invalid block,
right for attention, where block k holds the KV of tokens [k*B, (k+1)*B).
A Mamba group holds no KV per block: after a load of [0, 48) with block
size 16 its table is [null, null, S, R] (S the loaded state at 48, R the
running state), the connector can report only S invalid, the walk skips the
null blocks and the request resumes at 32, where no state exists. The
worker keeps reading the state block it last wrote, so tokens 32-63 are
recomputed from a corrupt state: silent wrong output. The same walk on full
attention is right (the control).

Upstream: no report found.
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

from .utils import (
    create_model_runner_output,
    create_request,
    create_scheduler,
    create_vllm_config,
)

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 16


def _failed_load_of_the_state(spec):
    vllm_config = create_vllm_config(
        kv_connector="MockKVConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"matched_tokens": 48, "is_async": False},
        kv_load_failure_policy="recompute",
    )
    vllm_config.cache_config.mamba_cache_mode = "align"
    register_all_kvcache_specs(vllm_config)
    kv_cache_config = KVCacheConfig(
        num_blocks=100,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    scheduler = create_scheduler(vllm_config, kv_cache_config=kv_cache_config)
    request = create_request(num_tokens=64, max_tokens=1)
    scheduler.add_request(request)

    out1 = scheduler.schedule()  # step 1: load [0, 48) synchronously, compute [48, 64)
    assert out1.num_scheduled_tokens == {request.request_id: 16}
    (table,) = scheduler.kv_cache_manager.get_block_ids(request.request_id)
    # Block 2 holds the loaded tokens [32, 48) (attention) or the state at 48 (Mamba).
    scheduler.update_from_output(
        out1, create_model_runner_output([request], invalid_block_ids={table[2]})
    )
    return request, table


def test_failed_sync_load_on_mamba_resumes_where_a_state_exists():
    spec = MambaSpec(
        block_size=BLOCK_SIZE,
        shapes=((1,), (1,)),
        dtypes=(torch.float32, torch.float32),
        mamba_cache_mode="align",
    )
    request, table = _failed_load_of_the_state(spec)
    assert table[0] == table[1] == 0  # the null block: no state at 16 or 32
    assert request.num_computed_tokens == 0, (
        f"request {request.request_id}: the sync load of [0, 48) failed on Mamba "
        f"block {table[2]} (the state at 48) and the request resumes at "
        f"{request.num_computed_tokens}, but its Mamba table {table} holds no state "
        f"there: entry {request.num_computed_tokens // BLOCK_SIZE - 1} is the null "
        f"block"
    )


def test_failed_sync_load_on_full_attention_resumes_at_its_first_failed_block():
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    request, table = _failed_load_of_the_state(spec)
    assert request.num_computed_tokens == 32  # blocks 0 and 1 hold [0, 32)
