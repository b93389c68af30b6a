"""Hand-made runs of known vLLM bugs that more than one test module plays:
the pins here, the repro writer's tests (tests/findings/), the tooling
tests and the sibling cases (tests/findings/test_siblings_beside_real_bugs.py),
with the runs of the siblings planted beside them. The analyses stay with the pins (the ``test_*.py`` modules beside
this one).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from fuzz.adapter import ManagerHarness, SchedulerHarness
from fuzz.model import (
    AdmissionObservation, EagleDraw, ExternalReply, LayoutDraw, PromptDraw, SchedulerDraw, SingleShotScenario, SpecDraw,
    StepObservation,
)
from fuzz.runners.scheduler import ALL_CHECKS, Stepper
from invariants.contents import check_index_written, check_reads_written
from invariants.promises import check_events_chain
from invariants.scheduler import check_no_exception_escapes, check_running_requests_progress
from tests.support.harnesses import harness_of

__all__ = [
    "ABORTED_LOAD_PROMPT",
    "EVENTS_HYBRID",
    "FULL_PROMPT_ASYNC_LOAD",
    "SYNC_LOAD_THEN_SAME_STEP_PARTIAL_HIT",
    "checkpointed_prompts",
    "eagle_resend",
    "eagle_window_second_lookup",
    "failed_async_load",
    "failed_sync_load",
    "failed_sync_load_run",
    "failing_sync_load",
    "lookup_after_a_shrink",
    "one_prompt_with_events",
    "padded_second_admission",
    "pool_nearly_full_scenario",
    "readmitted_after_a_failed_load",
    "recompute_connector_harness",
    "reset_running",
    "rolled_back_below_an_image",
    "rolled_back_over_a_step_in_flight",
    "serve_failed_sync_load",
    "shared_partial_hit_harness",
    "shared_partial_hit_step",
    "third_admission_past_hybrid_hit",
    "three_decoding_requests",
]


# --------------------------------------------------------------------------
# mamba-external-block-undercount (test_known_vllm_bugs_scheduler.py).
# --------------------------------------------------------------------------
def pool_nearly_full_scenario() -> tuple[SchedulerHarness, object]:
    """A running 900-token request fills most of a 140-block pool (enough for
    max_model_len=1024, as the engine requires); then a request arrives whose
    prompt the connector holds, sized so its admission estimate equals the
    free blocks exactly."""
    block = 8
    layout = LayoutDraw(
        groups=(SpecDraw("FullAttentionSpec", block), SpecDraw("MambaSpec", block)),
        hash_block_size=2,
        num_blocks=140,
    )
    harness = harness_of(layout, batch=64, seqs=2)
    harness.add_request([5_000 + i for i in range(900)], max_tokens=200, reply=ExternalReply("zero"))
    while harness.scheduler.requests[next(iter(harness.scheduler.requests))].num_computed_tokens < 900:
        step = harness.step()
        check_no_exception_escapes(step)
    free = harness.pool.get_num_free_blocks()
    # n = 8k + 1 tokens, 8k loaded: estimate (k + 1) + 1 == free.
    n = block * (free - 2) + 1
    harness.add_request(list(range(n)), max_tokens=1, reply=ExternalReply("store", store_len=n))
    return harness, harness.step()


# --------------------------------------------------------------------------
# same-step-cow-chain (test_known_vllm_bugs_scheduler.py).
# --------------------------------------------------------------------------
def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(3, 1023) for _ in range(n)]


def shared_partial_hit_step(copies_of_b: int, *, second_root: bool = False) -> StepObservation:
    """A 9-token prompt runs alone, then ``copies_of_b`` 130-token prompts
    sharing its first 8 tokens arrive together; returns their first step.
    With ``second_root``, two more 130-token prompts on another root, sharing
    129 tokens, arrive in the same step: the second could adopt the first's
    block-aligned Mamba state, cached as it is allocated."""
    harness = shared_partial_hit_harness(copies_of_b)
    if second_root:
        other = _tokens(2000, 330)
        for seed in (5, 6):
            harness.add_request(other[:129] + _tokens(seed, 1), max_tokens=1, reply=ExternalReply("zero"))
    return harness.step()


def shared_partial_hit_harness(copies_of_b: int) -> SchedulerHarness:
    """:func:`shared_partial_hit_step`'s harness, right before that step."""
    layout = LayoutDraw(
        groups=(SpecDraw("FullAttentionSpec", 64), SpecDraw("MambaSpec", 64)),
        hash_block_size=8,
        num_blocks=600,
    )
    harness = harness_of(layout, batch=4096, seqs=4)
    root = _tokens(1000, 330)
    harness.add_request(root[:8] + _tokens(0, 1), max_tokens=1, reply=ExternalReply("zero"))
    harness.drain()
    for _ in range(copies_of_b):
        harness.add_request(root[:129] + _tokens(0, 1), max_tokens=1, reply=ExternalReply("zero"))
    return harness


