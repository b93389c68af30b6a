"""Known vLLM bug: under async scheduling, a synchronous KV load that fails
with the "recompute" policy leaves the output placeholder of the step that
ran it, and a ``max_tokens=1`` request is never scheduled again.

Found by: the scheduler state machine (a failing-load run: one FullAttention
group, recompute, async scheduling, the V1 runner), 2026-12-02: the run's
requests stayed RUNNING/WAITING for 200 steps of empty schedule() calls,
which led to the ``running-request-progresses`` check (liveness). Shrunk here
by hand to one request.

Analysis (vLLM 0.33.0):

- The request's 16-token prompt finds 15 tokens in the external store; the
  connector loads them synchronously and the step schedules the last one.
  ``AsyncScheduler._update_after_schedule`` takes the step for its last
  prefill chunk and reserves an output placeholder
  (``num_output_placeholders = 1``).
- The worker reports the load's blocks in ``invalid_block_ids``. With
  ``kv_load_failure_policy="recompute"``,
  ``_update_requests_with_invalid_blocks`` rolls ``num_computed_tokens`` back
  to the first invalid block, and ``update_from_output`` skips the request
  (``failed_kv_load_req_ids``) before ``_update_request_with_output``, the
  only place that gives placeholders back. The placeholder stays.
- The recompute step then counts as a prefill chunk (``num_computed_tokens <
  num_tokens + num_output_placeholders``): no output is expected from it.
  Once the prompt is computed, ``schedule()``'s async skip for a request
  whose "previous step has reached max_tokens" (``num_computed_tokens + 2 -
  num_output_placeholders >= num_prompt_tokens + max_tokens``) holds for
  ``max_tokens=1`` on every later step: the request keeps its sequence slot
  and blocks, and its client never gets an answer.
- With ``max_tokens > 1`` the request goes on, but the scheduler sends
  ``num_output_tokens + num_output_placeholders`` (one too many) to the
  worker, which then keeps the token it sampled on the failed load
  (``gpu_model_runner`` trims ``output_token_ids`` only down to that count):
  a position's KV is computed from the discarded token, and once its block
  fills, vLLM files it in the prefix cache under the key of the tokens it
  records, so a later request with that prefix would adopt the wrong KV
  (pinned below with ``kv-matches-tokens`` and ``index-names-its-prefix``).

Reach: a real engine: async scheduling (the default), one KV-cache group
(block-level failures are refused with several), a connector that reports
``invalid_block_ids``, ``--kv-load-failure-policy recompute``. Upstream:
issue 45138 (open); PRs 45146 and 49252 (open) reset the placeholders on the
rollback. Checked on 0.33.0 and 0.28.0 (both strand the request).

Controls: synchronous scheduling, and ``max_tokens=2``, both finish.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``failed-sync-load-recompute-keeps-output-placeholder`` entry of
fuzz/known_bugs.py.
"""

from __future__ import annotations


import pytest

from fuzz.adapter import SchedulerHarness
from fuzz.known_bugs import KNOWN_BUGS
from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SpecDraw
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.contents import check_index_names_its_prefix, check_reads_written
from invariants.scheduler import check_kv_matches_tokens
from tests.known_bugs._pin import known_vllm_bug
from tests.known_bugs.runs import serve_failed_sync_load
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


@known_vllm_bug("vLLM: a failed sync load's output placeholder survives the recompute (issue 45138)")
def test_a_recomputed_request_is_scheduled_until_it_finishes() -> None:
    serve_failed_sync_load(async_scheduling=True, max_tokens=1)


@pytest.mark.parametrize(("async_scheduling", "max_tokens"), [(False, 1), (True, 2)])
def test_controls_finish(async_scheduling: bool, max_tokens: int) -> None:
    assert serve_failed_sync_load(async_scheduling=async_scheduling, max_tokens=max_tokens).is_idle()


