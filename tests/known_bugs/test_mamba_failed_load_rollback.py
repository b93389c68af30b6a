"""Known vLLM bug: a failed synchronous load on a whole-state (Mamba) layout
rolls the request back to a point with no valid Mamba state.

Found by: ``failed-load-recomputed`` in the scheduler state machine
(``fail_next_sync_loads`` on a single-group Mamba layout), 2026-12-01.

Analysis (vLLM 0.33.0; the pin fails on 0.28.0 too, and 0.27.1 has the same
code, where this suite has no scheduler tier):
``Scheduler._update_requests_with_invalid_blocks``
(vllm/v1/core/sched/scheduler.py) handles ``invalid_block_ids`` from the
connector by walking the request's block table and setting
``num_computed_tokens = idx * block_size`` at the first invalid block, which
is right for attention, where block ``k`` holds the KV of tokens
``[k*B, (k+1)*B)`` on its own. A Mamba group in align mode holds no KV per
block: after a load of ``[0, 12)`` with block size 4 its table is
``[null, null, S, R]`` (``S`` the loaded state at token 12, ``R`` the running
state), so the connector can only report ``S`` invalid, the walk skips the
two null blocks, and the request resumes at 8. No state for token 8 exists
(block 1 is the null block), and the worker keeps reading the state block it
last wrote (``mamba_utils``: ``mamba_state_idx`` is carried over from the
previous step), so tokens 8-15 are recomputed from a corrupt state: silent
wrong output, no error. The only valid resume point is the load's start (0
here), which is what ``_handle_failed_recving`` does for an async load.
``_handle_invalid_blocks`` refuses multi-group layouts, so this needs a
single Mamba group.

Reach: engine-reachable in principle: a pure Mamba/Mamba2 model with prefix
caching (``mamba_cache_mode="align"``), a KV connector reporting block-level
load failures (``invalid_block_ids``) and ``kv_load_failure_policy=
"recompute"``. Not reproduced on a real engine here (the CPU engine tier has
no such connector).

The same walk on a lone sliding-window group: a synchronous load of
``[0, 17)`` (block size 2, window 8) leaves the blocks below the window of
token 17 null; the rollback resumes at 10, and the recompute of ``[10, 14)``
and then ``[14, 18)`` reads those null blocks (their KV was never loaded).
The harness labels every chunk of that recompute as this bug (not only the
step right after the rollback), so a campaign does not report the later
chunks as a new violation.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``mamba-failed-load-rollback`` entry of fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.known_bugs import KNOWN_BUGS
from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SpecDraw, StepObservation
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.connector import check_failed_load_recomputed
from invariants.ownership import check_read_blocks_held
from tests.known_bugs._pin import known_vllm_bug
from tests.known_bugs.runs import failed_sync_load
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def _check(steps: list[StepObservation]) -> None:
    (load,) = [f for s in steps for f in s.failed_loads]
    assert load.how == "invalid_block_ids" and load.load_start == 0, load
    for s in steps:
        check_failed_load_recomputed(s)


@known_vllm_bug("vLLM: a failed sync load on a Mamba layout resumes past the load's start, where no state exists")
def test_failed_sync_load_on_mamba_resumes_where_a_state_exists() -> None:
    _check(failed_sync_load("MambaSpec"))


def test_control_failed_sync_load_on_full_attention_resumes_at_its_first_failed_block() -> None:
    _check(failed_sync_load("FullAttentionSpec"))


def test_the_failure_is_the_registered_known_bug() -> None:
    with pytest.raises(InvariantViolation) as caught:
        _check(failed_sync_load("MambaSpec"))
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "mamba-failed-load-rollback"


def _failed_sync_load_rolled_back_to_its_start() -> list[StepObservation]:
    """7 tokens, one Mamba group of block 2, 4 tokens a step; the connector
    answers 2 from 0 and the load fails: vLLM rolls the request back to 0
    (the load's start, a valid resume point). Its table stays laid out for
    the failed step ([2, 6): the loaded state at index 0, the running one at
    2, index 1 null), so the recompute of [0, 4) writes its state at 4 into
    the null block and the next chunk, [4, 6), reads it from there.

    Met by a 400 s machine campaign on unmodified vLLM 0.33.0 (2026-12-04),
    shrunk to this one request."""
    layout = LayoutDraw((SpecDraw("MambaSpec", 2),), hash_block_size=2, num_blocks=7)
    harness = harness_of(layout, batch=4, seqs=1, kv_load_failure_policy="recompute")
    harness.add_request((0, 7, 14, 3128, 3129, 3130, 3131), max_tokens=1, reply=ExternalReply("store", store_len=2))
    harness.fail_next_sync_loads()
    return harness.drain(context="MambaSpec: sync load of [0, 2) fails, rolled back to 0")


@known_vllm_bug("vLLM: a Mamba request rolled back to its load's start recomputes into the failed step's null padding")
def test_a_mamba_rollback_to_the_loads_start_recomputes_into_real_blocks() -> None:
    for step in _failed_sync_load_rolled_back_to_its_start():
        check_read_blocks_held(step)


def _steps_all_this_bug(steps: list[StepObservation]) -> list[int]:
    """The steps whose read-blocks-held violations there are, each one
    asserted to be this bug."""
    flagged = {s.step: list(check_read_blocks_held.violations(s)) for s in steps}
    for vs in flagged.values():
        for v in vs:
            (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(v)]
            assert bug.id == "mamba-failed-load-rollback", str(v)
    return [n for n, vs in flagged.items() if vs]


def test_every_chunk_of_that_recompute_is_the_known_bug() -> None:
    """The chunk that writes into the null block and the one that reads it
    there are both this bug, not a new violation."""
    assert _steps_all_this_bug(_failed_sync_load_rolled_back_to_its_start()) == [2, 3]


def _failed_sync_load_on_a_window() -> list[StepObservation]:
    """18 tokens, one sliding-window group (block 2, window 8), 4 tokens a
    step; the connector answers 17 from 0 and that load fails block by block."""
    layout = LayoutDraw((SpecDraw("SlidingWindowSpec", 2, (("sliding_window", 8),)),), hash_block_size=2, num_blocks=32)
    harness = harness_of(layout, batch=4, seqs=2, kv_load_failure_policy="recompute")
    harness.add_request(tuple(range(100, 118)), max_tokens=1, reply=ExternalReply("store", store_len=17))
    harness.fail_next_sync_loads()
    return harness.drain(context="SlidingWindowSpec: sync load of [0, 17) fails")


@known_vllm_bug(
    "vLLM: a failed sync load on a lone sliding-window group recomputes from blocks outside the kept window",
)
def test_failed_sync_load_on_a_lone_window_recomputes_inside_its_window() -> None:
    for step in _failed_sync_load_on_a_window():
        check_read_blocks_held(step)


def test_every_recomputed_chunk_on_the_window_is_the_known_bug() -> None:
    """Both chunks of the recompute read null blocks, and both are labelled
    this bug: the second is no new violation."""
    chunks = _steps_all_this_bug(_failed_sync_load_on_a_window())
    assert len(chunks) == 2, chunks


def _failed_sync_load_under_an_async_load() -> list[StepObservation]:
    """One sliding-window MLA group (block 4, window 8), 4 tokens a step. r2
    (9 tokens) loads [0, 8) synchronously; r3 (r2's first 8 tokens and 3 of
    its own) takes those 8 as a local hit and loads the rest asynchronously,
    its whole prompt, so it is admitted at 11 computed tokens and its table
    drops index 0 (outside the window of token 11). r2's load fails block by
    block: vLLM rolls r2 back to 0 and r3, whose table holds the failed block
    2 at index 1, to 4, whose window needs the dropped block.

    Found by a 6 s campaign of the state machine (tests/tooling/test_bench.py,
    seed 7), shrunk to these two requests."""
    layout = LayoutDraw((SpecDraw("SlidingWindowMLASpec", 4, (("sliding_window", 8),)),), hash_block_size=4,
                        num_blocks=13)
    harness = harness_of(layout, batch=4, seqs=2, kv_load_failure_policy="recompute")
    shared = [0, 7, 14, 21, 28, 35, 42, 49]
    harness.add_request(shared + [4064], max_tokens=1, reply=ExternalReply("store", store_len=9))
    harness.add_request(shared + [3128, 3129, 3130], max_tokens=1,
                        reply=ExternalReply("store", store_len=11, load_async=True))
    harness.fail_next_sync_loads()
    return harness.drain(context="sync load of [0, 8) fails under r3's local hit and async load")


@known_vllm_bug(
    "vLLM: an async-loading request sharing a failed sync load's blocks is rolled back into its dropped window",
)
def test_an_async_load_sharing_the_failed_blocks_resumes_inside_its_window() -> None:
    for step in _failed_sync_load_under_an_async_load():
        check_read_blocks_held(step)


def test_the_async_load_rolled_back_into_its_window_is_a_known_bug() -> None:
    """The first chunk r3 computes after its load lands also reads the block
    the whole-prompt admission dropped (labelled the full-prompt async-load
    bug, the step the load lands); the next chunk is the rollback's, labelled
    this bug (the harness marks requests vLLM rolls back while their async
    load is in flight, not only those whose own load failed)."""
    steps = _failed_sync_load_under_an_async_load()
    (load,) = [f for s in steps for f in s.failed_loads]
    assert load.request_id == "r0" and load.how == "invalid_block_ids", load
    seen = []
    for s in steps:
        for v in check_read_blocks_held.violations(s):
            (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(v)]
            seen.append(bug.id)
    assert seen == ["full-prompt-async-load-replays-outside-window", "mamba-failed-load-rollback"], seen


def _failed_sync_load_under_a_running_hit() -> list[StepObservation]:
    """One sliding-window group (block 4, window 4), 4 tokens a step. r0 (13
    tokens) loads [0, 12) synchronously; r1 (r0's first 12 tokens and one of
    its own) takes those 12 as a local hit in the same step (vLLM caches a
    sync load's blocks at allocation) and runs, its table nulled below the
    window of token 12. r0 is aborted while the model runs the step and its
    load fails block by block: vLLM rolls the running r1, whose table holds
    the failed block, back to 8, whose window needs a nulled block.

    Found by a 20 s default campaign (tests/tooling/test_cli.py, seed 1), shrunk to
    these two requests."""
    layout = LayoutDraw((SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 4),)),), hash_block_size=4,
                        num_blocks=13)
    harness = harness_of(layout, batch=4, seqs=2, kv_load_failure_policy="recompute", model_runner="v2")
    shared = list(range(0, 84, 7))
    r0 = harness.add_request(shared + [84], max_tokens=1, reply=ExternalReply("store", store_len=13))
    harness.add_request(shared + [3064], max_tokens=1, reply=ExternalReply("store", store_len=13))
    harness.fail_next_sync_loads()
    harness.abort(r0, during_step=True)
    return harness.drain(context="sync load of [0, 12) fails under r1's running local hit")


@known_vllm_bug("vLLM 0.33.0: a running request sharing the failed blocks is rolled back inside its window")
def test_a_running_request_sharing_the_failed_blocks_resumes_inside_its_window() -> None:
    for step in _failed_sync_load_under_a_running_hit():
        check_read_blocks_held(step)


def test_the_running_request_rolled_back_into_its_window_is_a_known_bug() -> None:
    """The harness marks every request vLLM rolls back for blocks it shares
    (running or still loading), not only the one whose load failed: r1's
    recompute is labelled this bug, not reported as a new violation."""
    steps = _failed_sync_load_under_a_running_hit()
    (load,) = [f for s in steps for f in s.failed_loads]
    assert load.request_id == "r0" and load.how == "invalid_block_ids", load
    seen = []
    for s in steps:
        for v in check_read_blocks_held.violations(s):
            assert "request r1 " in str(v), str(v)
            (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(v)]
            seen.append(bug.id)
    assert seen == ["mamba-failed-load-rollback"], seen
