# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A partial (sub-block) prefix-cache entry's BlockStored event must name a
parent that an earlier event announced.

Claim (KV events on): every BlockStored names as parent_block_hash either
None or a key some earlier BlockStored carried, so a router that keeps a
replica's blocks as a tree of prefixes can place every block.

Broken on 0.33.0 (bug id partial-event-names-unannounced-parent): with
fine-grained hash hits (Mamba in align mode, hash unit 4 finer than the
16-token blocks), a prompt ending inside a block past a hash boundary is
cached as one partial entry at its last hash boundary L (28 for 30
tokens). Its BlockStored carries the last hash unit's tokens and names as
parent the request's fine-grained hash at L - 4 = 24; 24 is not a block
boundary, nothing is filed under that key and no event announced it. A
prompt of 21 tokens (partial entry at 20, parent the full block's key at
16) is chained (the control).

Upstream: vllm-project/vllm issue 58119
(https://github.com/vllm-project/vllm/issues/58119) came first; PR 58121
adds the skipped ancestry to the event.
"""

import pytest

from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import BlockStored
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, new_kv_cache_spec, new_mamba_spec

pytestmark = pytest.mark.cpu_test


def _events_of_one_prompt(num_tokens: int) -> list[BlockStored]:
    vllm_config = create_scheduler(
        enable_prefix_caching=True, max_num_batched_tokens=64
    ).vllm_config
    vllm_config.cache_config.mamba_cache_mode = "align"
    vllm_config.kv_events_config = KVEventsConfig(
        enable_kv_cache_events=True, publisher="null"
    )
    # Full attention + Mamba, both of 16-token blocks, hashed every 4 tokens.
    kv_cache_config = KVCacheConfig(
        num_blocks=33,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["attn"], new_kv_cache_spec(block_size=16)),
            KVCacheGroupSpec(
                ["mamba"],
                new_mamba_spec(
                    block_size=16, mamba_cache_mode="align", num_speculative_blocks=0
                ),
            ),
        ],
    )
    scheduler = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=16,
        hash_block_size=4,
        log_stats=True,
    )
    assert scheduler.kv_cache_manager.coordinator.enable_partial_hash_hits
    (request,) = create_requests(1, num_tokens=num_tokens, block_size=4)
    scheduler.add_request(request)
    events = []
    # Steps 1-3: chunks end at the block's end (16), then at the last hash
    # boundary (28 of 30, 20 of 21), then at the prompt's end.
    for _ in range(3):
        out = scheduler.schedule()
        events += scheduler.kv_cache_manager.take_events()
        output = create_model_runner_output([request])
        if request.num_computed_tokens < num_tokens:
            output.sampled_token_ids = [[]]  # a prefill chunk samples nothing
        scheduler.update_from_output(out, output)
    assert request.num_computed_tokens == num_tokens
    return [e for e in events if isinstance(e, BlockStored)]


def _unannounced(events: list[BlockStored]) -> list[BlockStored]:
    announced, orphans = set(), []
    for event in events:
        if (
            event.parent_block_hash is not None
            and event.parent_block_hash not in announced
        ):
            orphans.append(event)
        announced.update(event.block_hashes)
    return orphans


def test_partial_entry_past_a_hash_unit_names_an_announced_parent():
    events = _events_of_one_prompt(30)
    orphans = _unannounced(events)
    assert not orphans, (
        f"a 30-token prompt (16-token blocks, hash unit 4) published "
        f"{[(len(e.token_ids), e.block_size) for e in events]} (tokens, block size) "
        f"per BlockStored; the partial entry at 28 (tokens {orphans[0].token_ids}) "
        f"names parent {orphans[0].parent_block_hash!r}, the key at 24, which no "
        f"earlier event announced"
    )


def test_partial_entry_one_hash_unit_past_a_block_is_chained():
    events = _events_of_one_prompt(21)
    assert len(events) >= 2 and not _unannounced(events)
