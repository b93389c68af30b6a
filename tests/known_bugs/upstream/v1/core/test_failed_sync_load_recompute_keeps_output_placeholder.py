# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A request rolled back by a failed synchronous KV load (policy
"recompute") must be scheduled until it finishes, under async scheduling too.

Claim: after the rollback, the request recomputes the lost tokens, samples
its tokens and finishes; no output placeholder outlives the step that
reserved it.

Broken on 0.33.0 (bug id failed-sync-load-recompute-keeps-output-placeholder):
the step that runs the load schedules the last prompt token, and
AsyncScheduler._update_after_schedule reserves an output placeholder
(num_output_placeholders = 1). The worker reports the loaded block in
invalid_block_ids; _update_requests_with_invalid_blocks rolls
num_computed_tokens back and update_from_output skips the request
(failed_kv_load_req_ids) before _update_request_with_output, the only place
that gives placeholders back. The recompute step is then a prefill chunk
(num_computed_tokens < num_tokens + num_output_placeholders), and afterwards
schedule()'s "previous step has reached max_tokens" skip holds on every
step: with max_tokens=1 the request keeps its slot and blocks, and its
client never gets an answer. Synchronous scheduling finishes (the control).

Upstream: issue 45138 (https://github.com/vllm-project/vllm/issues/45138)
and issue 49250 part 2 (https://github.com/vllm-project/vllm/issues/49250)
came first; PRs 45146 and 49252 reset the placeholders on the rollback.
"""

from collections import deque

import pytest

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, mock_kv

pytestmark = pytest.mark.cpu_test


def _output(request, worker_len: int):
    # The V1 worker samples only in a step that reaches the end of the tokens
    # it holds: the prompt, the outputs and the placeholders it was told of.
    output = create_model_runner_output([request])
    if request.num_computed_tokens < worker_len:
        output.sampled_token_ids = [[]]
    return output


def _recompute_after_a_failed_load(async_scheduling: bool):
    scheduler = create_scheduler(
        enable_prefix_caching=True,
        max_num_batched_tokens=16,
        async_scheduling=async_scheduling,
        use_v2_model_runner=False,
        use_kv_connector=mock_kv(matched_tokens=31, is_async=False),
    )
    # What kv_load_failure_policy="recompute" sets (create_scheduler has no option).
    scheduler.recompute_kv_load_failures = True
    (request,) = create_requests(num_requests=1, num_tokens=32, max_tokens=1)
    scheduler.add_request(request)

    out1 = scheduler.schedule()  # step 1: load [0, 31) synchronously, compute token 31
    assert out1.num_scheduled_tokens == {request.request_id: 1}
    (block_ids,) = out1.scheduled_new_reqs[0].block_ids
    # The worker samples token 32 and reports the load of block 0 failed.
    in_flight = deque(
        [
            (
                out1,
                create_model_runner_output([request], invalid_block_ids={block_ids[0]}),
            )
        ]
    )
    scheduled = [out1.num_scheduled_tokens]
    for _ in range(5):  # steps 2-6: recompute [0, 32) in 2 chunks of 16, sample 1 token
        if not async_scheduling and in_flight:
            scheduler.update_from_output(*in_flight.popleft())
        worker_len = request.num_tokens + request.num_output_placeholders
        out = scheduler.schedule()
        scheduled.append(out.num_scheduled_tokens)
        if out.num_scheduled_tokens:
            in_flight.append((out, _output(request, worker_len)))
        # Async scheduling: a step's output comes after the next step is scheduled.
        if (
            async_scheduling
            and in_flight
            and (len(in_flight) > 1 or not out.num_scheduled_tokens)
        ):
            scheduler.update_from_output(*in_flight.popleft())
    return request, scheduled


def test_async_recompute_after_failed_sync_load_finishes():
    request, scheduled = _recompute_after_a_failed_load(async_scheduling=True)
    # The rollback left num_computed_tokens at 0; steps 3 and 4 recompute
    # [0, 16) and [16, 32); the placeholder of step 1 makes step 4 a prefill
    # chunk, and from step 5 on the "max_tokens reached" skip holds.
    assert request.is_finished(), (
        f"request {request.request_id} (32 prompt tokens, max_tokens=1) is "
        f"{request.status.name} after 6 steps, scheduled {scheduled}: "
        f"num_computed_tokens={request.num_computed_tokens}, "
        f"num_output_placeholders={request.num_output_placeholders} (reserved by "
        f"step 1, whose load failed), no token sampled"
    )


def test_sync_recompute_after_failed_sync_load_finishes():
    request, scheduled = _recompute_after_a_failed_load(async_scheduling=False)
    assert request.is_finished()
    assert request.num_output_placeholders == 0
    assert scheduled[1:3] == [{request.request_id: 16}] * 2
