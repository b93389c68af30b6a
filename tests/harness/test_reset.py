"""Prefix-cache resets between steps (``SchedulerHarness.reset_prefix_cache``,
the state machine's ``reset_prefix_cache`` rule) on unmodified vLLM: every
claim holds around them.

The first two are shrunk from scheduler-machine campaigns that met harness
misfits (fixed): a request a reset preempts may be admitted again by the
very next ``schedule()``, with a new block table or an async load that
schedules nothing, and is judged as the reset left it.
"""

from __future__ import annotations

import pytest

from fuzz.adapter import FIXED_RUNS
from fuzz.model import ExternalReply, LayoutDraw, SpecDraw
from fuzz.runners.scheduler import ALL_CHECKS, Stepper, checks_for, run_fixed
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

LAYOUT = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)


def test_a_request_preempted_with_its_step_in_flight_is_admitted_again_at_once() -> None:
    """Async scheduling on a producer: the reset preempts a decoding request
    whose step is in flight, and the next schedule() admits it again with a
    new table (in-flight-reads-held excuses its freed blocks, as for any
    preemption where vLLM frees at once)."""
    run = run_fixed(FIXED_RUNS["reset_keeps_index"], ALL_CHECKS)
    assert run.harness.resets == [(run.harness.resets[0][0], True)]


def test_a_request_preempted_by_a_reset_may_wait_for_a_load_at_once() -> None:
    """Synchronous scheduling, a connector that loads asynchronously: the
    reset preempts the decoding request, and the next schedule() admits it
    again into WAITING_FOR_REMOTE_KVS, holding blocks; preempted-resumable
    judges it as the reset left it (PREEMPTED, nothing held)."""
    harness = harness_of(LAYOUT, batch=32, seqs=2)
    run = Stepper(harness, ALL_CHECKS)
    rid = harness.add_request(range(13), max_tokens=6, reply=ExternalReply("store", store_len=8, load_async=True))
    for _ in range(8):
        run.step()
        if harness.status_of(rid) == "RUNNING" and (harness.num_computed_tokens(rid) or 0) > 13:
            break
    assert harness.status_of(rid) == "RUNNING", harness.status_of(rid)
    harness.reset_prefix_cache(reset_running=True)
    observation = run.step()
    assert [p.request_id for p in observation.preemptions] == [rid]
    (preempted,) = observation.preemptions
    assert (preempted.status, preempted.num_computed_tokens, sum(preempted.blocks_held)) == ("PREEMPTED", 0, 0)
    assert harness.status_of(rid) == "WAITING_FOR_REMOTE_KVS", harness.status_of(rid)
    run.drain()
    assert harness.resets[0][1] and not harness.live_request_ids


def test_a_reset_refused_while_a_request_runs_changes_nothing() -> None:
    """Without reset_running_requests, a reset while a request holds blocks
    is refused (vLLM returns False) and the cache keeps serving its hits."""
    harness = harness_of(LAYOUT, batch=32, seqs=2)
    run = Stepper(harness, ALL_CHECKS)
    harness.add_request(range(13), max_tokens=2)
    run.drain()
    harness.add_request(range(13), max_tokens=4)
    run.step()
    harness.reset_prefix_cache(reset_running=False)
    run.step()
    run.drain()
    assert [ok for _, ok in harness.resets] == [False]
    rid = harness.add_request(range(13), max_tokens=2)
    hits = [a.local_hit for a in run.step().admissions if a.request_id == rid]
    run.drain()
    assert hits == [12], hits


def test_a_reset_drops_the_drafts_of_the_step_in_flight() -> None:
    """Shrunk from a scheduler-machine campaign (a misfit of
    rejected-drafts-rolled-back, fixed): async EAGLE on a producer; the
    reset preempts a request whose step in flight verifies drafts, and the
    next schedule() admits it again from 0. That step's output is stale
    (vLLM drops it): its rejected drafts take nothing off the restarted
    count."""
    layout = LayoutDraw(
        (SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4, (("num_speculative_blocks", 3),))),
        hash_block_size=4, num_blocks=41,
    )
    harness = harness_of(layout, batch=16, seqs=2, model_runner="v1", async_scheduling=True, kv_role="kv_producer",
                         speculative_method="eagle", num_speculative_tokens=3, draft_acceptance=(0,))
    run = Stepper(harness, ALL_CHECKS)
    rid = harness.add_request(tuple(range(10)), max_tokens=8)
    for _ in range(3):  # two prefill chunks (4, 6), then 1 token and 3 drafts
        out = run.step()
    assert out.num_scheduled == {rid: 4} and harness.has_pending_output, "no step with drafts in flight"
    harness.reset_prefix_cache(reset_running=True)
    observation = run.step()
    assert [s.request_id for s in observation.stale_outputs] == [rid]
    assert [v.request_id for v in observation.draft_verifications] == [rid]
    run.drain()
    assert harness.resets[0][1] and not harness.live_request_ids



def test_the_step_that_admits_a_reset_request_again_keeps_its_own_drafts() -> None:
    """Shrunk from a scheduler-machine campaign (a misfit of reads-written,
    fixed): async ngram (k = 1, every draft rejected) on the V2 runner, no
    connector, a 3-token chunked-local window. The reset preempts the
    request while its first step is in flight; the next schedule() admits
    it again and reports it preempted. What that step computed, and the
    draft it rejected, belong to the request as admitted again: the step
    after it starts one position back (at 4, not 5) and reads nothing
    unwritten. The harness once forgot both after the step, as for a
    request gone."""
    layout = LayoutDraw((SpecDraw("ChunkedLocalAttentionSpec", 3, (("attention_chunk_size", 3),)),),
                        hash_block_size=3, num_blocks=7, max_model_len=17)
    harness = harness_of(layout, batch=4, seqs=1, model_runner="v2", async_scheduling=True, connector=False,
                         divergent_hits=False, speculative_method="ngram", num_speculative_tokens=1,
                         draft_acceptance=(0,))
    run = Stepper(harness, checks_for(harness.draw, ALL_CHECKS))
    rid = harness.add_request((0, 7, 14, 4128), max_tokens=2)
    assert run.step().num_scheduled == {rid: 2}  # the last prompt token and a draft slot
    harness.reset_prefix_cache(reset_running=True)
    readmitted = run.step()
    assert readmitted.num_scheduled == {rid: 2}, readmitted.describe()
    run.drain()
    assert harness.resets[0][1] and not harness.live_request_ids


def test_two_resets_asked_between_steps_are_both_done_as_logged() -> None:
    """Every reset asked for between two steps is done, in order, as the
    operation log (and so the replay and a repro file) has them."""
    harness = harness_of(LAYOUT, batch=32, seqs=2)
    run = Stepper(harness, ALL_CHECKS)
    harness.add_request(range(13), max_tokens=4)
    run.step()
    harness.reset_prefix_cache(reset_running=False)
    harness.reset_prefix_cache(reset_running=True)
    run.step()
    assert harness.resets == [(2, False), (2, True)], harness.resets
    assert [type(op).__name__ for op in harness.oplog.ops].count("ResetPrefixCache") == 2
    run.drain()
