"""Every scheduler invariant catches a planted bug on the scheduler path.

Each case plants one bug (:func:`fuzz.adapter.planted_scheduler_bug`:
``Scheduler.schedule`` recompiled with one small edit, or a wrong
``truncate_computed_blocks``), runs the single-shot fuzzer with only the
invariant under test enabled, and expects that invariant to fail. The
failing scenario is then replayed on unmodified vLLM, where it must pass:
the failure is the planted bug's, not something else the search ran into.
The unplanted runs of the same targets pass in fuzz/targets/target_scheduler.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.stateful import run_state_machine_as_test

from fuzz.adapter import PLANTED_OWNERSHIP_BUGS, PLANTED_SCHEDULER_BUGS, planted_scheduler_bug
from fuzz.repro_scheduler import _replay_checked
from fuzz.known_bugs import KNOWN_BUGS
from tests.strategies.test_draws_pinned import _no_local_constants
from fuzz.targets import target_scheduler
from fuzz.adapter import SchedulerHarness
from fuzz.model import ExternalReply, LayoutDraw, SchedulerDraw, SpecDraw
from fuzz.runners.scheduler import CACHED_BLOCK_EVICTED, STALE_OUTPUT, Stepper, run_single_shot
from invariants import connector as conn
from invariants import scheduler as inv
from invariants.ownership import OWNERSHIP_CHECKS
from invariants.promises import check_events_chain, check_events_replay_index, check_hits_within_namespace
from invariants.promises import check_hits_after_reset, check_lookahead_allocated
from invariants.promises import check_in_flight_reads_held, check_preempted_resumable
from invariants.hits import check_eviction_order, check_hit_matches_index
from invariants.contents import check_index_names_its_prefix, check_index_written, check_reads_written
from fuzz.model import InvariantViolation
from fuzz.model import SingleShotScenario
from strategies.single_shot import single_shot_scenarios

# (check, invariant name, planted bug, search uses the evict shortcut)
CASES: list[tuple[Callable[..., None], str, str, bool]] = [
    (inv.check_no_exception_escapes, "no-exception", "pre_fix_assert_all", False),
    (inv.check_computed_tokens_add_up, "computed-adds-up", "skip_truncation", False),
    (inv.check_local_part_covered, "local-part-covered", "truncation_one_block_short", False),
    (inv.check_computed_below_num_tokens, "computed-below-num-tokens", "reports_external_twice", False),
    (inv.check_truncated_view, "truncated-view", "skip_truncation", False),
    (inv.check_mamba_state_at_resume_boundary, "mamba-state-at-boundary", "no_divergent_fallback", False),
    (inv.check_diverged_hit_falls_back, "diverged-falls-back", "fallback_discards_hit", False),
    (inv.check_no_leaked_blocks, "no-leaked-blocks", "truncate_touches_refcounts", False),
    # A request with skip_reading_prefix_cache: the scheduler's override of
    # the connector's answer, and the manager's lookup gate.
    (inv.check_skipping_request_reads_no_cache, "skip-reads-no-cache", "skipping_request_loads_external", False),
    (inv.check_skipping_request_reads_no_cache, "skip-reads-no-cache", "skipping_request_reads_local_cache", False),
    # The KV-connector protocol (invariants/connector.py).
    (conn.check_external_range_contiguous, "external-contiguous", "asks_connector_unaligned", False),
    (conn.check_told_external_accounted, "told-external-accounted", "tells_connector_total", False),
    (conn.check_load_blocks_cover_range, "load-blocks-cover", "hands_connector_cached_blocks", False),
    (conn.check_dropped_answer_loads_nothing, "dropped-answer-loads-nothing", "keeps_tail_and_loads", False),
    (conn.check_meta_built_once, "meta-built-once", "skips_meta_on_empty_step", False),
    (conn.check_meta_names_scheduled, "meta-names-scheduled", "async_load_counted_scheduled", False),
    (conn.check_sync_load_announced, "sync-load-announced", "no_sync_load_flag", False),
    (conn.check_async_load_lands_first, "async-load-lands-first", "async_load_computes_at_once", False),
    (conn.check_finished_once, "finished-once", "connector_finished_twice", False),
    # What the blocks hold (fuzz/adapter/_contents.py).
    (inv.check_reads_written, "reads-written", "partial_hit_shares_its_block", False),
    (inv.check_index_written, "index-written", "caches_async_load_early", False),
]

SEARCH = settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],  # the first failure is enough; no shrinking
    suppress_health_check=list(HealthCheck),
)


# Planted bugs whose trigger the single-shot scenarios draw rarely: an async
# load that leaves prompt tokens to compute (one async reply in four, and
# mostly the store holds the whole prompt); a connector answer no longer
# than the local sub-block tail ('partial tail kept': about 1% of examples;
# the first 400 derandomized ones stopped holding one when replays began
# drawing skip_reading_prefix_cache, whose answer vLLM drops).
BUDGET = {"async_load_computes_at_once": 2000, "keeps_tail_and_loads": 2000}


def _find(check: Callable[..., None], bug: str, shortcut: bool) -> tuple[InvariantViolation, SingleShotScenario]:
    found: list[SingleShotScenario] = []

    @settings(SEARCH, max_examples=BUDGET.get(bug, SEARCH.max_examples))
    @given(scenario=single_shot_scenarios(shortcut=shortcut, allow_over=False))
    def search(scenario: SingleShotScenario) -> None:
        try:
            run_single_shot(scenario, (check,), record=False)
        except InvariantViolation:
            found.append(scenario)
            raise

    with planted_scheduler_bug(bug), pytest.raises(InvariantViolation) as caught:
        search()
    return caught.value, found[-1]


@pytest.mark.parametrize(
    ("check", "invariant", "bug", "shortcut"),
    CASES,
    ids=[f"{name}<-{bug}" for _, name, bug, _ in CASES],
)
def test_invariant_catches_planted_bug(
    check: Callable[..., None], invariant: str, bug: str, shortcut: bool
) -> None:
    violation, scenario = _find(check, bug, shortcut)
    assert violation.invariant == invariant, str(violation)
    # The same scenario on unmodified vLLM satisfies the invariant.
    run_single_shot(scenario, (check,), record=False)


# Planted bugs only the state machine can reach: the single-shot scenarios
# never fail a load. (check, invariant, planted bug)
MACHINE_CASES: list[tuple[Callable[..., None], str, str]] = [
    (conn.check_failed_load_recomputed, "failed-load-recomputed", "resumes_past_invalid_block"),
    (conn.check_failed_load_not_cached, "failed-load-not-cached", "evicts_invalid_blocks_on_recompute"),
    (conn.check_failed_load_recomputed, "failed-load-recomputed", "failed_async_load_kept"),
]


def preempting_producer_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Three 10-token requests decoding 12 tokens each on a producer's
    (``kv_role="kv_producer"``) 8-block pool under async scheduling: vLLM
    defers no frees for a producer, so it preempts requests whose step is
    still running (4-token blocks: each needs 3 blocks to start and a fourth
    at token 13, which only a preemption frees)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=9)
    harness = SchedulerHarness(
        SchedulerDraw(layout, max_num_batched_tokens=16, max_num_seqs=3, async_scheduling=True,
                      kv_role="kv_producer")
    )
    for i in range(3):
        harness.add_request(range(100 * i, 100 * i + 10), max_tokens=12)
    run = Stepper(harness, checks)
    run.drain()
    return run


def _decoding(checks: tuple[Callable[..., None], ...], *, requests: int, max_tokens: int, num_blocks: int,
              drafts: int = 0) -> Stepper:
    """``requests`` 10-token prompts, all admitted at once, decoding
    ``max_tokens`` each on one FullAttention group of 4-token blocks
    (``num_blocks`` of them), synchronous scheduling (with ``drafts``: ngram
    speculation of that many drafts, one accepted per step), run until idle
    (or stalled)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=num_blocks)
    spec = {"speculative_method": "ngram", "num_speculative_tokens": drafts, "draft_acceptance": (1,)} if drafts else {}
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=16, max_num_seqs=requests, **spec))
    for i in range(requests):
        harness.add_request(range(100 * i, 100 * i + 10), max_tokens=max_tokens)
    run = Stepper(harness, checks)
    run.drain()
    return run


