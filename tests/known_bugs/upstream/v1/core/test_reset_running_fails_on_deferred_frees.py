# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""reset_prefix_cache(reset_running_requests=True) must succeed while a step
is in flight, also when the scheduler defers block frees.

Claim: after preempting every running request, the reset of running
requests leaves no block in use, so the prefix cache is reset and the call
returns True.

Broken on 0.33.0 (bug id reset-running-fails-on-deferred-frees): with
overlapping batches and a KV-consumer connector (kv_both here),
``defer_block_free`` keeps a preempted request's blocks out of the pool
until the step in flight is processed, so ``BlockPool.reset_prefix_cache``
finds them in use and ``reset_prefix_cache`` raises RuntimeError ("... waiting
for remote KV transfer ..."), though no transfer is in flight. The caller
(an RLHF trainer after a weight update) gets the error, every request is
preempted all the same, and the cache keeps the old weights' KV. A
producer-only connector does not defer: the control resets.

Upstream: no report found. The deferral came with vllm-project/vllm PR 45357
(https://github.com/vllm-project/vllm/pull/45357), the reset of running
requests with PR 28827 (https://github.com/vllm-project/vllm/pull/28827).
"""

from unittest.mock import PropertyMock, patch

import pytest

from vllm.config import VllmConfig
from vllm.v1.request import RequestStatus

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, mock_kv

pytestmark = pytest.mark.cpu_test


def _reset_with_a_step_in_flight(kv_role: str):
    # Async scheduling is forced off on CPU: claim two concurrent batches as
    # a GPU engine (or pipeline parallelism) has.
    with patch.object(
        VllmConfig, "max_concurrent_batches", new_callable=PropertyMock, return_value=2
    ):
        scheduler = create_scheduler(
            async_scheduling=True,
            enable_prefix_caching=True,
            use_kv_connector=mock_kv(matched_tokens=0, is_async=False),
            kv_role=kv_role,
        )
    (request,) = create_requests(num_requests=1, num_tokens=33, max_tokens=6)
    scheduler.add_request(request)

    out1 = scheduler.schedule()  # step 1: the 33 prompt tokens (3 blocks of 16)
    out2 = scheduler.schedule()  # step 2: one decode token, in flight
    scheduler.update_from_output(out1, create_model_runner_output([request]))
    assert out2.num_scheduled_tokens == {request.request_id: 1}

    try:
        reset = scheduler.reset_prefix_cache(reset_running_requests=True)
    except RuntimeError as exc:
        reset = exc
    return scheduler, request, reset


def test_reset_running_requests_with_deferred_frees():
    scheduler, request, reset = _reset_with_a_step_in_flight("kv_both")
    deferred = [b.block_id for _, blocks in scheduler.deferred_frees for b in blocks]
    assert reset is True, (
        f"reset_prefix_cache(reset_running_requests=True) with step 2 in flight "
        f"returned {reset!r}: request {request.request_id} was preempted "
        f"({request.status.name}) but its blocks {sorted(deferred)} wait in "
        f"deferred_frees, so the prefix cache was not reset"
    )


def test_reset_running_requests_without_deferred_frees():
    scheduler, request, reset = _reset_with_a_step_in_flight("kv_producer")
    assert not scheduler.defer_block_free
    assert reset is True
    assert request.status == RequestStatus.PREEMPTED