# --------------------------------------------------------------------------
# mamba-failed-load-rollback (test_mamba_failed_load_rollback.py).
# --------------------------------------------------------------------------
def failed_sync_load(spec: str) -> list[StepObservation]:
    """16 tokens, one group of block 4; the connector answers 12 from 0 and
    the load of [0, 12) is reported failed block by block."""
    return failed_sync_load_run(spec)[1]


def failed_sync_load_run(spec: str) -> tuple[SchedulerHarness, list[StepObservation]]:
    """:func:`failed_sync_load`'s harness (its operation log) and steps."""
    layout = LayoutDraw((SpecDraw(spec, 4),), hash_block_size=4, num_blocks=32)
    harness = harness_of(layout, batch=32, kv_load_failure_policy="recompute")
    harness.add_request(tuple(range(100, 116)), max_tokens=1, reply=ExternalReply("store", store_len=12))
    harness.fail_next_sync_loads()
    return harness, harness.drain(context=f"{spec}: sync load of [0, 12) fails")


# --------------------------------------------------------------------------
# The block-ownership model's findings (test_ownership_findings.py).
# --------------------------------------------------------------------------
_ZERO = ExternalReply(kind="zero", store_len=0, undecided=0, extra=0, load_async=False)

# Shrunk by hand from the fuzzer's first example on vLLM 0.33.0.
SYNC_LOAD_THEN_SAME_STEP_PARTIAL_HIT = SingleShotScenario(
    config=SchedulerDraw(
        layout=LayoutDraw(
            groups=(SpecDraw("MambaSpec", 6), SpecDraw("FullAttentionSpec", 6)), hash_block_size=1, num_blocks=29
        ),
        max_num_batched_tokens=30,
        max_num_seqs=2,
        long_prefill_token_threshold=0,
        divergent_hits=True,
        kv_load_failure_policy="recompute",
        model_runner="v1",
    ),
    shared_len=48,
    token_seed=574,
    fills=(PromptDraw(15, 0, 3, _ZERO), PromptDraw(20, 0, 2, _ZERO), PromptDraw(26, 0, 3, _ZERO)),
    concurrent=False,
    evict_from=None,
    replay=PromptDraw(28, 0, 3, ExternalReply(kind="store", store_len=28, undecided=0, extra=0, load_async=False)),
    flavour="tail",
    probe=PromptDraw(25, 0, 2, _ZERO),
    replay_copies=2,
)

FULL_PROMPT_ASYNC_LOAD = SingleShotScenario(
    config=SchedulerDraw(
        layout=LayoutDraw(
            groups=(SpecDraw("MambaSpec", 4), SpecDraw("FullAttentionSpec", 4)), hash_block_size=1, num_blocks=20
        ),
        max_num_batched_tokens=18,
        max_num_seqs=1,
        long_prefill_token_threshold=18,
        divergent_hits=True,
        kv_load_failure_policy="recompute",
        model_runner="v1",
    ),
    shared_len=32,
    token_seed=175,
    fills=(PromptDraw(6, 0, 2, _ZERO), PromptDraw(10, 0, 2, _ZERO)),
    concurrent=False,
    evict_from=None,
    replay=PromptDraw(12, 0, 2, ExternalReply(kind="undecided", store_len=12, undecided=1, extra=0, load_async=False)),
    flavour="tail",
    probe=PromptDraw(9, 0, 1, ExternalReply(kind="undecided", store_len=9, undecided=1, extra=0, load_async=True)),
)