def preempting_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Three requests decoding 12 tokens each on a 9-block pool: each needs
    3 blocks to start and a fourth at token 13, which only a preemption
    frees."""
    return _decoding(checks, requests=3, max_tokens=12, num_blocks=9)


def speculating_preempting_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """:func:`preempting_run` with ngram speculation (2 drafts): a request is
    preempted with the drafts proposed after its last step."""
    return _decoding(checks, requests=3, max_tokens=12, num_blocks=9, drafts=2)


def decoding_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Two requests decoding 3 tokens each on a 12-block pool."""
    return _decoding(checks, requests=2, max_tokens=3, num_blocks=12)


def _one_after_another(checks: tuple[Callable[..., None], ...], *, kv_events: bool) -> Stepper:
    """Four 13-token prompts with no common prefix, one after another,
    decoding 2 tokens each on an 8-block pool of 4-token blocks: each
    prompt caches 3 blocks, and from the third on the new prompt's blocks
    are taken from cached ones."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=9)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2, kv_events=kv_events))
    run = Stepper(harness, checks)
    for i in range(4):
        harness.add_request(range(100 * i, 100 * i + 13), max_tokens=2)
        run.drain()
    return run


def evicting_events_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """KV events on; :func:`_one_after_another` (eviction announced by BlockRemoved)."""
    run = _one_after_another(checks, kv_events=True)
    events = run.harness.observer.events
    assert events is not None and events.events_seen["BlockRemoved"] >= 2, events and events.events_seen
    return run


def evicting_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """:func:`_one_after_another`: each finished request's free returns its
    4 blocks tail first (the partial tail, with no key, to the front of the
    free queue, its 3 cached blocks to the end, last one first), so the
    third prompt evicts the first one's last two cached blocks and keeps
    its first."""
    run = _one_after_another(checks, kv_events=False)
    assert run.harness.evictions.judged >= 4, run.harness.evictions.judged
    return run


def tenants_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """One 13-token prompt sent by tenant a, tenant b, an unsalted client
    and tenant a again, one after another: only the last may hit (3 blocks
    of 4 tokens), and does."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2))
    run = Stepper(harness, checks)
    hits = []
    for salt in ("tenant-a", "tenant-b", None, "tenant-a"):
        rid = harness.add_request(range(13), max_tokens=2, cache_salt=salt)
        hits += [a.local_hit for a in [*(run.step().admissions)] if a.request_id == rid]
        run.drain()
    assert hits[-1] == 12, hits
    return run


