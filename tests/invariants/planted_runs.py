"""The fixed runs that show planted scheduler bugs caught, and which run
shows which bug (:data:`PLANTED_RUNS`).

Each run builds a :class:`fuzz.adapter.SchedulerHarness` on a small layout,
sends a few requests and steps it to the end with the checks it is handed.
The check a run is shown with is the one whose row in
:data:`invariants.table.INVARIANTS` names the plant: a plant shown on a
fixed run is one entry here, and the self-tests
(``tests/invariants/test_scheduler_planted.py``) and repro tests
(``tests/findings/test_scheduler_repro_runs.py``) derive their cases from it.
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.adapter import SchedulerHarness
from fuzz.model import LayoutDraw, SchedulerDraw, SpecDraw
from fuzz.runners.scheduler import CACHED_BLOCK_EVICTED, STALE_OUTPUT, Stepper
from invariants.table import INVARIANTS, Invariant


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


# Planted bug -> the fixed run that shows it caught, and a label the run
# on unmodified vLLM must carry to meet the case (None: any run does). The
# check is the one of the table row that names the plant.
PLANTED_RUNS: dict[str, tuple[Callable[..., Stepper], str | None]] = {
    "delivers_stale_output": (preempting_producer_run, STALE_OUTPUT),
    "max_tokens_skip_unguarded": (decoding_run, None),
    # What the cache announces (invariants/promises.py).
    "eviction_announces_nothing": (evicting_events_run, None),
    "stored_event_names_itself_parent": (decoding_events_run, None),
    "reset_announces_nothing": (reset_events_run, None),
    "cache_salt_not_hashed": (tenants_run, None),
    "lora_not_hashed": (adapters_run, None),
    "embeds_not_hashed": (embeddings_run, None),
    "mm_not_hashed": (images_run, None),
    "reset_keeps_index": (reset_run, None),
    "lookahead_not_allocated": (eagle_run, None),
    "window_frees_in_flight": (windowed_decoding_run, None),
    "preempt_keeps_computed_tokens": (preempting_run, "preemption"),
    "preempt_keeps_drafts": (speculating_preempting_run, "preemption"),
    # How long a hit each lookup serves, which cached blocks survive (invariants/hits.py).
    "hit_stops_a_block_early": (repeated_prompt_run, None),
    "window_hit_needs_a_block_more": (windowed_repeated_prompt_run, None),
    "chunk_hit_stops_a_block_early": (chunked_repeated_prompt_run, None),
    "eagle_drop_forgotten": (eagle_shared_prefix_run, None),
    "eagle_drop_reapplied": (eagle_three_specs_run, None),
    "free_evicts_head_first": (evicting_run, CACHED_BLOCK_EVICTED),
    # What a Mamba state block holds, what the index names (invariants/contents.py).
    "mamba_adopts_same_step_state": (hybrid_twins_run, None),
    "mamba_tail_state_overwritten": (hybrid_tail_run, None),
    "evicted_key_stays_indexed": (evicting_run, None),
}
# A plant more than one row names: the row its run shows (the other row's
# case is elsewhere: same-step-hazard's in tests/invariants/test_ownership_planted.py).
SHOWN_AS = {"mamba_adopts_same_step_state": "reads-written"}


def shown_on_runs() -> dict[str, tuple[Callable[..., Stepper], str | None, Invariant]]:
    """:data:`PLANTED_RUNS` with the scheduler row each plant is shown failing."""
    out = {}
    for bug, (run, label) in PLANTED_RUNS.items():
        rows = [row for row in INVARIANTS if row.tier == "scheduler" and bug in row.planted
                and SHOWN_AS.get(bug, row.name) == row.name]
        assert len(rows) == 1, f"{bug}: named by the rows {[r.name for r in rows]}; say which in SHOWN_AS"
        out[bug] = (run, label, rows[0])
    return out