# --------------------------------------------------------------------------
# failed-sync-load-recompute-keeps-output-placeholder (test_failed_load_output_placeholder.py).
# --------------------------------------------------------------------------
def serve_failed_sync_load(
    *, async_scheduling: bool, max_tokens: int, check: Callable[[StepObservation], None] = check_running_requests_progress
) -> SchedulerHarness:
    """One FullAttention group (block 4), recompute policy, V1 runner: a
    16-token prompt the store holds, loaded synchronously (15 tokens), the
    load failing block by block; stepped until it finishes, ``check`` run
    on every step (the liveness check raises once the request is stranded)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=16)
    harness = harness_of(layout, batch=8, seqs=1, kv_load_failure_policy="recompute", model_runner="v1",
                         async_scheduling=async_scheduling)
    harness.add_request(list(range(16)), max_tokens=max_tokens, reply=ExternalReply("store", store_len=16))
    harness.fail_next_sync_loads()
    for _ in range(12):
        check(harness.step(context=f"sync load of 15 tokens fails, recompute, max_tokens={max_tokens}"))
        if harness.is_idle():
            return harness
    raise AssertionError("neither finished nor stranded in 12 steps")


# --------------------------------------------------------------------------
# failed-async-load-keeps-own-reservation, encoder-output-held-past-failed-load-rollback
# (test_failed_load_leftovers.py).
# --------------------------------------------------------------------------
def recompute_connector_harness(num_blocks: int) -> SchedulerHarness:
    """Full attention of 4-token blocks, one request at a time, 4 tokens a
    step, a connector whose failed loads are recomputed."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=num_blocks)
    return harness_of(layout, batch=4, seqs=1, kv_load_failure_policy="recompute", connector=True)


def failed_async_load(num_blocks: int, checks: tuple[Callable[..., None], ...] = ALL_CHECKS) -> Stepper:
    """A 13-token prompt is computed and cached; then a 25-token prompt
    sharing its first 12 tokens loads the rest asynchronously, and the load
    is reported failed. Every step is checked with ``checks`` (default every
    claim; the pin reports known bugs too); the stepper (what it set aside)."""
    harness = recompute_connector_harness(num_blocks)
    stepper = Stepper(harness, checks)
    harness.add_request([*range(12), 900], max_tokens=1, reply=ExternalReply("store", store_len=12))
    stepper.drain()
    harness.fail_next_async_loads()
    harness.add_request([*range(17), *range(500, 508)], max_tokens=1,
                        reply=ExternalReply("store", store_len=25, load_async=True))
    stepper.drain()
    assert not harness.live_request_ids
    return stepper


def rolled_back_below_an_image(images: tuple[tuple[str, int, int], ...],
                               checks: tuple[Callable[..., None], ...] = ALL_CHECKS) -> Stepper:
    """A 7-token prompt whose synchronous load of the whole prompt is
    reported failed (recompute): the request is rolled back to token 0.
    Checked with ``checks`` as :func:`failed_async_load`; the stepper."""
    harness = recompute_connector_harness(13)
    stepper = Stepper(harness, checks)
    harness.fail_next_sync_loads()
    harness.add_request(range(7), max_tokens=1, reply=ExternalReply("store", store_len=7), mm=images)
    stepper.drain()
    assert not harness.live_request_ids
    return stepper


# --------------------------------------------------------------------------
# mamba-checkpoint-chunk-skips-boundary-state (test_mamba_checkpoint_boundary.py).
# --------------------------------------------------------------------------
_CHECKPOINT_SECOND = [*range(0, 1000, 7), 1, 8, 15, 22, 29, 36]  # 149 tokens; its first 96 are the first prompt


def checkpointed_prompts(*, checkpoints: bool, checks: tuple[Callable[[StepObservation], None], ...] = (
        check_index_written, check_reads_written)) -> SchedulerHarness:
    """Full attention and Mamba of 48-token blocks, 4-token hashes (sub-block
    hits), one sequence at a time, 96-token budget: a 96-token prompt (its
    partial-tail state at 92 cached), then a 149-token prompt that hits 92
    tokens and prefills [92, 149) in one chunk, then a prompt sharing its
    first 100 tokens. Every step is checked by ``checks`` (default
    ``index-written`` and ``reads-written``)."""
    extra = (("num_prefill_checkpoint_blocks", 1), ("prefill_checkpoint_alignment", 1)) if checkpoints else ()
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 48), SpecDraw("MambaSpec", 48, extra)), hash_block_size=4,
                        num_blocks=15, max_model_len=150)
    harness = harness_of(layout, batch=96, seqs=1)
    for prompt in (list(range(0, 672, 7)), _CHECKPOINT_SECOND, [*_CHECKPOINT_SECOND[:100], *range(5000, 5008)]):
        harness.add_request(prompt, max_tokens=1)
        for _ in range(8):
            step = harness.step(context=f"prefix caching across three prompts, checkpoints={checkpoints}")
            for check in checks:
                check(step)
            if harness.is_idle():
                break
    return harness


