# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A failed synchronous load rolled back over a step in flight must leave a
Mamba group a real block for every state its recompute writes.

Claim (Mamba "align" mode, kv_load_failure_policy="recompute", async
scheduling): after the rollback, each chunk of the recompute ends at a
block boundary whose table entry is a real block, never the null block.

Broken on 0.33.0 (bug id mamba-rollback-over-in-flight-step): async
scheduling schedules the step after a synchronous load before the load's
output is fed, and the Mamba manager lays the table out for that chunk: one
state block at its end, the null block at the boundaries inside it (here
[4, 16) in block 1, then [16, 48) with the table [1, null, 2]). The load's
output reports block 1 invalid; _update_requests_with_invalid_blocks sets
num_computed_tokens back to 0, dropping the step in flight too, and leaves
the table as it is. The recompute's chunk [0, 32) ends at the boundary the
table holds as the null block; the table is long enough, so allocate_slots
adds nothing: the state at 32 is written to the null block and read back
from there by [32, 48). Synchronous scheduling lays the recompute out
afresh (the control).

Upstream: no report found.
"""

import pytest
import torch

from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec

from .utils import (
    create_model_runner_output,
    create_request,
    create_scheduler,
    create_vllm_config,
)

pytestmark = pytest.mark.cpu_test


def _recompute_after_a_failed_load(async_scheduling: bool):
    vllm_config = create_vllm_config(
        max_num_batched_tokens=32,
        max_num_seqs=1,
        kv_connector="MockKVConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"matched_tokens": 4, "is_async": False},
        kv_load_failure_policy="recompute",
    )
    vllm_config.cache_config.mamba_cache_mode = "align"
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    register_all_kvcache_specs(vllm_config)
    mamba = MambaSpec(
        block_size=16,
        shapes=((1,), (1,)),
        dtypes=(torch.float32, torch.float32),
        mamba_cache_mode="align",
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=10,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["mamba"], mamba)],
    )
    scheduler = create_scheduler(vllm_config, kv_cache_config=kv_cache_config)
    request = create_request(num_tokens=52, max_tokens=1)
    rid = request.request_id
    scheduler.add_request(request)

    out1 = scheduler.schedule()  # step 1: load [0, 4), compute [4, 16)
    (load_table,) = scheduler.kv_cache_manager.get_block_ids(rid)
    in_flight = [out1]
    if async_scheduling:
        # Step 2, before step 1's output: [16, 48).
        in_flight.append(scheduler.schedule())
    # Step 1's output reports the load's block invalid: back to 0.
    for out in in_flight:
        output = create_model_runner_output(
            [request], invalid_block_ids={load_table[0]} if out is out1 else None
        )
        output.sampled_token_ids = [[]]  # prefill chunks sample nothing
        scheduler.update_from_output(out, output)
    assert request.num_computed_tokens == 0
    out3 = scheduler.schedule()  # the recompute's first chunk: [0, 32)
    assert out3.num_scheduled_tokens == {rid: 32}
    (table,) = scheduler.kv_cache_manager.get_block_ids(rid)
    return request, load_table, table


def test_async_rollback_over_a_step_in_flight_keeps_a_state_block():
    request, load_table, table = _recompute_after_a_failed_load(async_scheduling=True)
    # The recompute's chunk [0, 32) writes the state at 32 into table[1].
    assert table[1] != 0, (
        f"request {request.request_id}: step 1's load into block {load_table[0]} "
        f"failed while step 2 ([16, 48)) was in flight; the recompute of [0, 32) "
        f"keeps the table {table} laid out for step 2, so the state at 32 goes to "
        f"table[1], the null block, and [32, 48) reads it from there"
    )


def test_sync_rollback_lays_the_recompute_out_afresh():
    request, load_table, table = _recompute_after_a_failed_load(async_scheduling=False)
    assert table[1] != 0