def test_the_stranded_request_is_the_registered_known_bug() -> None:
    with pytest.raises(InvariantViolation) as caught:
        serve_failed_sync_load(async_scheduling=True, max_tokens=1)
    assert caught.value.where == "AsyncScheduler._update_after_schedule", caught.value.where
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "failed-sync-load-recompute-keeps-output-placeholder"


def _serve_checking_contents(*, async_scheduling: bool) -> SchedulerHarness:
    """:func:`serve_failed_sync_load` with ``max_tokens=3`` (the request finishes), every
    step checked by ``kv-matches-tokens``."""
    return serve_failed_sync_load(async_scheduling=async_scheduling, max_tokens=3, check=check_kv_matches_tokens)


@known_vllm_bug(
    "vLLM: after a failed sync load's recompute the runner computes a position from the discarded token "
    "(issues 45138, 49250)",
)
def test_a_recomputed_request_computes_each_position_from_its_own_token() -> None:
    _serve_checking_contents(async_scheduling=True)


def test_synchronous_recompute_computes_each_position_from_its_own_token() -> None:
    assert _serve_checking_contents(async_scheduling=False).is_idle()


def test_the_other_token_is_the_registered_known_bug() -> None:
    with pytest.raises(InvariantViolation) as caught:
        _serve_checking_contents(async_scheduling=True)
    assert caught.value.invariant == "kv-matches-tokens", caught.value.invariant
    assert "position 16's KV was computed at step 5 from token 1001, but vLLM records token 1002" in str(caught.value)
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "failed-sync-load-recompute-keeps-output-placeholder"