# --------------------------------------------------------------------------
# abort-during-failed-sync-load-keeps-invalid-blocks-cached (test_abort_during_failed_load.py).
# --------------------------------------------------------------------------
ABORTED_LOAD_PROMPT = tuple(range(12))


def _abort_harness() -> SchedulerHarness:
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=1, num_blocks=19)
    return harness_of(layout, batch=16, seqs=2, kv_load_failure_policy="fail")


def failing_sync_load(*, aborted: bool) -> tuple[SchedulerHarness, StepObservation]:
    """12 tokens, one FullAttention group of block 4; the connector answers 8
    from 0 (a synchronous load of [0, 8)), the load fails block by block, and
    with ``aborted`` the client aborts while the model runs that step."""
    harness = _abort_harness()
    harness.add_request(ABORTED_LOAD_PROMPT, max_tokens=2, reply=ExternalReply("store", store_len=8))
    if aborted:
        harness.abort("r0", during_step=True)
    harness.fail_next_sync_loads()
    step = harness.step(context="sync load of [0, 8) fails" + (", r0 aborted during the step" if aborted else ""))
    (load,) = step.failed_loads
    assert load.how == "invalid_block_ids" and load.failed_block_ids != ((),), load
    return harness, step


# --------------------------------------------------------------------------
# spec-decode-padding-cut-by-long-prefill-threshold (test_spec_decode_padding_threshold.py).
# --------------------------------------------------------------------------
_PADDED_PROMPT = tuple(range(9))  # 2 blocks of 4 and 1 token: a hit of 8 = num_tokens - 1


def padded_second_admission(method: str, threshold: int):
    """One FullAttention group of block 4, no connector hit. r0 computes
    the 9-token prompt; then r1 (it again: 8 tokens cached, 1 left) and r2 wait
    together, so the threshold applies when r1 is padded to 1 + k."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = harness_of(layout, batch=16, seqs=2, long_prefill_token_threshold=threshold, speculative_method=method,
                         num_speculative_tokens=2, draft_acceptance=(0,))
    harness.add_request(_PADDED_PROMPT, max_tokens=1)
    harness.drain()
    harness.add_request(_PADDED_PROMPT, max_tokens=2)
    harness.add_request(tuple(range(100, 104)), max_tokens=2)
    return harness.step(context=f"{method}, k=2, long_prefill_token_threshold={threshold}: r1 hits 8 of 9")


# --------------------------------------------------------------------------
# second-attention-group-lags-divergent-connector-hit
# (test_second_attention_group_lags_connector_hit.py).
# --------------------------------------------------------------------------
_LAGGING_PROMPT = list(range(0, 448, 7))  # 64 tokens


def readmitted_after_a_failed_load(divergent_hits: bool) -> StepObservation:
    """FA(4) + Mamba(4) + FA(16), hash unit 1, a 35-block pool, 32 tokens a
    step, async scheduling. r0 computes the 64-token prompt; r1 (its first
    52 tokens and 17 of its own) runs two steps and is aborted, its
    allocations evicting the block-16 group's cached blocks of the prompt;
    r2 (the prompt again)
    async-loads what the connector saved of r0, the load fails (recompute),
    and r2 is admitted again: a local hit of 52 on group 0 only, and 15
    external tokens from 48."""
    layout = LayoutDraw(
        (SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4), SpecDraw("FullAttentionSpec", 16)),
        hash_block_size=1,
        num_blocks=35,
    )
    harness = harness_of(layout, batch=32, seqs=1, kv_load_failure_policy="recompute", model_runner="v2",
                         async_scheduling=True, divergent_hits=divergent_hits)
    harness.add_request(_LAGGING_PROMPT, max_tokens=1, reply=ExternalReply())
    for _ in range(5):
        harness.step()
    r1 = harness.add_request(_LAGGING_PROMPT[:52] + list(range(3128, 3145)), max_tokens=1, reply=ExternalReply())
    for _ in range(2):
        harness.step()
    harness.abort(r1)
    r2 = harness.add_request(_LAGGING_PROMPT, max_tokens=1, reply=ExternalReply("saved", load_async=True))
    for _ in range(2):
        harness.step()
    harness.fail_async_load(r2)
    harness.step()
    return harness.step()


# --------------------------------------------------------------------------
# partial-event-names-unannounced-parent (test_partial_event_parent.py).
# --------------------------------------------------------------------------
def one_prompt_with_events(groups: tuple[SpecDraw, ...], length: int,
                           check: Callable[[StepObservation], None] = check_events_chain) -> None:
    """KV events on, a 4-token hash unit, 16-token blocks: one prompt of
    ``length`` tokens run to its end, ``check`` (default the events-chain
    claim) run after every step (on the step itself: no known bug is set
    aside here)."""
    layout = LayoutDraw(groups, hash_block_size=4, num_blocks=33)
    harness = harness_of(layout, batch=64, seqs=2, kv_events=True)
    harness.add_request(range(length), max_tokens=3)
    for _ in range(16):
        if harness.is_idle():
            break
        check(harness.step(context=f"one {length}-token prompt"))
    assert harness.is_idle()
    assert harness.observer.events is not None and harness.observer.events.events_seen["BlockStored"] >= 1


EVENTS_HYBRID = (SpecDraw("FullAttentionSpec", 16), SpecDraw("MambaSpec", 16))


# --------------------------------------------------------------------------
# eagle-resend-drops-proven-block (test_eagle_resend_drops_proven_block.py).
# --------------------------------------------------------------------------
def eagle_resend(*specs: SpecDraw):
    """A 12-token prompt sent twice, one after the other, on ``specs``
    (4-token blocks) under an async EAGLE drafter (k = 2); returns the
    second lookup's admission."""
    layout = LayoutDraw(specs, hash_block_size=4, num_blocks=65)
    harness = harness_of(layout, batch=32, seqs=2, model_runner="v1", async_scheduling=True,
                         speculative_method="eagle", num_speculative_tokens=2, draft_acceptance=(1,))
    seen = []
    for _ in range(2):
        rid = harness.add_request(range(12), max_tokens=2)
        seen += [a for a in harness.step().admissions if a.request_id == rid]
        harness.drain()
    return seen[-1]


