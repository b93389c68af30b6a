# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Blocks whose synchronous KV load failed must leave the prefix cache, also
when their request is aborted while the model runs the loading step.

Claim (kv_load_failure_policy="fail"): after a step reports
invalid_block_ids, no later request takes those blocks as a prefix hit.

Broken on 0.33.0 (bug id
abort-during-failed-sync-load-keeps-invalid-blocks-cached): the engine core
processes a client's abort right before update_from_output
(_process_aborts_queue), so the request is already freed when
_handle_invalid_blocks looks for the failed blocks' owners in self.running
and the async-loading requests only. It finds none and returns before
evict_blocks. The blocks were cached at allocation (a sync load is not
delay_cache_blocks): the next request with the same prefix adopts KV that
was never written. Silent wrong output, no error. Without the abort the
blocks are evicted (the control).

Upstream: no report found.
"""

import pytest

from vllm.v1.request import RequestStatus

from .utils import (
    create_mock_connector,
    create_model_runner_output,
    create_request,
    create_scheduler,
    create_vllm_config,
)

pytestmark = pytest.mark.cpu_test

NUM_TOKENS = 48  # 3 blocks of 16
NUM_EXTERNAL = 32  # blocks 0 and 1 loaded synchronously


def _failed_load_of_the_first_block(abort: bool):
    scheduler = create_scheduler(create_vllm_config(kv_load_failure_policy="fail"))
    scheduler.connector = create_mock_connector()
    scheduler.connector.get_num_new_matched_tokens.side_effect = lambda request, _: (
        (NUM_EXTERNAL, False) if request.request_id == "id-1" else (0, False)
    )
    scheduler.connector.request_finished.return_value = (False, None)
    scheduler.connector.take_events.return_value = ()

    request = create_request(
        request_id=1, num_tokens=NUM_TOKENS, common_prefix_len=NUM_TOKENS
    )
    scheduler.add_request(request)
    out1 = scheduler.schedule()  # step 1: load [0, 32), compute [32, 48)
    (block_ids,) = out1.scheduled_new_reqs[0].block_ids
    invalid = block_ids[0]
    if abort:  # the client aborts while the model runs step 1
        scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
    scheduler.update_from_output(
        out1,
        create_model_runner_output(
            [request], invalid_block_ids={invalid}, use_eos=True
        ),
    )

    # The same 48 tokens again, with no external answer.
    again = create_request(
        request_id=2, num_tokens=NUM_TOKENS, common_prefix_len=NUM_TOKENS
    )
    blocks, num_hit_tokens, _ = scheduler.kv_cache_manager.get_computed_blocks(again)
    return request, invalid, blocks.get_block_ids()[0], num_hit_tokens


def test_abort_during_failed_sync_load_evicts_invalid_blocks():
    request, invalid, hit_blocks, num_hit_tokens = _failed_load_of_the_first_block(
        abort=True
    )
    assert request.status == RequestStatus.FINISHED_ABORTED
    assert num_hit_tokens == 0, (
        f"request id-1 was aborted during step 1, whose sync load failed on "
        f"block {invalid}; request id-2 (same 48 tokens) then hits "
        f"{num_hit_tokens} tokens on blocks {hit_blocks}: block {invalid} "
        f"stayed in the prefix cache though its KV was never loaded"
    )


def test_failed_sync_load_evicts_invalid_blocks():
    request, invalid, hit_blocks, num_hit_tokens = _failed_load_of_the_first_block(
        abort=False
    )
    assert request.status == RequestStatus.FINISHED_ERROR
    assert num_hit_tokens == 0 and hit_blocks == []