def reset_run(checks: tuple[Callable[..., None], ...], kv_events: bool = False) -> Stepper:
    """One 13-token prompt sent three times, async scheduling on a producer
    (a consumer defers the frees a reset needs: the known bug
    reset-running-fails-on-deferred-frees): the second
    hits 3 blocks of 4 tokens; while it decodes, the prefix cache is reset
    with reset_running_requests (it is preempted, its output in flight
    dropped); resumed, it may hit nothing; neither may the third, sent after
    it finished, hit anything computed before the reset (it hits the
    second's recomputed blocks)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2, async_scheduling=True,
                                             kv_role="kv_producer", kv_events=kv_events))
    run = Stepper(harness, checks)
    hits = []
    for n in range(3):
        rid = harness.add_request(range(13), max_tokens=4)
        hits += [a.local_hit for a in run.step().admissions if a.request_id == rid]
        if n == 1:
            run.step()
            harness.reset_prefix_cache(reset_running=True)
            hits += [a.local_hit for a in run.step().admissions if a.request_id == rid]
        run.drain()
    assert harness.resets and all(ok for _, ok in harness.resets), harness.resets
    assert hits == [0, 12, 0, 12], hits
    return run


def reset_events_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """KV events on; :func:`reset_run` (the reset announced by AllBlocksCleared)."""
    run = reset_run(checks, kv_events=True)
    events = run.harness.observer.events
    assert events is not None and events.events_seen["AllBlocksCleared"] == 1, events and events.events_seen
    return run


def adapters_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """LoRA on (one adapter): one 13-token prompt sent by the base model, under
    adapter b, and under adapter b again, one after another: only the last
    may hit (3 blocks of 4 tokens), and does."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2, max_loras=1))
    run = Stepper(harness, checks)
    hits = []
    for lora in (None, "adapter-b", "adapter-b"):
        rid = harness.add_request(range(13), max_tokens=2, lora=lora)
        hits += [a.local_hit for a in [*(run.step().admissions)] if a.request_id == rid]
        run.drain()
    assert hits[-1] == 12, hits
    return run


def repeated_prompt_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """One 13-token prompt sent twice, one after the other, on 4-token
    blocks: the second lookup has a prediction and hits its 3 cached blocks
    (12 tokens, under the 12-token limit)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2))
    run = Stepper(harness, checks)
    seen = []
    for _ in range(2):
        rid = harness.add_request(range(13), max_tokens=2)
        seen += [a for a in run.step().admissions if a.request_id == rid]
        run.drain()
    assert seen[-1].index_hold == ((4, 8, 12),) and seen[-1].local_hit == 12, seen[-1].describe()
    return run


def embeddings_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Prompt embeddings instead of token ids: 13 positions sent with
    embeddings a, then b, then a again, one after another (vLLM records
    zeros as the tokens of all three): only the last may hit (3 blocks of
    4 tokens), and does."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2))
    run = Stepper(harness, checks)
    hits = []
    for tag in ("embeds-a", "embeds-b", "embeds-a"):
        rid = harness.add_request(range(13), max_tokens=2, embeds=tag)
        hits += [a.local_hit for a in run.step().admissions if a.request_id == rid]
        run.drain()
    assert hits[-1] == 12, hits
    return run


def images_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """One 13-token prompt with an image at positions 2 to 7, sent with
    image a, then image b, then image a again, then with no image, one after
    another: only the third may hit (3 blocks of 4 tokens), and does; the
    encoder budget the multimodal requests need comes with them."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2))
    run = Stepper(harness, checks)
    hits = []
    for image in ("image-a", "image-b", "image-a", None):
        rid = harness.add_request(range(13), max_tokens=2, mm=((image, 2, 6),) if image else ())
        hits += [a.local_hit for a in run.step().admissions if a.request_id == rid]
        run.drain()
    assert hits == [0, 0, 12, 0], hits
    return run