def _serve_a_sharer(*, async_scheduling: bool) -> SchedulerHarness:
    """Pinned from a 120 s scheduler-machine campaign on unmodified vLLM
    0.33.0 (the sidecar then matched no known bug): one FullAttention group
    (block 3), recompute, the V2 runner. r0's 9-token prompt loads 8 tokens
    synchronously; r1, admitted in the same step, is r0's first 4 tokens and
    takes a local hit on r0's first block, which that load fills. The load
    fails: vLLM rolls back r1 too (it holds an invalid block) and skips its
    output, so r1 keeps the placeholder of its last prefill step. Every step
    is checked by ``kv-matches-tokens``."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 3),), hash_block_size=3, num_blocks=13, max_model_len=36)
    harness = harness_of(layout, batch=4, seqs=2, long_prefill_token_threshold=0, kv_load_failure_policy="recompute",
                         model_runner="v2", async_scheduling=async_scheduling, divergent_hits=True)
    harness.add_request(list(range(0, 63, 7)), max_tokens=1, reply=ExternalReply("store", store_len=9))
    harness.add_request(list(range(0, 28, 7)), max_tokens=2)
    harness.fail_next_sync_loads()
    for _ in range(20):
        check_kv_matches_tokens(harness.step(context="r0's sync load fails under r1's local hit, recompute"))
        if harness.is_idle():
            return harness
    raise AssertionError("the requests did not finish in 20 steps")


@known_vllm_bug(
    "vLLM: a request rolled back for sharing a failed sync load's block keeps its output placeholder "
    "(issue 45138)",
)
def test_a_request_sharing_a_failed_load_computes_each_position_from_its_own_token() -> None:
    _serve_a_sharer(async_scheduling=True)


def test_a_sharer_under_synchronous_scheduling_computes_each_position_from_its_own_token() -> None:
    assert _serve_a_sharer(async_scheduling=False).is_idle()


def test_the_sharers_other_token_is_the_registered_known_bug() -> None:
    with pytest.raises(InvariantViolation) as caught:
        _serve_a_sharer(async_scheduling=True)
    assert "request r1: position 4's KV was computed at step 5 from token 1001, but vLLM records token 1002" in str(
        caught.value
    ), str(caught.value)
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "failed-sync-load-recompute-keeps-output-placeholder"


def _serve_checking_the_index(*, async_scheduling: bool) -> SchedulerHarness:
    """:func:`serve_failed_sync_load` with ``max_tokens=6``: the request runs past position
    19, so the block holding positions 16-19 (position 16 computed from the
    token vLLM discarded) fills and enters the prefix-cache index, under the
    key of the tokens vLLM records. Every step is checked by
    ``index-names-its-prefix``."""
    return serve_failed_sync_load(async_scheduling=async_scheduling, max_tokens=6, check=check_index_names_its_prefix)


@known_vllm_bug(
    "vLLM: after a failed sync load's recompute, a block holding KV of the discarded token enters the prefix "
    "cache under the recorded tokens' key (issue 45138)",
)
def test_a_recomputed_requests_cached_blocks_hold_their_keys_tokens() -> None:
    _serve_checking_the_index(async_scheduling=True)


def test_synchronous_recompute_caches_blocks_holding_their_keys_tokens() -> None:
    assert _serve_checking_the_index(async_scheduling=False).is_idle()


def test_the_misnamed_cache_entry_is_the_registered_known_bug() -> None:
    with pytest.raises(InvariantViolation) as caught:
        _serve_checking_the_index(async_scheduling=True)
    assert caught.value.invariant == "index-names-its-prefix", caught.value.invariant
    assert "(the first 20 tokens of request r0) names block" in str(caught.value), str(caught.value)
    assert "(16, 1002, (16, 5, 1001))" in str(caught.value), str(caught.value)
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "failed-sync-load-recompute-keeps-output-placeholder"


def _serve_a_resynced_reader(*, async_scheduling: bool) -> SchedulerHarness:
    """A machine campaign's shrunk program (2026-12-04): one FullAttention
    group (block 3), async scheduling, V1 runner, recompute policy, prefills
    admitted every third step. Two requests share their first 3 tokens; the
    second's next 4 are loaded synchronously and the load fails block by
    block while its first decode step is in flight. The rollback keeps the
    output placeholder; the runner computes position 8 from the token it
    sampled on the failed step, vLLM then records the in-flight step's
    token there, and when the runner takes the request's tokens again it
    takes the last num_output_tokens of all_token_ids (one too many): the
    step computing from 9 reads position 8 as a third token. Every step is
    checked by ``reads-written``."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 3),), hash_block_size=3, num_blocks=13)
    harness = harness_of(layout, batch=6, seqs=3, long_prefill_token_threshold=3, kv_load_failure_policy="recompute",
                         model_runner="v1", async_scheduling=async_scheduling,
                         prefill_schedule_interval=3)
    check_reads_written(harness.step())
    harness.add_request(list(range(0, 42, 7)), max_tokens=1)
    harness.add_request([0, 7, 14, 21, 28, 35, 4192, 4193], max_tokens=3, reply=ExternalReply("store", store_len=8))
    harness.fail_next_sync_loads()
    for _ in range(12):
        check_reads_written(harness.step(context="a failed sync load's recompute; the runner takes the tokens again"))
        if harness.is_idle():
            return harness
    raise AssertionError("the requests did not finish in 12 steps")


@known_vllm_bug(
    "vLLM: after a failed sync load's recompute, the runner takes one output token too many when it takes the "
    "request's tokens again, and a later step reads KV of other tokens (issue 45138)",
)
def test_a_recomputed_request_reads_back_kv_of_its_own_tokens() -> None:
    _serve_a_resynced_reader(async_scheduling=True)


def test_synchronous_recompute_reads_back_kv_of_its_own_tokens() -> None:
    assert _serve_a_resynced_reader(async_scheduling=False).is_idle()


def test_the_read_of_the_other_tokens_kv_is_the_registered_known_bug() -> None:
    with pytest.raises(InvariantViolation) as caught:
        _serve_a_resynced_reader(async_scheduling=True)
    assert caught.value.invariant == "reads-written", caught.value.invariant
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "failed-sync-load-recompute-keeps-output-placeholder", str(caught.value)
