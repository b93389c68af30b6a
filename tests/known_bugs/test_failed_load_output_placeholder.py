"""A synchronous KV load that fails under the "recompute" policy, async
scheduling: the request recomputes and finishes (withdrawn known bug).

History: the registry once held
``failed-sync-load-recompute-keeps-output-placeholder``: a ``max_tokens=1``
request stranded after the recompute. The scripted worker of that time
decided whether it sampled a token from vLLM's own ``Request.is_prefill_chunk``,
which the failed step's leftover output placeholder keeps true
(``num_computed_tokens < num_tokens + num_output_placeholders``), so it
sampled nothing for the final chunk and the request waited forever.

Verdict from vLLM 0.33.0's code, with the worker deciding from its own record
(``fuzz/adapter/_reports.py``): ``update_from_output`` skips the failed
step's output (``failed_kv_load_req_ids``) and the placeholder it reserved is
left over; the model runner drops the token it sampled for that step, because
the scheduler's ``num_output_tokens`` for the request stays 0 (the runner
trims its output tokens to it). The recompute's final chunk reaches the
prompt's end in the runner's count, so the runner samples; the scheduler
takes the token (the leftover placeholder stands in for the one this step
did not reserve) and the request finishes. Not a bug through this path.
Upstream issue 45138 concerns the same leftover placeholder.

These tests fail if the request strands again (the liveness check raises)
or does not finish within 12 steps.
"""

from __future__ import annotations

import pytest

from fuzz.adapter import SchedulerHarness
from fuzz.model import ExternalReply, LayoutDraw, SchedulerDraw, SpecDraw
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.scheduler import check_running_requests_progress

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def _serve(*, async_scheduling: bool, max_tokens: int) -> SchedulerHarness:
    """One FullAttention group (block 4), recompute policy, V1 runner: a
    16-token prompt the store holds, loaded synchronously (15 tokens), the
    load failing block by block; stepped until it finishes (the liveness
    check raises once the request is stranded)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=16)
    harness = SchedulerHarness(
        SchedulerDraw(
            layout=layout,
            max_num_batched_tokens=8,
            max_num_seqs=1,
            kv_load_failure_policy="recompute",
            model_runner="v1",
            async_scheduling=async_scheduling,
        )
    )
    harness.add_request(list(range(16)), max_tokens=max_tokens, reply=ExternalReply("store", store_len=16))
    harness.fail_next_sync_loads()
    for _ in range(12):
        step = harness.step(context=f"sync load of 15 tokens fails, recompute, max_tokens={max_tokens}")
        check_running_requests_progress(step)
        if harness.is_idle():
            return harness
    raise AssertionError("neither finished nor stranded in 12 steps")


@pytest.mark.parametrize(("async_scheduling", "max_tokens"), [(True, 1), (False, 1), (True, 2)])
def test_a_recomputed_request_finishes(async_scheduling: bool, max_tokens: int) -> None:
    harness = _serve(async_scheduling=async_scheduling, max_tokens=max_tokens)
    assert harness.is_idle() and not harness.live_request_ids, harness.live_request_ids