def _repeated_local_prompt(local: SpecDraw, kind: str) -> Callable[[tuple[Callable[..., None], ...]], Stepper]:
    def run(checks: tuple[Callable[..., None], ...]) -> Stepper:
        layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), local), hash_block_size=4, num_blocks=33)
        harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2))
        stepper = Stepper(harness, checks)
        seen = []
        for _ in range(2):
            rid = harness.add_request(range(13), max_tokens=2)
            seen += [a for a in stepper.step().admissions if a.request_id == rid]
            stepper.drain()
        last = seen[-1]
        assert last.index_hold is not None and (0, local.params[0][1]) in (last.hit_windows, last.hit_chunks), \
            last.describe()
        assert 12 in last.index_hold[1] and last.local_hit == 12, last.describe()
        return stepper

    run.__doc__ = (f"Full attention beside {kind} (4-token blocks): one 13-token prompt sent twice, one "
                   "after the other; the second lookup has a prediction and hits 12 tokens.")
    return run


# A 5-token window needs the last block before a hit, and the group keeps
# only that one cached; an 8-token chunk needs the blocks of the hit's last chunk.
windowed_repeated_prompt_run = _repeated_local_prompt(
    SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 5),)), "a 5-token sliding window")
chunked_repeated_prompt_run = _repeated_local_prompt(
    SpecDraw("ChunkedLocalAttentionSpec", 4, (("attention_chunk_size", 8),)), "8-token attention chunks")


def eagle_shared_prefix_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Full attention (4-token blocks) under an async EAGLE drafter (k = 2):
    a 13-token prompt, then a 17-token one sharing its first 9 tokens; the
    second lookup reaches the 2 shared blocks and the drop leaves 1 (4
    tokens), as the index allows: no entry past the second proves the
    token after it."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=33)
    harness = SchedulerHarness(SchedulerDraw(
        layout, max_num_batched_tokens=32, max_num_seqs=2, model_runner="v1", async_scheduling=True,
        speculative_method="eagle", num_speculative_tokens=2, draft_acceptance=(1,)))
    run = Stepper(harness, checks)
    seen = []
    for prompt in (range(13), [*range(9), *[99] * 8]):
        rid = harness.add_request(prompt, max_tokens=2)
        seen += [a for a in run.step().admissions if a.request_id == rid]
        run.drain()
    last = seen[-1]
    assert last.index_hold == ((4, 8),) and last.hit_drops == (4,) and last.local_hit == 4, last.describe()
    return run


def eagle_three_specs_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Full attention, Mamba and an 8-token sliding window (4-token blocks,
    in that order) under an EAGLE drafter (k = 1), 4 tokens a step: a
    12-token prompt, then an 11-token one sharing its first 8. The hybrid
    coordinator's fixed point takes more than one pass on three specs; the
    second lookup hits 4 (each group holds 4 and 8: 8 would need the entry
    at 12 as its proof)."""
    groups = (SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4),
              SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 8),)))
    harness = SchedulerHarness(SchedulerDraw(
        LayoutDraw(groups, hash_block_size=4, num_blocks=65), max_num_batched_tokens=4, max_num_seqs=1,
        speculative_method="eagle", num_speculative_tokens=1, draft_acceptance=(1,)))
    run = Stepper(harness, checks)
    seen = []
    for prompt in (range(12), [*range(8), 900, 901, 902]):
        rid = harness.add_request(prompt, max_tokens=1)
        seen += [a for a in run.step().admissions if a.request_id == rid]
        run.drain()
    last = seen[-1]
    assert last.index_hold == ((4, 8),) * 3 and last.hit_drops == (4, 0, 4) and last.local_hit == 4, last.describe()
    return run


def eagle_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """:func:`speculating_harness`'s async EAGLE run (k = 3: the drafter
    writes 3 positions ahead of every step it drafts from), stepped with
    ``checks``."""
    harness = speculating_harness(True)
    assert harness.runner.lookahead == 3, harness.runner.lookahead
    run = Stepper(harness, checks)
    run.drain()
    return run


def decoding_events_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """KV events on, full attention (4-token blocks): a 13-token prompt
    decoding 6 tokens, so a block its decode fills is cached (and announced)
    after the prompt's three."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=9)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2, kv_events=True))
    run = Stepper(harness, checks)
    harness.add_request(range(13), max_tokens=6)
    run.drain()
    events = harness.observer.events
    assert events is not None and events.events_seen["BlockStored"] >= 2, events and events.events_seen
    return run