# --------------------------------------------------------------------------
# eagle-window-aligns-before-drop (test_eagle_window_aligns_before_drop.py).
# --------------------------------------------------------------------------
def eagle_window_second_lookup(window: int):
    """r0 (17 tokens) then r1 (r0's and 4 more), one after the other, on
    full attention (8-token blocks) beside a ``window``-token sliding window
    (4-token blocks) under an async EAGLE drafter (k = 2); r1's admission."""
    layout = LayoutDraw(
        (SpecDraw("FullAttentionSpec", 8), SpecDraw("SlidingWindowSpec", 4, (("sliding_window", window),))),
        hash_block_size=4,
        num_blocks=65,
    )
    harness = harness_of(layout, batch=32, seqs=2, model_runner="v1", async_scheduling=True,
                         speculative_method="eagle", num_speculative_tokens=2, draft_acceptance=(1,))
    seen = []
    for prompt in (range(17), range(21)):
        rid = harness.add_request(prompt, max_tokens=2)
        seen += [a for a in harness.step().admissions if a.request_id == rid]
        harness.drain()
    return seen[-1]


# --------------------------------------------------------------------------
# eagle-verification-survives-shrink (test_eagle_verification_survives_shrink.py).
# --------------------------------------------------------------------------
_SHRINK_GROUPS = (SpecDraw("FullAttentionSpec", 4), SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 8),)),
                  SpecDraw("MambaSpec", 4))


def lookup_after_a_shrink(draft_groups: tuple[int, ...]) -> AdmissionObservation:
    """Cache an 8-token prompt, then a 24-token one over it (Mamba states at
    8 and 24), evict the window group's entry at 12, and look a 30-token
    request over the 24 up; the lookup, as the hit-length claim sees it."""
    harness = ManagerHarness(LayoutDraw(_SHRINK_GROUPS, hash_block_size=4, num_blocks=97), EagleDraw(draft_groups))
    prefix = list(range(24))
    harness.prefill(prefix[:8])
    harness.prefill(prefix)
    tokens = [*prefix, *range(900, 906)]
    harness.evict_entry(tokens, 12, group=1)
    return harness.admission(tokens)


