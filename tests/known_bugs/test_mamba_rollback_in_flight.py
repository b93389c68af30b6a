"""Known vLLM bug: under async scheduling, a failed synchronous load on a
Mamba group rolls the request back over its step in flight, and the
recompute keeps its state in the null block.

Found by: ``read-blocks-held`` in the scheduler state machine's derandomized
CI run (a failing-load run on a lone Mamba group), 2026-12-04.

Analysis (vLLM 0.33.0, ``vllm/v1/core/sched/scheduler.py`` and the Mamba
manager in ``single_type_kv_cache_manager.py``):

- Async scheduling schedules the step after a synchronous load before the
  load's output is fed. The Mamba manager (align mode) lays the request's
  table out for that chunk: one state block at the chunk's end, the null
  block at the block boundaries inside it. Here: a 1-token load into block
  1, then ``[4, 12)`` scheduled with the table ``[1, null, 2]``.
- The load's output reports block 1 invalid (``invalid_block_ids``, policy
  "recompute"). ``_update_requests_with_invalid_blocks`` sets
  ``num_computed_tokens`` back to the first invalid block (0), which drops
  the tokens of the step in flight too, and leaves the table as it is.
- The recompute's chunk ``[0, 8)`` ends at a boundary the table holds as
  the null block; the table is already long enough, so ``allocate_slots``
  adds nothing. Its state is written to the null block, and the next chunk
  ``[8, 12)`` reads it back from there: the request decodes from a state no
  block holds, silently.
- Synchronous scheduling has no step in flight at the rollback: the
  recompute's table is laid out afresh (the control below).

Reach: in principle a real engine (a model whose only KV-cache group is
Mamba, ``--async-scheduling``, a KV connector reporting block-level load
failures under ``kv_load_failure_policy="recompute"``); shown here through
the scheduler API.

Upstream: no report found.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``mamba-rollback-over-in-flight-step`` entry of fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.adapter import SchedulerHarness
from fuzz.known_bugs import known_bug
from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SpecDraw
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.contents import check_reads_written
from invariants.ownership import check_read_blocks_held
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def _failed_load_then_recompute(async_scheduling: bool, check=check_read_blocks_held) -> SchedulerHarness:  # type: ignore[no-untyped-def]
    """A lone Mamba(4) group, 8-token chunks, policy "recompute": a 13-token
    request whose 1-token synchronous load fails, recomputed to its end.
    The claim is checked on every step itself (no known bug set aside)."""
    layout = LayoutDraw((SpecDraw("MambaSpec", 4),), hash_block_size=4, num_blocks=7)
    harness = harness_of(layout, batch=8, seqs=1, kv_load_failure_policy="recompute", async_scheduling=async_scheduling)
    rid = harness.add_request(range(13), max_tokens=1, reply=ExternalReply("store", store_len=1))
    harness.fail_next_sync_loads()
    for _ in range(8):
        check(harness.step(context="a failed 1-token load, recomputed"))
        if rid not in harness.live_request_ids and harness.is_idle():
            break
    assert harness.invalid_blocks_reported, "the load did not fail"
    assert harness.is_idle()
    return harness


def test_a_synchronous_rollback_lays_the_recompute_out_afresh() -> None:
    """The control: no step in flight at the rollback."""
    _failed_load_then_recompute(async_scheduling=False)


@known_vllm_bug("vLLM bug mamba-rollback-over-in-flight-step (fuzz/known_bugs.py)")
def test_a_rollback_over_a_step_in_flight_keeps_a_state_slot() -> None:
    """Async: the recompute of [0, 8) ends at the null slot the step in
    flight left at index 1, and [8, 12) reads its state from there."""
    with shown_as("mamba-rollback-over-in-flight-step"):
        _failed_load_then_recompute(async_scheduling=True)


def test_the_contents_model_sees_the_state_read_from_the_null_block() -> None:
    """The Mamba state model, checked alone: the recompute starts [8, 12)
    from a state no block holds, the same registered bug."""
    _failed_load_then_recompute(async_scheduling=False, check=check_reads_written)
    with pytest.raises(InvariantViolation) as caught:
        _failed_load_then_recompute(async_scheduling=True, check=check_reads_written)
    assert caught.value.invariant == "reads-written" and "computing from position 8" in str(caught.value), str(
        caught.value)
    assert known_bug("mamba-rollback-over-in-flight-step").shows_in_every(caught.value), str(caught.value)