def windowed_decoding_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Async scheduling, full attention beside an 8-token sliding window
    (4-token blocks): one 10-token prompt decoding 12 tokens. Each decode
    step still in flight reads the window of its token while the next one
    is scheduled, and every block boundary the window crosses frees one."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 8),))),
                        hash_block_size=4, num_blocks=33)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2, async_scheduling=True))
    run = Stepper(harness, checks)
    harness.add_request(range(10), max_tokens=12)
    run.drain()
    return run


# Planted bugs on paths a fixed run reaches (the machine's derandomized
# search meets few preemptions during a step): (check, invariant, bug, run,
# the label the unmodified run shows, to prove it meets the case; None: the
# run always does).
def hybrid_twins_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Full attention and Mamba (align mode) of 4-token blocks, two requests
    for one 13-token prompt added together: the first computes it in one
    step, and vLLM holds the second back (a Mamba state cached in the step
    that writes it is not adopted in that step) until it can hit 12 tokens
    and start from the state there."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=4, num_blocks=40)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2))
    run = Stepper(harness, checks)
    first, second = harness.add_request(range(13), max_tokens=2), harness.add_request(range(13), max_tokens=2)
    scheduled = dict(run.step().num_scheduled)
    hits = []
    while second not in scheduled:
        step = run.step()
        scheduled, hits = dict(step.num_scheduled), [a.local_hit for a in step.admissions if a.request_id == second]
    run.drain()
    assert hits == [12] and first not in harness.live_request_ids, hits
    return run