# --------------------------------------------------------------------------
# full-block-past-hybrid-hit-unused (test_full_block_past_hybrid_hit.py).
# --------------------------------------------------------------------------
_PAST_HIT_SHARED = tuple(7 * i for i in range(96))  # r0 shares the first 84 with r2, r1 all 96


def third_admission_past_hybrid_hit(second_block: int):
    """The shrunk program, with the second full-attention group's block size
    ``second_block``; returns r2's admission."""
    layout = LayoutDraw(
        (SpecDraw("FullAttentionSpec", 8), SpecDraw("MambaSpec", 4), SpecDraw("FullAttentionSpec", second_block)),
        hash_block_size=1,
        num_blocks=163,
    )
    harness = harness_of(layout, batch=48, seqs=2, divergent_hits=False, kv_load_failure_policy="fail",
                         model_runner="v2", async_scheduling=True)
    harness.add_request(_PAST_HIT_SHARED[:84] + (3064, 3065), max_tokens=1, reply=ExternalReply("store", store_len=86))
    harness.step()
    harness.add_request(_PAST_HIT_SHARED + (3128, 3129), max_tokens=1)
    r2 = harness.add_request(_PAST_HIT_SHARED + (3128, 3129, 4128), max_tokens=1, reply=ExternalReply("store", store_len=99))
    harness.step()
    (adm,) = [a for a in harness.step(context=f"second full-attention group of block {second_block}").admissions
              if a.request_id == r2]
    return adm


# --------------------------------------------------------------------------
# mamba-rollback-over-in-flight-step's pin on any group, and
# reset-running-fails-on-deferred-frees beside its sibling's reset.
# --------------------------------------------------------------------------
def rolled_back_over_a_step_in_flight(kind: str) -> list[StepObservation]:
    """Async scheduling, a lone ``kind`` group of 4-token blocks, 8-token
    chunks, policy "recompute": a 13-token request whose 1-token synchronous
    load fails is rolled back over the step in flight and recomputed to its
    end (the pin of mamba-rollback-over-in-flight-step, on any group)."""
    layout = LayoutDraw((SpecDraw(kind, 4),), hash_block_size=4, num_blocks=7)
    harness = harness_of(layout, batch=8, seqs=1, kv_load_failure_policy="recompute", async_scheduling=True)
    rid = harness.add_request(range(13), max_tokens=1, reply=ExternalReply("store", store_len=1))
    harness.fail_next_sync_loads()
    steps = []
    for _ in range(8):
        steps.append(harness.step(context="a failed 1-token load, rolled back over the step in flight"))
        # A planted free breaks the pool for later steps: stop at its error.
        if steps[-1].error is not None or (rid not in harness.live_request_ids and harness.is_idle()):
            break
    assert harness.invalid_blocks_reported, "the load did not fail"
    return steps


def reset_running(*, async_scheduling: bool, async_load: bool) -> StepObservation:
    """One full-attention group, the scripted connector in its kv_both role:
    either (async scheduling) a request decoding with a step in flight, or
    (synchronous) a request whose async load is in flight; the prefix cache
    is then reset with reset_running_requests. The step the reset precedes."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = harness_of(layout, batch=32, seqs=2, async_scheduling=async_scheduling, kv_role="kv_both")
    if async_load:
        harness.add_request(range(13), max_tokens=2, reply=ExternalReply("store", store_len=8, load_async=True))
        steps = 1
    else:
        harness.add_request(range(13), max_tokens=6)
        steps = 2
    for _ in range(steps):
        step = harness.step(context="before the reset")
        assert step.error is None, step.error
    harness.reset_prefix_cache(reset_running=True)
    step = harness.step(context="the reset")
    assert step.error is not None, "the reset raised nothing"
    return step


# --------------------------------------------------------------------------
# drafts_never_cut, the sibling of spec-decode-padding-cut-by-long-prefill-threshold.
# --------------------------------------------------------------------------
def three_decoding_requests() -> list[StepObservation]:
    """Three 2-token prompts, ngram k=3 with every draft accepted: from the
    second step all three decode with 1 + 3 tokens each against a budget of
    6, so the second request's drafts are cut to one."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=40)
    harness = harness_of(layout, batch=6, seqs=3, speculative_method="ngram", num_speculative_tokens=3,
                         draft_acceptance=(3,))
    for i in range(3):
        harness.add_request(tuple(range(10 * i, 10 * i + 2)), max_tokens=8)
    return harness.drain()
