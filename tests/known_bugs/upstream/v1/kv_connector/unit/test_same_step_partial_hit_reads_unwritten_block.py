# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A sub-block prefix hit must copy its tail from a block that already holds
the hit's tokens.

Claim: a copy-on-write copy of a step (kv_cache_block_copies) reads only
tokens earlier steps wrote; the model runner applies a step's copies before
start_load_kv and the forward pass.

Broken on 0.33.0 (bug id same-step-partial-hit-reads-unwritten-block): full
attention + Mamba ("align"), 6-token blocks hashed every token. f leaves the
Mamba state at 25 cached; a and b (28 tokens, the same prompt) arrive together
and the connector holds [24, 27). a drops its 25-token local hit's tail for
the longer synchronous load and computes from 27 in a fresh block for
[24, 30), which allocate_slots caches at once under the sub-block hash at 27,
before the load fills it. b's lookup in the same step hits 27 there (full
attention) and 25 (Mamba, an older block, so MambaManager does not defer b);
the connector adds nothing past b's tail, the hit is reconciled to 25, and b
copies [24, 25) out of a's block, which holds nothing yet: b computes from KV
that is not its prompt's. One step later the copy reads the landed load (the
control). Same root cause as same-step-cow-chain, whose source is a copy's
destination.

Upstream: no report found.
"""

import dataclasses

import pytest

from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

from .utils import (
    create_model_runner_output,
    create_request,
    create_scheduler,
    create_vllm_config,
    make_kv_cache_config,
)

pytestmark = pytest.mark.cpu_test


def _step_admitting_b(b_arrives_with_a: bool):
    vllm_config = create_vllm_config(
        kv_connector="MockKVConnector",
        kv_role="kv_both",
        block_size=6,
        kv_connector_extra_config={
            "matched_tokens": 0,
            "is_async": False,
            "supports_divergent_local_hybrid_hits": True,
        },
    )
    vllm_config.cache_config.mamba_cache_mode = "align"
    register_all_kvcache_specs(vllm_config)
    kv_cache_config = make_kv_cache_config(
        block_size=6, mamba_enabled=True, num_blocks=40, mamba_cache_mode="align"
    )
    scheduler = create_scheduler(
        vllm_config, kv_cache_config=kv_cache_config, hash_block_size=1
    )

    # f stays running: MockKVConnector (no SupportsHMA) refuses to finish a
    # request on a hybrid layout. Steps 1-3: [0, 24), then 24 and 25.
    f = create_request(request_id=1, num_tokens=26, common_prefix_len=26, block_size=1)
    scheduler.add_request(f)
    for _ in range(3):
        out = scheduler.schedule()
        output = create_model_runner_output([f])
        if f.num_computed_tokens < 26:
            output.sampled_token_ids = [[]]  # a prefill chunk samples nothing
        scheduler.update_from_output(out, output)
    assert f.num_computed_tokens == 26

    # From now on the connector holds [24, 27) of every prompt.
    config = dataclasses.replace(scheduler.connector.config, matched_tokens=3)
    scheduler.connector.config = config
    a, b = (
        create_request(request_id=i, num_tokens=28, common_prefix_len=28, block_size=1)
        for i in (2, 3)
    )
    scheduler.add_request(a)
    if not b_arrives_with_a:
        out = scheduler.schedule()  # step 4: a alone
        scheduler.update_from_output(out, create_model_runner_output([f, a]))
    scheduler.add_request(b)
    a_written = a.num_computed_tokens
    out = scheduler.schedule()  # the step admitting b
    b_hit = b.num_computed_tokens - out.num_scheduled_tokens[b.request_id]
    a_attention = scheduler.kv_cache_manager.get_block_ids(a.request_id)[0]
    b_attention = scheduler.kv_cache_manager.get_block_ids(b.request_id)[0]
    copies = {(c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies}
    # b's hit ends in its block for [24, 30), copied out of a's.
    assert (a_attention[4], b_attention[4]) in copies, copies
    return a_written, b_hit, a_attention[4]


def test_partial_hit_admitted_with_a_sync_load_copies_written_tokens():
    a_written, b_hit, source = _step_admitting_b(b_arrives_with_a=True)
    assert a_written >= b_hit, (
        f"step 4: b's {b_hit}-token hit copies [24, {b_hit}) out of block "
        f"{source}, a's block for [24, 30), but a had written {a_written} tokens "
        f"when step 4 began: a's synchronous load of [24, 27) fills the block in "
        f"step 4, after the model runner has run b's copy"
    )


def test_partial_hit_admitted_after_the_load_copies_written_tokens():
    a_written, b_hit, _ = _step_admitting_b(b_arrives_with_a=False)
    assert (a_written, b_hit) == (28, 25)  # step 4 loaded [24, 27), computed 27