def hybrid_tail_run(checks: tuple[Callable[..., None], ...]) -> Stepper:
    """Full attention and Mamba (align mode) of 4-token blocks, one-token
    hashes (sub-block hits): a 6-token prompt sent twice. The first stops
    its prefill at its partial-tail boundary (5), where vLLM caches the
    state under the 5-token key, then moves that entry to a copy before the
    next chunk writes on; the second hits those 5 tokens."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1, num_blocks=40)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=1))
    run = Stepper(harness, checks)
    hits = []
    for _ in range(2):
        rid = harness.add_request(range(6), max_tokens=3)
        hits += [a.local_hit for a in run.step().admissions if a.request_id == rid]
        run.drain()
    assert hits == [0, 5], hits
    return run


FIXED_CASES: list[tuple[Callable[..., None], str, str, Callable[..., Stepper], str | None]] = [
    (inv.check_stale_output_dropped, "stale-output-dropped", "delivers_stale_output", preempting_producer_run,
     STALE_OUTPUT),
    (inv.check_running_requests_progress, "running-request-progresses", "max_tokens_skip_unguarded", decoding_run,
     None),
    # What the cache announces (invariants/promises.py).
    (check_events_replay_index, "events-replay-index", "eviction_announces_nothing", evicting_events_run, None),
    (check_events_chain, "events-chain", "stored_event_names_itself_parent", decoding_events_run, None),
    (check_events_replay_index, "events-replay-index", "reset_announces_nothing", reset_events_run, None),
    (check_hits_within_namespace, "hits-within-namespace", "cache_salt_not_hashed", tenants_run, None),
    (check_hits_within_namespace, "hits-within-namespace", "lora_not_hashed", adapters_run, None),
    (check_hits_within_namespace, "hits-within-namespace", "embeds_not_hashed", embeddings_run, None),
    (check_hits_within_namespace, "hits-within-namespace", "mm_not_hashed", images_run, None),
    (check_hits_after_reset, "hits-after-reset", "reset_keeps_index", reset_run, None),
    (check_lookahead_allocated, "lookahead-allocated", "lookahead_not_allocated", eagle_run, None),
    (check_in_flight_reads_held, "in-flight-reads-held", "window_frees_in_flight", windowed_decoding_run, None),
    (check_preempted_resumable, "preempted-resumable", "preempt_keeps_computed_tokens", preempting_run,
     "preemption"),
    (check_preempted_resumable, "preempted-resumable", "preempt_keeps_drafts", speculating_preempting_run,
     "preemption"),
    (check_hit_matches_index, "hit-matches-index", "hit_stops_a_block_early", repeated_prompt_run, None),
    (check_hit_matches_index, "hit-matches-index", "window_hit_needs_a_block_more", windowed_repeated_prompt_run,
     None),
    (check_hit_matches_index, "hit-matches-index", "chunk_hit_stops_a_block_early", chunked_repeated_prompt_run,
     None),
    (check_hit_matches_index, "hit-matches-index", "eagle_drop_forgotten", eagle_shared_prefix_run, None),
    (check_hit_matches_index, "hit-matches-index", "eagle_drop_reapplied", eagle_three_specs_run, None),
    # What a Mamba state block holds (invariants/contents.py).
    (check_reads_written, "reads-written", "mamba_adopts_same_step_state", hybrid_twins_run, None),
    (check_index_written, "index-written", "mamba_tail_state_overwritten", hybrid_tail_run, None),
    # What the index names (invariants/contents.py).
    (check_index_names_its_prefix, "index-names-its-prefix", "evicted_key_stays_indexed", evicting_run, None),
    (check_eviction_order, "eviction-order", "free_evicts_head_first", evicting_run, CACHED_BLOCK_EVICTED),
]


@pytest.mark.parametrize(("check", "invariant", "bug", "run", "label"), FIXED_CASES,
                         ids=[f"{name}<-{bug}" for _, name, bug, *_ in FIXED_CASES])
def test_invariant_catches_planted_bug_in_a_fixed_run(
    check: Callable[..., None], invariant: str, bug: str, run: Callable[..., Stepper], label: str | None
) -> None:
    with planted_scheduler_bug(bug), pytest.raises(InvariantViolation) as caught:
        run((check,))
    assert caught.value.invariant == invariant, str(caught.value)
    # Unmodified vLLM satisfies it, on a run that meets the case.
    unmodified = run((check,))
    assert label is None or label in unmodified.labels
    assert not unmodified.harness.live_request_ids


def test_an_rswa_group_is_judged_as_full_attention() -> None:
    """R-SWA looks hits up as full attention: a lone R-SWA group (4-token
    blocks, a one-block decode window) sent one 12-token prompt twice has a
    prediction and hits 8 (the limit is 11), and the full-attention lookup
    planted to round its limit up to a whole block serves 12, a hit longer
    than the index allows."""
    def run(checks: tuple[Callable[..., None], ...]) -> Stepper:
        layout = LayoutDraw((SpecDraw("RSWASpec", 4, (("rswa_window", 4),)),), hash_block_size=4, num_blocks=33)
        stepper = Stepper(SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2)), checks)
        seen = []
        for _ in range(2):
            rid = stepper.harness.add_request(range(12), max_tokens=6)
            seen += [a for a in stepper.step().admissions if a.request_id == rid]
            stepper.drain()
        assert seen[-1].index_hold == ((4, 8, 12),) and seen[-1].local_hit == 8, seen[-1].describe()
        return stepper

    run((check_hit_matches_index,))
    with planted_scheduler_bug("lookup_rounds_limit_up"), pytest.raises(InvariantViolation) as caught:
        run((check_hit_matches_index,))
    assert caught.value.invariant == "hit-matches-index", str(caught.value)


def test_a_request_preempted_with_its_step_in_flight_is_resumable() -> None:
    """Async scheduling on a producer: vLLM preempts requests whose step is
    still running (their output placeholders are counted stale instead);
    right after each such schedule() the claim holds on unmodified vLLM."""
    run = preempting_producer_run((check_preempted_resumable,))
    assert STALE_OUTPUT in run.labels


# Planted bugs in speculative decoding's bookkeeping, shown on a fixed run
# that speculates (check, invariant, planted bug).
SPEC_DECODE_CASES: list[tuple[Callable[..., None], str, str]] = [
    (inv.check_rejected_drafts_rolled_back, "rejected-drafts-rolled-back", "rejected_drafts_stay_computed"),
    (inv.check_kv_matches_tokens, "kv-matches-tokens", "records_first_sampled_token"),
]


def _speculating_run(async_scheduling: bool):  # type: ignore[no-untyped-def]
    """:func:`speculating_harness` run to the end."""
    return speculating_harness(async_scheduling).drain(context="speculating")


def speculating_harness(async_scheduling: bool):  # type: ignore[no-untyped-def]
    """Full attention + Mamba (block 4, Mamba with 3 speculative state
    blocks), k = 3 drafts (ngram sync, EAGLE async), accepted 1, 0, 3, 2, ...
    in turn; two 10-token requests decoding 8 tokens each, added."""
    from fuzz.adapter import SchedulerHarness
    from fuzz.model import LayoutDraw, SchedulerDraw, SpecDraw

    layout = LayoutDraw(
        (SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4, (("num_speculative_blocks", 3),))),
        hash_block_size=4,
        num_blocks=41,
    )
    harness = SchedulerHarness(
        SchedulerDraw(
            layout=layout,
            max_num_batched_tokens=16,
            max_num_seqs=2,
            model_runner="v1",
            async_scheduling=async_scheduling,
            speculative_method="eagle" if async_scheduling else "ngram",
            num_speculative_tokens=3,
            draft_acceptance=(1, 0, 3, 2),
        )
    )
    harness.add_request(tuple(range(10)), max_tokens=8)
    harness.add_request(tuple(range(50, 60)), max_tokens=8)
    return harness


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("check", "invariant", "bug"), SPEC_DECODE_CASES)
def test_a_planted_spec_decode_bug_is_caught(
    check: Callable[..., None], invariant: str, bug: str, async_scheduling: bool
) -> None:
    steps = _speculating_run(async_scheduling)
    assert any(v.num_rejected for s in steps for v in s.draft_verifications), "no draft was rejected"
    assert not [v for s in steps for v in inv.step_violations(s, (check,))]
    with planted_scheduler_bug(bug):
        steps = _speculating_run(async_scheduling)
    found = [v for s in steps for v in inv.step_violations(s, (check,))]
    assert found and {v.invariant for v in found} == {invariant}, found


def test_every_planted_bug_is_used() -> None:
    used = {bug for *_, bug, _ in CASES} | {bug for *_, bug in MACHINE_CASES}
    used |= {bug for _, _, bug, *_ in FIXED_CASES} | {bug for *_, bug in SPEC_DECODE_CASES}
    # The ownership edits have their cases in tests/invariants/test_ownership_planted.py;
    # drafts_never_cut (a triage case) in tests/findings/test_triage_planted.py.
    expected = set(PLANTED_SCHEDULER_BUGS) - set(PLANTED_OWNERSHIP_BUGS) - {"drafts_never_cut"}
    # An ownership edit may show a contents claim too (mamba_adopts_same_step_state: reads-written).
    assert used - set(PLANTED_OWNERSHIP_BUGS) == expected, expected ^ used


# Checks shown catching a real vLLM bug instead of a planted one: unmodified
# vLLM already fails them (strict xfails and a passing control in
# tests/known_bugs/test_known_vllm_bugs_scheduler.py).
CAUGHT_REAL_BUG: dict[Callable[..., None], str] = {
    inv.check_copy_sources_ready: "same-step-cow-chain",
    # The failed-load placeholder's second consequence, pinned with a
    # synchronous control in tests/known_bugs/test_failed_load_output_placeholder.py.
    inv.check_kv_matches_tokens: "failed-sync-load-recompute-keeps-output-placeholder",
}


def test_every_scheduler_check_has_a_planted_case() -> None:
    checks = {c for c, *_ in CASES} | {c for c, *_ in MACHINE_CASES} | {c for c, *_ in FIXED_CASES}
    checks |= {c for c, *_ in SPEC_DECODE_CASES} | set(CAUGHT_REAL_BUG)
    # The ownership checks have their cases in tests/invariants/test_ownership_planted.py.
    expected = {*inv.STEP_CHECKS, *inv.ADMISSION_CHECKS, inv.check_no_leaked_blocks} - set(OWNERSHIP_CHECKS)
    assert checks == expected, expected ^ checks
    assert set(CAUGHT_REAL_BUG.values()) <= {b.id for b in KNOWN_BUGS if b.fixed_in is None}


@pytest.mark.parametrize(
    ("bug", "invariants"),
    [
        # Keeping a diverged hit without the fallback leaves the Mamba state
        # missing at the resume point, or, on a layout whose lagging group is
        # another must-cover one (sliding window), that group's blocks, or
        # (a Mamba group with no hit at all) makes allocate_slots assert
        # inside schedule(): with every check on, whichever the machine meets
        # first reports it.
        # (The ownership model sees the same missing state as a read of blocks
        # the request does not hold.) When the Mamba group's own hit is a
        # sub-block one in the block at the boundary's index (hit 18 of a
        # 24-token local part, 12-token blocks), that index holds a real
        # block and only diverged-falls-back, the claim about this very
        # fallback, sees it (met first once replays drew
        # skip_reading_prefix_cache and the mined constants changed).
        (
            "no_divergent_fallback",
            {"mamba-state-at-boundary", "local-part-covered", "no-exception", "read-blocks-held", "diverged-falls-back"},
        ),
        # Skipping the truncation keeps the sub-block tail's cached block in
        # the adopted blocks: the local part is miscounted, or, when the
        # external load past it fails, that block is inside the failed range
        # and keeps its hash (met first once the search ran without the
        # mined constants; the same op log on unmodified vLLM passes).
        ("skip_truncation", {"computed-adds-up", "failed-load-not-cached"}),
    ],
)
def test_state_machine_catches_planted_bug(bug: str, invariants: set[str]) -> None:
    """The stateful machine checks every invariant after every step too.
    (Without the constants Hypothesis mines from the loaded modules: with
    them, which example it meets first moved with any literal added to the
    suite.)"""
    machine_search = settings(SEARCH, max_examples=300, stateful_step_count=30)
    with planted_scheduler_bug(bug), _no_local_constants(), pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(target_scheduler.SchedulerMachine, settings=machine_search)
    assert caught.value.invariant in invariants, str(caught.value)
    # The planted edit is what breaks it: the same operations on unmodified
    # vLLM keep the claim.
    log = caught.value.oplog  # the shrunk run's, carried by its violation
    assert log is not None and _replay_checked(log, caught.value.invariant) is None, str(caught.value)


def test_the_machine_reports_the_first_violation_of_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a step raises, teardown steps no further: it used to serve what
    was queued and could raise a later, different violation in place of the
    first (seen: failed-load-not-cached at step 32 reported for a run whose
    step 31 broke computed-adds-up; that program then replayed to the other
    one and wrote no repro)."""
    from fuzz.runners import scheduler as runner

    steps: list[tuple[int, list[str]]] = []
    triage = runner.triage

    def recording(step, checks=None):  # type: ignore[no-untyped-def]
        unknown, known = triage(step, checks)
        steps.append((step.step, [v.invariant for v in unknown]))
        return unknown, known

    monkeypatch.setattr(runner, "triage", recording)
    machine_search = settings(SEARCH, max_examples=300, stateful_step_count=30)
    with planted_scheduler_bug("skip_truncation"), pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(target_scheduler.SchedulerMachine, settings=machine_search)
    last_run = steps[max(i for i, (n, _) in enumerate(steps) if n == 1):]
    broken = [(n, found) for n, found in last_run if found]
    assert len(broken) == 1, f"the last run stepped on after its first violation: {broken}"
    assert caught.value.invariant == broken[0][1][0], (broken, str(caught.value))


