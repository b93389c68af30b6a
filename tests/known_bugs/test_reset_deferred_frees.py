"""Known vLLM bug: ``reset_prefix_cache(reset_running_requests=True)`` raises
while a step is in flight, when vLLM defers block frees.

Found by: ``no-exception`` in the scheduler state machine (its
``reset_prefix_cache`` rule, async scheduling, the scripted connector in its
default ``kv_both`` role), 2026-12-04.

Analysis (vLLM 0.33.0, ``vllm/v1/core/sched/scheduler.py``):

- With overlapping batches (``max_concurrent_batches > 1``: async scheduling
  or pipeline parallelism) and a KV connector that loads (``is_kv_consumer``:
  ``kv_consumer`` or ``kv_both``), ``Scheduler.__init__`` sets
  ``defer_block_free``: a request finished or preempted while a step that
  scheduled it is still running keeps its blocks out of the pool
  (``_free_request_blocks`` appends them to ``deferred_frees``) until that
  step's output is processed (``update_from_output`` drains them).
- ``reset_prefix_cache(reset_running_requests=True)`` preempts every running
  request, so that every block is free, and then asks the block pool to
  reset. Any request the step in flight scheduled has its blocks deferred,
  so ``BlockPool.reset_prefix_cache`` finds blocks in use and refuses, and
  the scheduler raises ``RuntimeError("Failed to reset KV cache even when
  all the running requests are preempted ... waiting for remote KV
  transfer ...")``: no remote transfer is in flight.
- The engine core serves the utility call between two iterations of its
  busy loop; with a batch queue (``step_with_batch_queue``) the step
  scheduled last is then usually still running. The caller (an RLHF
  trainer resetting the cache after a weight update) gets the error; every
  running request has been preempted all the same, and the cache still
  holds the KV of the old weights.

Reach: in principle a real engine (``--async-scheduling`` with a consumer KV
connector, such as an offloading connector in ``kv_both``, and
``LLM.reset_prefix_cache(reset_running_requests=True)`` or the server's
``/reset_prefix_cache?reset_running_requests=true`` while requests run);
shown here through the scheduler API. A producer-only connector does not
defer frees: the control below resets.

Upstream: no report found. The deferral came with vllm-project/vllm PR 45357;
the reset of running requests with PR 28827.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``reset-running-fails-on-deferred-frees`` entry of fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.adapter import SchedulerHarness
from fuzz.model import LayoutDraw, SpecDraw
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.scheduler import check_no_exception_escapes
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def _reset_while_decoding(kv_role: str) -> SchedulerHarness:
    """Async scheduling, one full-attention group: a 13-token request
    decodes; two steps in (one step in flight), the prefix cache is reset
    with reset_running_requests; then it runs to its end. Every step is
    checked (on the step itself: no known bug is set aside here)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = harness_of(layout, batch=32, seqs=2, async_scheduling=True, kv_role=kv_role)
    harness.add_request(range(13), max_tokens=6)
    for _ in range(2):
        check_no_exception_escapes(harness.step(context="decoding"))
    assert harness.has_pending_output, "no step in flight"
    harness.reset_prefix_cache(reset_running=True)
    for observation in harness.drain(context="after the reset"):
        check_no_exception_escapes(observation)
    assert harness.resets == [(3, True)], harness.resets
    return harness


def test_a_producer_resets_with_a_step_in_flight() -> None:
    """The control: a producer-only connector frees at once, and the reset
    succeeds."""
    _reset_while_decoding("kv_producer")


@known_vllm_bug("vLLM bug reset-running-fails-on-deferred-frees (fuzz/known_bugs.py)")
def test_a_consumer_resets_with_a_step_in_flight() -> None:
    """kv_both: the preempted request's blocks are deferred, and the reset raises."""
    with shown_as("reset-running-fails-on-deferred-frees"):
        _reset_while_decoding("kv_both")
