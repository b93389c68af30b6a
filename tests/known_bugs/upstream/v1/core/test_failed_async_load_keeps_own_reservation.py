# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A request whose async KV load failed must be admitted again on a pool
that holds it.

Claim (kv_load_failure_policy="recompute"): after an async load is reported
failed with no valid token, the request is re-admitted as soon as the pool
has room for it, and it does not block the waiting queue.

Broken on 0.33.0 (bug id failed-async-load-keeps-own-reservation): admitting
an async load adds the request to _inflight_prefills, whose remaining blocks
every later async admission must leave free
(_inflight_prefill_reserved_blocks, passed to allocate_slots as
reserved_blocks). When the load lands failed with no valid token,
_update_waiting_for_remote_kv frees the request's blocks and sends it back
to waiting, but leaves it in _inflight_prefills. Asked again, the connector
answers an async load again, and the admission must leave free the whole
sequence its own stale reservation names: on a pool under twice its need it
is refused at every schedule(), and, first in kv_holding_waiting, it stops
every other waiting request too. On a pool of twice its need it is
admitted (the control).

Upstream: a fix was proposed first in vllm-project/vllm PR 48433
(https://github.com/vllm-project/vllm/pull/48433, closed unmerged):
exclude a request's own reservation when it resumes.
"""

import pytest

from vllm.v1.request import RequestStatus

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, mock_kv

pytestmark = pytest.mark.cpu_test


def _readmit_after_a_failed_async_load(num_blocks: int):
    scheduler = create_scheduler(
        enable_prefix_caching=True,
        num_blocks=num_blocks,  # block 0 is the null block
        use_kv_connector=mock_kv(matched_tokens=48, is_async=True),
    )
    # What kv_load_failure_policy="recompute" sets (create_scheduler has no option).
    scheduler.recompute_kv_load_failures = True
    (a,) = create_requests(num_requests=1, num_tokens=64, max_tokens=1, req_ids=["a"])
    scheduler.add_request(a)

    out1 = scheduler.schedule()  # step 1: a's async load of [0, 48) starts
    (loading,) = scheduler.kv_cache_manager.get_block_ids("a")
    assert a.status == RequestStatus.WAITING_FOR_REMOTE_KVS and loading == [1, 2, 3]
    # The load lands with every block failed: a goes back to waiting, freed.
    scheduler.update_from_output(
        out1,
        create_model_runner_output(
            [], finished_recving={"a"}, invalid_block_ids=set(loading)
        ),
    )
    for _ in range(2):  # steps 2 and 3: the connector answers an async load again
        out = scheduler.schedule()
        scheduler.update_from_output(out, create_model_runner_output([]))
    return scheduler, a, scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def test_failed_async_load_readmitted_on_a_pool_that_holds_it():
    scheduler, a, free = _readmit_after_a_failed_async_load(num_blocks=6)
    # a needs 4 blocks (64 tokens); the pool has 5 free, as at step 1.
    assert a.status == RequestStatus.WAITING_FOR_REMOTE_KVS, (
        f"request a, whose async load on blocks [1, 2, 3] failed at step 1, is "
        f"{a.status.name} with {a.num_computed_tokens} tokens computed after steps "
        f"2 and 3 with {free} blocks free: a is still in _inflight_prefills "
        f"({a in scheduler._inflight_prefills}) and its own stale reservation of "
        f"{scheduler._inflight_prefill_reserved_blocks()} blocks refuses its admission"
    )


def test_failed_async_load_readmitted_on_a_roomy_pool():
    scheduler, a, free = _readmit_after_a_failed_async_load(num_blocks=10)
    # 9 free blocks: a's 4, and 4 more for its own stale reservation.
    assert a.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert a.num_computed_tokens == 48