@pytest.mark.parametrize(
    ("check", "invariant", "bug"), MACHINE_CASES, ids=[f"{name}<-{bug}" for _, name, bug in MACHINE_CASES]
)
def test_state_machine_catches_planted_load_failure_bug(check: Callable[..., None], invariant: str, bug: str) -> None:
    """Failed loads come from the machine's fail_next_async_loads /
    fail_next_sync_loads rules; the check alone is run, so another claim
    the bug also breaks cannot hide it."""
    # A failed sync load needs a single-group layout (vLLM maps invalid block
    # ids back to requests only then) and the policy the bug is on: rarer.
    budget = 1500
    machine_search = settings(SEARCH, max_examples=budget, stateful_step_count=30)
    with (
        planted_scheduler_bug(bug),
        target_scheduler.checks_for_machine((check,)),
        _no_local_constants(),  # what else the session imported must not move the search
        pytest.raises(InvariantViolation) as caught,
    ):
        run_state_machine_as_test(target_scheduler.SchedulerMachine, settings=machine_search)
    assert caught.value.invariant == invariant, str(caught.value)


def test_a_window_group_dropping_an_adopted_block_is_no_cross_salt_hit() -> None:
    """Pinned from a 600 s campaign on unmodified vLLM (the claim then judged
    every adopted block): a lone sliding-window group (window 4, 2-token
    blocks); r10 and r11 (no salt) adopt blocks 1 and 3 from the prefix
    cache, then take external hits long enough that the window drops them
    (their tables hold the null block there), and the pool hands block 1,
    in the same step, to tenant a's r12, whose sync load fills it. No
    request reads a block of another salt: the claim holds."""
    layout = LayoutDraw(
        (SpecDraw("SlidingWindowSpec", 2, (("sliding_window", 4),)),), hash_block_size=2, num_blocks=13,
        max_model_len=24,
    )
    harness = SchedulerHarness(
        SchedulerDraw(layout, max_num_batched_tokens=4, max_num_seqs=3, long_prefill_token_threshold=1,
                      prefill_schedule_interval=4, async_scheduling=True, model_runner="v2",
                      kv_load_failure_policy="fail", divergent_hits=True)
    )
    run = Stepper(harness, (check_hits_within_namespace,))
    harness.add_request(range(131, 166, 7), max_tokens=1, reply=ExternalReply("zero"))
    harness.add_request(range(131, 173, 7), max_tokens=1)
    for _ in range(8):
        run.step()
    shared = [131, 138, 145, 152, 159]
    r10 = harness.add_request(shared + [166, 1000, 1000, 1001, 1000, 4512], max_tokens=4,
                              reply=ExternalReply("store", store_len=11))
    harness.add_request(shared + [3576, 3577, 3578, 3579], max_tokens=1, reply=ExternalReply("store", store_len=9))
    r12 = harness.add_request(shared + [166, 1000, 1000, 1001], max_tokens=1, reply=ExternalReply("saved"),
                              cache_salt="tenant-a")
    step = run.step()
    (adm,) = [a for a in step.admissions if a.request_id == r10]
    dropped = set(adm.alloc_local_blocks[0]) - set(adm.block_table[0])
    assert dropped, "the window kept every adopted block: the run no longer meets the case"
    assert dropped & set(harness.contents.tables[r12][0]), "no dropped block went to tenant a's request"
    run.drain()
