# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A Mamba block cached as the state at a block boundary must hold that
state, also with prefill checkpoints (Mamba2).

Claim (align mode): "slot p holds the state after exactly (p + 1) *
block_size tokens" (Scheduler._mamba_block_aligned_split): a block is
cached as the state at its end only if the step that passes that end
writes it there, by ending its chunk there or by checkpointing there.

Broken on 0.33.0 (bug id mamba-checkpoint-chunk-skips-boundary-state): with
prefill checkpoint blocks, _mamba_block_aligned_split does not stop a chunk
that starts mid-block at the next block boundary: it takes the worker to
materialise it, but the worker exports one checkpoint per chunk, at the
prefill's last hash boundary (compute_mamba_prefill_checkpoints). Here,
48-token blocks and a 4-token hash unit: a (94 tokens) leaves its state at
92; b (149 tokens, a's first 94 and more) hits 92 and computes [92, 149) in
one chunk (states written at 148 and 149), and the block b resumed in,
holding the state at 92, is cached as the state at 96. A later request
sharing b's first 96 tokens resumes from a state 4 tokens short: silent
corruption. Without checkpoint blocks the chunk stops at 96 (the control).

Upstream: described first in a review comment on vllm-project/vllm PR 54076
(https://github.com/vllm-project/vllm/pull/54076); fix planned in PR 53479
(https://github.com/vllm-project/vllm/pull/53479).
"""

import pytest
import torch

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    get_mamba_prefill_checkpoint_position,
)
from vllm.v1.structured_output import StructuredOutputManager

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, new_kv_cache_spec

pytestmark = pytest.mark.cpu_test


def _resume_mid_block(checkpoint_blocks: int):
    vllm_config = create_scheduler(
        enable_prefix_caching=True,
        block_size=48,
        max_num_batched_tokens=96,
        max_num_seqs=1,
        max_model_len=150,
    ).vllm_config
    vllm_config.cache_config.mamba_cache_mode = "align"
    mamba = MambaSpec(
        block_size=48,
        shapes=((1,), (1,)),
        dtypes=(torch.float32, torch.float32),
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=checkpoint_blocks,
        prefill_checkpoint_alignment=1 if checkpoint_blocks else None,
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=15,
        kv_cache_tensors=[],
        hash_block_size=4,
        kv_cache_groups=[
            KVCacheGroupSpec(["attn"], new_kv_cache_spec(block_size=48)),
            KVCacheGroupSpec(["mamba"], mamba),
        ],
    )
    scheduler = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=48,
        hash_block_size=4,
        log_stats=True,
    )
    (a,) = create_requests(
        1, num_tokens=94, max_tokens=1, same_prompt=True, block_size=4, req_ids=["a"]
    )
    (b,) = create_requests(
        1, num_tokens=149, max_tokens=1, same_prompt=True, block_size=4, req_ids=["b"]
    )
    for request in (a, b):  # a runs to its end first; then b's first chunk
        scheduler.add_request(request)
        while True:
            out = scheduler.schedule()
            start = (
                request.num_computed_tokens
                - out.num_scheduled_tokens[request.request_id]
            )
            _, mamba_table = scheduler.kv_cache_manager.get_block_ids(
                request.request_id
            )
            output = create_model_runner_output([request])
            if request.num_computed_tokens < request.num_tokens:
                output.sampled_token_ids = [[]]  # a prefill chunk samples nothing
            scheduler.update_from_output(out, output)
            if request is b or request.is_finished():
                break
    assert start == 92  # b resumed at a's state at 92, inside its block [48, 96)
    resume_block = mamba_table[1]
    cached = (
        scheduler.kv_cache_manager.block_pool.blocks[resume_block].block_hash
        is not None
    )
    return b.num_computed_tokens, resume_block, cached


def test_chunk_resuming_mid_block_with_checkpoints_writes_the_boundary_state():
    end, resume_block, cached = _resume_mid_block(checkpoint_blocks=1)
    checkpoint = get_mamba_prefill_checkpoint_position(149, 4, drop_eagle_block=False)
    assert not cached or 96 in (end, checkpoint), (
        f"b's chunk [92, {end}) writes Mamba states at {checkpoint} (the prefill "
        f"checkpoint) and {end}, not at 96, yet block {resume_block} (b's Mamba "
        f"table[1], holding the state at 92 it resumed from) is cached as the "
        f"state after 96 tokens"
    )


def test_chunk_resuming_mid_block_without_checkpoints_stops_at_the_boundary():
    end, resume_block, cached = _resume_mid_block(checkpoint_blocks=0)
    assert end == 96 and cached
