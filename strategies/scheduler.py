"""Strategies for the scheduler tier: configurations, prompts, connector replies.

Everything is built by construction:

* layouts come from :func:`strategies.specs.kv_cache_layouts` and are then made
  engine-realistic (:func:`engine_layout`): the engine sets
  ``cache_config.block_size`` to the smallest prefix-cacheable group block and
  a hybrid model's Mamba block size to that same value, so Mamba groups get
  the smallest block, with room under it for a finer ``prefix_match_unit``;
* prompts are slices of one shared token sequence (plus, rarely, their own
  tokens), so cache hits really happen and shrinking keeps them; their
  lengths put the last hash boundary inside a block, where vLLM registers
  the sub-block tail entries the external-hit branch is about;
* single-shot scenarios have a flavour (:data:`FLAVOURS`) that places the
  replay where the branch under test lives: past the last fill's tail entry
  (truncation) after a probe inside it (divergent-hit fallback);
* the external store's answer is drawn relative to the prompt it answers for
  (:func:`external_replies`), mostly honest and often longer than any local
  sub-block tail, so the external-hit branch is reached without filtering.

Hypothesis favours the ends of a drawn range and the first element of a
``sampled_from``: the common choice sits there, rare ones in between.
Shrinking goes towards the core hybrid case (full attention + Mamba), one
fill prompt, no shortcut evictions, and a connector holding the prompt.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from hypothesis import strategies as st

from fuzz.model import (
    Behaviour,
    ExternalReply,
    LayoutDraw,
    PromptDraw,
    SchedulerDraw,
    SpecDraw,
    classification_of_kind,
)
from strategies.specs import drawable_kinds, kv_cache_layouts

__all__ = [
    "engine_layout",
    "external_replies",
    "generation_lengths",
    "prefix_cache_skips",
    "prompt_draws",
    "scheduler_draws",
    "scheduler_layouts",
]

_CORE = ("FullAttentionSpec", "MambaSpec")


def _is_mamba(group: SpecDraw) -> bool:
    return classification_of_kind(group.kind).behaviour is Behaviour.MAY_BE_SHORT


def engine_layout(layout: LayoutDraw) -> LayoutDraw:
    """The layout as vLLM's engine would hand it to the scheduler.

    Whole-state (Mamba) groups take the smallest prefix-cacheable block size
    (vLLM sets ``mamba_block_size = cache_config.block_size`` in align mode,
    and the engine sets ``block_size`` to the smallest participating group
    block). The hash block is then halved (or, at 1, every block size and
    span doubled) until the Mamba block holds at least four hash units, so
    sub-block prefix-cache hits are possible.
    """
    if not any(_is_mamba(g) for g in layout.groups):
        return layout
    cacheable = [
        g.block_size
        for g in layout.groups
        if classification_of_kind(g.kind).behaviour is not Behaviour.SCRATCH
    ]
    smallest = min(cacheable or [g.block_size for g in layout.groups])
    groups = tuple(
        dataclasses.replace(g, block_size=smallest) if _is_mamba(g) else g for g in layout.groups
    )
    hash_bs = layout.hash_block_size
    # Room for sub-block hits: the Mamba block holds at least 4 hash units
    # (halve the unit while it can, else double every block and span).
    while len(groups) > 1 and smallest // hash_bs < 4:
        if hash_bs > 1:
            hash_bs //= 2
        else:
            groups = tuple(
                dataclasses.replace(g, block_size=2 * g.block_size, params=tuple((k, 2 * v) for k, v in g.params))
                for g in groups
            )
            smallest *= 2
    return dataclasses.replace(layout, groups=groups, hash_block_size=hash_bs)


def _one_block_size(layout: LayoutDraw) -> LayoutDraw:
    """Every group at the largest drawn block size (what a hybrid model gets
    when all its layers share ``cache_config.block_size``)."""
    largest = max(g.block_size for g in layout.groups)
    return dataclasses.replace(
        layout, groups=tuple(dataclasses.replace(g, block_size=largest) for g in layout.groups)
    )


@st.composite
def _uniform_or_not(draw: st.DrawFn, layouts: st.SearchStrategy[LayoutDraw]) -> LayoutDraw:
    layout = draw(layouts, label="drawn layout")
    # One in three share one block size (a hybrid whose layers all use
    # cache_config.block_size; the others model page-size-unified groups).
    if draw(st.sampled_from((False, True, False)), label="one block size"):
        layout = _one_block_size(layout)
    return engine_layout(layout)


# Kinds vLLM looks up with its full-attention manager (subclasses of
# FullAttentionSpec): a second group of one beside the core case is a second
# full-attention-type group, which the coordinator's per-group lookup does
# not take as its reference (only the first is).
_SECOND_FULL_ATTENTION = ("FullAttentionSpec", "MLAAttentionSpec", "HiddenStateCacheSpec")
# Full attention layers interleaved with sliding-window ones (and, drawn
# from the same two kinds, a third group of another page size).
_WINDOWED_HYBRID = ("FullAttentionSpec", "SlidingWindowSpec")


@functools.cache
def scheduler_layouts(
    *, weights: tuple[int, int, int, int, int, int] = (1, 0, 0, 0, 0, 0)
) -> st.SearchStrategy[LayoutDraw]:
    """Engine-realistic layouts (:func:`engine_layout`), drawn from six
    families with relative ``weights`` (default: the core case only):
    exactly full attention + Mamba (the core case), full attention + Mamba +
    one or two other groups, any 1-4 group layout of every drawable kind,
    one group of any kind (a pure attention or pure recurrent model: the
    only layout whose connector may report failed loads block by block, as
    vLLM maps ``invalid_block_ids`` to requests for one group only), and
    the core case plus a second full-attention-type group (full attention
    of another page size, MLA, a hidden-state cache), whose per-group hit
    may lag the first's, and full attention beside a sliding window (the
    layout of Gemma 2 and 3, gpt-oss, Mistral's windowed models), with in
    about a third of them a third group of either kind on another page size
    (an EAGLE drafter's own layers, Gemma 4's global and local head sizes).
    One in three layouts puts every group on one block size, as a hybrid
    model whose layers share ``cache_config.block_size`` does.

    Shrinks to a two-group full attention + Mamba layout on one block size.
    """
    if len(weights) != 6 or min(weights) < 0 or not sum(weights):
        raise ValueError(f"weights={weights} must be six non-negative counts, not all 0")
    seconds = tuple(k for k in _SECOND_FULL_ATTENTION if k in drawable_kinds())
    families = (
        kv_cache_layouts(min_groups=2, max_groups=2, required=_CORE),
        kv_cache_layouts(min_groups=3, max_groups=4, required=_CORE),
        kv_cache_layouts(min_groups=1, max_groups=4),
        kv_cache_layouts(min_groups=1, max_groups=1),
        st.sampled_from(seconds).flatmap(
            lambda k: kv_cache_layouts(min_groups=3, max_groups=3, required=(*_CORE, k))
        ),
        kv_cache_layouts(kinds=_WINDOWED_HYBRID, min_groups=2, max_groups=3, required=_WINDOWED_HYBRID),
    )
    picks = [i for i, w in enumerate(weights) for _ in range(w)]
    return st.sampled_from(picks).flatmap(lambda i: _uniform_or_not(families[i]))


@st.composite
def _scheduler_draws(
    draw: st.DrawFn,
    layouts: st.SearchStrategy[LayoutDraw],
    asynchronous: bool = False,
    producers: bool = False,
    speculative: bool = False,
    drafters: tuple[str, ...] = ("ngram", "eagle"),
    speculating_only: bool = False,
    asynchronous_only: bool = False,
) -> SchedulerDraw:
    layout = draw(layouts, label="layout")
    s = layout.scheduler_block_size
    # Small budgets force chunked prefill and make prompts re-enter schedule().
    budget = draw(
        st.one_of(st.integers(1, 6).map(lambda k: k * s), st.integers(4, 6 * s)),
        label="max_num_batched_tokens",
    )
    budget = max(budget, 4)
    seqs = draw(st.integers(1, 4), label="max_num_seqs")
    threshold = draw(st.one_of(st.just(0), st.integers(1, max(1, budget))), label="long_prefill_token_threshold")
    # Three in four connectors complete divergent hits (the capability the
    # external-hit branch and its fallback are about).
    divergent = draw(st.sampled_from((True, True, False, True)), label="supports_divergent_local_hybrid_hits")
    policy = draw(st.sampled_from(("fail", "recompute")), label="kv_load_failure_policy")
    # Both model runners are real deployments (vLLM picks V1 for many hybrid
    # models, V2 elsewhere); they report resumed requests differently.
    runner = draw(st.sampled_from(("v2", "v1")), label="model_runner")
    # Async scheduling is the engine's default; half the draws (when asked),
    # drawn last so the other fields shrink as before. Shrinks to sync.
    async_scheduling = asynchronous and (asynchronous_only or draw(st.booleans(), label="async_scheduling"))
    # One async draw in four is a P/D prefill instance's connector
    # (kv_producer): vLLM then frees blocks at once and may preempt a request
    # whose step is in flight (its stale output). Its requests get no
    # external hit (a producer never loads). Shrinks to kv_both.
    producer = producers and async_scheduling and draw(st.integers(0, 3), label="kv_producer") == 2
    spec = (
        _speculation(draw, layout, async_scheduling, budget, runner, drafters, speculating_only)
        if speculative
        else {"layout": layout}
    )
    return SchedulerDraw(
        layout=spec.pop("layout"),
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        long_prefill_token_threshold=spec.pop("long_prefill_token_threshold", threshold),
        divergent_hits=divergent,
        kv_load_failure_policy=policy,
        model_runner=runner,
        async_scheduling=async_scheduling,
        kv_role="kv_producer" if producer else "kv_both",
        **spec,
    )


def _speculation(
    draw: st.DrawFn,
    layout: LayoutDraw,
    async_scheduling: bool,
    budget: int,
    runner: str,
    drafters: tuple[str, ...],
    always: bool = False,
) -> dict[str, Any]:
    """One configuration in four speculates (drawn last: the draws before it
    are those of a configuration without it; shrinks to none), with k = 1-4
    speculative tokens: "ngram" (prompt lookup; vLLM refuses it with async
    scheduling on the V1 runner) or "eagle" (refused by a layout with a group
    whose manager refuses the EAGLE drop; its k lookahead slots must leave
    room for a token: k < max_num_batched_tokens), and an acceptance schedule of 1-4
    counts in 0..k; one in three of them caps long prefills at 1..k. A
    Mamba group's spec then holds k speculative state
    blocks (vLLM's ``MambaBase.get_kv_cache_spec``: ``num_speculative_blocks
    = num_speculative_tokens``). With ``always``, every configuration a
    drafter accepts speculates."""
    methods = tuple(
        m
        for m, ok in (
            ("ngram", not async_scheduling or runner == "v2"),
            ("eagle", not any(classification_of_kind(g.kind).refuses_eagle_drop for g in layout.groups)),
        )
        if ok and m in drafters
    )
    if not methods or (not always and draw(st.integers(0, 3), label="speculative decoding (3: on)") != 3):
        return {"layout": layout}
    method = draw(st.sampled_from(methods), label="speculative method")
    k = draw(st.integers(1, 4 if method == "ngram" else min(4, budget - 1)), label="num_speculative_tokens")
    acceptance = tuple(draw(st.lists(st.integers(0, k), min_size=1, max_size=4), label="drafts accepted per verification"))
    # One speculating configuration in three caps long prefills within the
    # draft width (--long-prefill-token-threshold 1..k): vLLM validates
    # neither flag against the other, and a threshold below 1 + k cuts the
    # waiting requests it pads to a spec-decode step. Shrinks to the
    # threshold drawn before.
    narrow = draw(st.integers(0, 2), label="long-prefill threshold within the draft width (2: yes)") == 2
    cap = {"long_prefill_token_threshold": draw(st.integers(1, k), label="narrow threshold")} if narrow else {}
    fields = [classification_of_kind(g.kind).speculative_blocks for g in layout.groups]
    groups = tuple(
        g if field is None else dataclasses.replace(g, params=g.params + ((field, k),))
        for g, field in zip(layout.groups, fields)
    )
    return {
        "layout": dataclasses.replace(layout, groups=groups),
        "speculative_method": method,
        "num_speculative_tokens": k,
        "draft_acceptance": acceptance,
        **cap,
    }


@functools.cache
def _default_scheduler_draws() -> st.SearchStrategy[SchedulerDraw]:
    return _scheduler_draws(scheduler_layouts())


def scheduler_draws(
    *,
    layouts: st.SearchStrategy[LayoutDraw] | None = None,
    asynchronous: bool = False,
    producers: bool = False,
    speculative: bool = False,
    drafters: tuple[str, ...] = ("ngram", "eagle"),
    speculating_only: bool = False,
    asynchronous_only: bool = False,
) -> st.SearchStrategy[SchedulerDraw]:
    """Scheduler configurations over ``layouts`` (default
    :func:`scheduler_layouts`): token budget ``max_num_batched_tokens`` from 4
    to six scheduler blocks, 1-4 sequences, an optional long-prefill
    threshold, the connector's ``supports_divergent_local_hybrid_hits`` and
    the KV-load failure policy (``fail`` evicts invalid blocks) and the model
    runner the scheduler serves (V1 or V2); with ``asynchronous``, also
    async scheduling (``AsyncScheduler`` driven as the engine's batch queue
    drives it) for about half the draws; with ``producers`` as well, one
    async draw in four is a P/D prefill instance's connector
    (``kv_role="kv_producer"``), whose requests must then get no external hit;
    with ``speculative``, speculative decoding for about one in four
    (:func:`_speculation`) by one of ``drafters`` (with ``speculating_only``,
    every draw a drafter accepts); with ``asynchronous_only``, every draw
    asynchronous.
    Shrinks towards the smallest budget, a divergent-capable connector and
    synchronous scheduling.
    """
    if asynchronous or speculative:
        return _scheduler_draws(
            scheduler_layouts() if layouts is None else layouts, asynchronous, producers, speculative, drafters,
            speculating_only, asynchronous_only,
        )
    return _scheduler_draws(layouts) if layouts is not None else _default_scheduler_draws()


@st.composite
def _external_replies(draw: st.DrawFn, num_tokens: int, kinds: tuple[str, ...], allow_async: bool) -> ExternalReply:
    kind = draw(st.sampled_from(kinds), label="reply kind")
    if kind == "zero":
        return ExternalReply("zero")
    if kind == "over":
        return ExternalReply("over", extra=draw(st.integers(0, 3), label="over-report extra"))
    if kind == "saved":
        load_async = allow_async and draw(st.integers(0, 7), label="async load") in (2, 5)
        return ExternalReply("saved", load_async=load_async)
    # Mostly the whole prompt (the external store outlives the local pool).
    whole = draw(st.sampled_from((True, False, True, True)), label="store holds the whole prompt")
    store_len = num_tokens if whole else draw(st.integers(0, num_tokens), label="store holds")
    # One load in four is asynchronous (WAITING_FOR_REMOTE_KVS). Hypothesis
    # favours range ends, so the rare outcomes sit inside the range.
    load_async = allow_async and draw(st.integers(0, 7), label="async load") in (2, 5)
    undecided = draw(st.integers(1, 2), label="undecided asks") if kind == "undecided" else 0
    return ExternalReply(kind, store_len=store_len, undecided=undecided, load_async=load_async)


@functools.cache
def external_replies(
    num_tokens: int,
    *,
    allow_over: bool = True,
    allow_async: bool = True,
    often_zero: bool = False,
    saved: bool = False,
) -> st.SearchStrategy[ExternalReply]:
    """What the external store answers for a prompt of ``num_tokens`` tokens.

    Mostly honest: the store holds a prefix of the prompt (often all of it,
    so the reply exceeds any local sub-block tail), sometimes nothing,
    sometimes "cannot decide yet" for a few asks. With ``allow_over`` it
    occasionally over-reports (the rest of the prompt plus ``extra``), which
    a correct scheduler must refuse loudly or survive. With ``often_zero``
    three answers in four find nothing. With ``saved`` about one answer in
    three comes from the connector's own store of what this scheduler's
    finished requests computed (``"saved"``; only a run with several
    requests has one). Shrinks to a store holding the whole prompt (``zero``
    with ``often_zero``).
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens={num_tokens} < 1")
    # Relative weights: store 14, undecided 2, zero 2, over 1 (if allowed);
    # the common answer at both ends, as Hypothesis favours the ends.
    kinds = (
        ("store", "store", "undecided", "store", "zero", "store", "store", "store", "store")
        + (("over",) if allow_over else ())
        + ("store", "store", "undecided", "store", "store", "store", "zero", "store", "store")
    )
    if often_zero:  # three misses in four
        kinds = ("zero", "store", "zero", "zero", "undecided", "zero", "zero", "zero")
    if saved:
        kinds += ("saved",) * (len(kinds) // 2)
    return _external_replies(num_tokens, kinds, allow_async)


@st.composite
def _tail_replies(draw: st.DrawFn, num_tokens: int) -> ExternalReply:
    """The store holds the whole prompt; asked once or after an "undecided";
    loaded synchronously or (one in four) asynchronously."""
    undecided = draw(st.sampled_from((0, 0, 1, 0, 2, 0)), label="undecided asks")
    load_async = draw(st.integers(0, 7), label="async load") in (2, 5)
    kind = "undecided" if undecided else "store"
    return ExternalReply(kind, store_len=num_tokens, undecided=undecided, load_async=load_async)


def prefix_cache_skips() -> st.SearchStrategy[bool]:
    """Whether a request sets ``SamplingParams(skip_reading_prefix_cache=True)``
    (it then reads neither the local prefix cache nor an external hit): one
    request in eight. Drawn inside the range (Hypothesis favours its ends);
    shrinks to False."""
    return st.integers(0, 7).map(lambda k: k == 3)


def generation_lengths(block_size: int) -> st.SearchStrategy[int]:
    """How many tokens a request generates (``max_tokens``): one request in
    four decodes up to two scheduler blocks past its prompt (at least 4, at
    most 32 tokens), so windows slide during decode, a prompt's partial tail
    block fills and is promoted, tables grow, and preemption and speculation
    meet long decodes; the others 1-4 (the prefill paths). Shrinks toward 1."""
    longest = max(4, min(2 * block_size, 32))
    short = st.integers(1, 4)
    return st.one_of(short, short, short, st.integers(1, longest))


@st.composite
def _prompt_draws(
    draw: st.DrawFn,
    shared_len: int,
    block: int,
    unit: int,
    replies: bool,
    allow_over: bool,
    label: str,
) -> PromptDraw:
    # The prefix is whole blocks plus a remainder r. vLLM registers a
    # sub-block tail entry at the prompt's last hash boundary below its last
    # token, floor((len - 1) / unit) * unit, when that lies past the last
    # full block: r in [unit + 1, block - 1] does that (the partial hits the
    # external-hit branch needs); r = 0 ends on a block boundary.
    blocks = draw(st.integers(2, max(2, shared_len // block - 2)), label=f"{label} prefix blocks")
    mid_block = unit + 1 < block and draw(st.sampled_from((True, False, True, True)), label=f"{label} tail mid-block")
    rem = draw(st.integers(unit + 1, block - 1), label=f"{label} remainder") if mid_block else 0
    prefix = min(shared_len, blocks * block + rem)
    # Mostly no own suffix: a pure shared prefix is what a later prompt can
    # hit all the way to its sub-block tail.
    own = draw(st.sampled_from((False, True, False, False)), label=f"{label} has own suffix")
    suffix = draw(st.integers(1, 2 * block), label=f"{label} suffix") if own else 0
    max_tokens = draw(generation_lengths(block), label=f"{label} max_tokens")
    reply = (
        draw(external_replies(prefix + suffix, allow_over=allow_over), label=f"{label} reply")
        if replies
        else ExternalReply()
    )
    return PromptDraw(prefix, suffix, max_tokens, reply)


@functools.cache
def prompt_draws(
    *,
    shared_len: int,
    block: int,
    unit: int = 1,
    replies: bool = True,
    allow_over: bool = True,
    label: str = "prompt",
) -> st.SearchStrategy[PromptDraw]:
    """Prompts sharing a prefix of a ``shared_len``-token sequence: whole
    ``block``-token blocks plus a remainder that mostly leaves the last
    ``unit``-token hash boundary inside a block, then rarely own tokens.

    With ``replies`` the connector's answer for the prompt is drawn too
    (:func:`external_replies`); otherwise it finds nothing. Shrinks to a
    one-token prefix, ``max_tokens=1`` and no external hit.
    """
    if shared_len < 2 * block or block < 1 or unit < 1:
        raise ValueError(f"need shared_len >= 2 * block >= 2 and unit >= 1, got {shared_len=} {block=} {unit=}")
    return _prompt_draws(shared_len, block, unit, replies, allow_over, label)


def _spare_blocks(need: int) -> st.SearchStrategy[int]:
    """Blocks beyond one request's need: one pool in three is tight (LRU
    eviction and preemption), the others roomy enough to keep what earlier
    prompts cached (tails are freed, so evicted, first)."""
    return st.sampled_from((False, True, False)).flatmap(
        lambda tight: st.integers(0, need) if tight else st.integers(need, 3 * need)
    )


def _blocks_needed(layout: LayoutDraw, num_tokens: int) -> int:
    """Roughly the blocks one request of ``num_tokens`` holds: one per block
    of every token-proportional group, a few per whole-state group."""
    return sum(3 if _is_mamba(g) else -(-num_tokens // g.block_size) for g in layout.groups)
