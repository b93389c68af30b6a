"""Single-shot scenarios for the scheduler tier: fills, a probe and a
replay with a drawn external answer, each flavour (:data:`FLAVOURS`)
placing the replay where the branch under test lives: past the last fill's
tail entry (truncation), inside it (divergent-hit fallback), twins admitted
in one step, a pool sized at the admission estimate. Built by construction
from :mod:`strategies.scheduler`'s layouts, configurations, prompts and
replies; shrinks to one fill, the first flavour and no eviction."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from fuzz.model import ExternalReply, LayoutDraw, PromptDraw, SchedulerDraw, SingleShotScenario, SpecDraw
from strategies.scheduler import (
    _blocks_needed,
    _is_mamba,
    _spare_blocks,
    _tail_replies,
    external_replies,
    generation_lengths,
    prefix_cache_skips,
    prompt_draws,
    scheduler_draws,
)

__all__ = ["FLAVOURS", "PREEMPTED_THEN_RESUMED", "single_shot_scenarios"]


def _admission_estimate(layout: LayoutDraw, num_tokens: int) -> int:
    """The blocks vLLM's admission check asks of an idle pool for a request
    of ``num_tokens`` tokens loading all but its last token synchronously
    from the store: one per block of every token-proportional group (cached
    hits on an idle pool are evictable, so they count), one for a whole-state
    (Mamba) group's running state."""
    return sum(1 if _is_mamba(g) else -(-num_tokens // g.block_size) for g in layout.groups)


def _mid_block_end(after: int, block: int, blocks_ahead: int, rem: int) -> int:
    """A prompt length past ``after`` whose last hash boundary lies inside a
    block: ``blocks_ahead`` whole blocks on, plus remainder ``rem``."""
    length = (after // block + blocks_ahead) * block + rem
    return length if length > after else length + block


@st.composite
def _conversation(
    draw: st.DrawFn, n: int, shared_len: int, block: int, unit: int, replies: bool
) -> tuple[PromptDraw, ...]:
    """``n`` prompts, each extending the one before past its sub-block tail
    entry (a multi-turn conversation): every prompt after the first meets
    its predecessor's tail entry."""
    prompts: list[PromptDraw] = []
    length = 0
    mid = unit + 1 < block
    for i in range(n):
        ahead = draw(st.integers(1 if i == 0 else 0, 2), label=f"fill[{i}] blocks ahead")
        rem = draw(st.integers(unit + 1, block - 1), label=f"fill[{i}] remainder") if mid else 0
        length = min(shared_len, _mid_block_end(length, block, ahead, rem))
        max_tokens = draw(st.integers(1, 3), label=f"fill[{i}] max_tokens")
        reply = (
            draw(external_replies(length, allow_over=False), label=f"fill[{i}] reply")
            if replies
            else ExternalReply()
        )
        prompts.append(PromptDraw(length, 0, max_tokens, reply))
    return tuple(prompts)


@st.composite
def _free_prompts(
    draw: st.DrawFn, n: int, shared_len: int, block: int, unit: int, replies: bool
) -> tuple[PromptDraw, ...]:
    """``n`` prompts anywhere on the shared sequence, some with own tokens."""
    return tuple(
        draw(prompt_draws(shared_len=shared_len, block=block, unit=unit, replies=replies, allow_over=False, label=f"fill[{i}]"))
        for i in range(n)
    )


# How the replay relates to the fills: "tail" extends the longest fill past
# its sub-block tail entry (the truncation branch), after a probe request
# that stops inside it; "inside" stops the replay inside it (where only some
# groups kept state: the divergent-hit fallback); "twins" submits two or
# three identical replays two blocks past the tail entry, mostly with no
# external answer, with the token budget and sequence cap to admit them all
# in one step (all take the same sub-block hit: same-step copy-on-write);
# "load" is a tail whose replay loads synchronously into a pool sized at its
# admission estimate (Mamba layouts); "free" places everything anywhere.
FLAVOURS = ("tail", "inside", "free", "twins", "load")


@st.composite
def _single_shots(
    draw: st.DrawFn,
    configs: st.SearchStrategy[SchedulerDraw],
    max_fills: int,
    shortcut: bool,
    allow_over: bool,
    flavours: tuple[str, ...],
) -> SingleShotScenario:
    flavour = flavours[draw(st.integers(0, len(flavours) - 1), label="flavour")]
    config = draw(configs, label="config")
    layout = config.layout
    s = layout.scheduler_block_size
    unit = layout.hash_block_size
    shared_len = 8 * s
    seed = draw(st.integers(0, 999), label="token seed")
    n_fills = draw(st.integers(1, max_fills), label="fills")
    # Fills that load from the store leave full-attention blocks but no Mamba
    # state behind: that starves a later local hit (so the tail flavour's
    # fills compute locally) and makes hits diverge (half the inside
    # flavour's fills load).
    if flavour in ("tail", "twins", "load"):
        fill_replies = False
    elif flavour == "inside":
        fill_replies = draw(st.booleans(), label="fills consult the connector")
    else:
        fill_replies = draw(st.sampled_from((False, True, False)), label="fills consult the connector")
    if flavour == "free":
        fills = draw(_free_prompts(n_fills, shared_len, s, unit, fill_replies))
    else:
        fills = draw(_conversation(n_fills, shared_len, s, unit, fill_replies))
    concurrent = draw(st.sampled_from((False, True, False)), label="concurrent fills")
    longest = max(p.prefix for p in fills)
    probe = None
    if flavour in ("tail", "load"):
        # Before the tail replay, a request that stops inside the last fill,
        # where only some groups kept state, mostly with no external answer.
        back = draw(st.integers(1, s), label="probe offset")
        at = max(1, longest - min(back, max(1, longest - s)))
        probe = PromptDraw(
            at,
            0,
            draw(st.integers(1, 3), label="probe max_tokens"),
            draw(external_replies(at, allow_over=False, often_zero=True), label="probe reply"),
        )
    # The load flavour on a Mamba layout: the replay ends one token past a
    # block end and loads all the rest synchronously (the loaded state and
    # the running state then sit in different Mamba blocks), into a pool
    # whose free blocks are its admission estimate (mostly), or one block
    # either side (the estimate is this module's arithmetic, not vLLM's).
    # Without a Mamba group it is a tail replay.
    at_estimate = flavour == "load" and any(_is_mamba(g) for g in layout.groups)
    delta = draw(st.integers(1, s), label="replay offset")
    if at_estimate:
        end = (longest // s + 1) * s + 1
        prefix = min(shared_len, end)
        suffix = end - prefix
    elif flavour == "twins":
        # Past the next block end (the copies then fill the hit's block).
        end = longest + delta + 2 * s
        prefix = min(shared_len, end)
        suffix = end - prefix
    elif flavour in ("tail", "load"):
        prefix, suffix = min(shared_len, longest + delta), 0
    elif flavour == "inside":
        prefix, suffix = max(1, longest - min(delta, max(1, longest - s))), 0
    else:
        prefix = draw(st.integers(s, shared_len), label="replay prefix")
        suffix = draw(st.integers(0, 2 * s), label="replay suffix")
    n = prefix + suffix
    # The tail replay finds the store holding its prompt (the answer then
    # exceeds the sub-block tail); the inside replay mostly finds nothing
    # (no external tokens behind a deeper hit); the free one anything.
    if at_estimate:
        undecided = draw(st.sampled_from((0, 0, 1)), label="undecided asks")
        reply = ExternalReply("undecided" if undecided else "store", store_len=n, undecided=undecided)
    elif flavour in ("tail", "load"):
        reply = draw(_tail_replies(n), label="replay reply")
    else:
        reply = draw(
            external_replies(n, allow_over=allow_over and flavour != "twins", often_zero=flavour != "free"),
            label="replay reply",
        )
    # One tail, inside or free replay in eight skips the prefix cache: the
    # store and the cache then hold what it must not read. (The twins and
    # load flavours build bug states out of the replay's hit: no skip.)
    skip = flavour in ("tail", "inside", "free") and draw(prefix_cache_skips(), label="replay skips prefix cache")
    replay = PromptDraw(prefix, suffix, draw(generation_lengths(s), label="replay max_tokens"), reply, skip)
    if flavour == "twins":
        # Two or three copies, all admitted in the step they arrive: a
        # sequence each and the token budget for all their prompts.
        copies = draw(st.integers(2, 3), label="replay copies")
        config = dataclasses.replace(
            config,
            max_num_seqs=max(config.max_num_seqs, copies),
            max_num_batched_tokens=max(config.max_num_batched_tokens, copies * n),
        )
    else:
        # One replay in four comes with an identical twin in the same step.
        copies = 2 if draw(st.integers(0, 3), label="replay twin") == 2 else 1
    # A pool from just big enough for the largest request to roomy: small
    # pools make LRU eviction, preemption and churn real.
    need = _blocks_needed(layout, max(p.prefix + p.suffix + p.max_tokens for p in (*fills, replay)))
    if flavour == "twins":
        num_blocks = 1 + 3 * copies * need + draw(st.integers(0, need), label="spare blocks")
    elif at_estimate:
        off = draw(st.sampled_from((0, 1, 0, -1, 0)), label="free blocks minus estimate")
        num_blocks = max(2, 1 + _admission_estimate(layout, n) + off)
    else:
        num_blocks = 1 + need + draw(_spare_blocks(need), label="spare blocks")
    config = dataclasses.replace(config, layout=dataclasses.replace(config.layout, num_blocks=num_blocks))
    evict_from = None
    if shortcut and draw(st.integers(0, 7), label="use evict shortcut") in (2, 5):
        evict_from = tuple(
            draw(st.one_of(st.none(), st.integers(0, 6)), label=f"evict_from[{g}]")
            for g in range(len(layout.groups))
        )
    return SingleShotScenario(config, shared_len, seed, fills, concurrent, evict_from, replay, flavour, probe, copies)


def single_shot_scenarios(
    *,
    configs: st.SearchStrategy[SchedulerDraw] | None = None,
    max_fills: int = 3,
    shortcut: bool = True,
    allow_over: bool = True,
    flavours: dict[str, int] | None = None,
) -> st.SearchStrategy[SingleShotScenario]:
    """Single-shot scheduler scenarios: ``1..max_fills`` fill prompts sharing
    prefixes with a replay prompt, run to completion (one by one or
    together), then the replay with a drawn external answer.

    ``flavours`` weighs how the replay relates to the fills (default
    ``{"tail": 3, "inside": 1}``): "tail" fills form a conversation, a probe
    request stops inside the last turn (mostly with no external answer) and
    the replay extends the last turn past its sub-block tail entry; "load"
    is a tail whose replay (on a Mamba layout) ends one token past a block
    end and loads the rest synchronously into a pool sized at its admission
    estimate (+-1); "inside" stops the replay inside it, mostly with no
    external answer; "twins" submits two or three copies of a replay two
    blocks past the tail entry, mostly with no external answer, all admitted
    in one step; "free" puts fills and replay anywhere. ``allow_over`` lets the inside and free
    replays over-report. With ``shortcut`` one scenario in four also evicts
    hand-picked blocks per group before the replay (a search shortcut,
    labelled so). Shrinks to one fill, the first flavour and no eviction.
    """
    if max_fills < 1:
        raise ValueError(f"max_fills={max_fills} < 1")
    weights = flavours if flavours is not None else {"tail": 3, "inside": 1}
    unknown = set(weights) - set(FLAVOURS)
    if unknown or not weights or min(weights.values()) < 1:
        raise ValueError(f"flavours={weights}: need positive weights for kinds in {FLAVOURS}")
    # The first flavour at both ends of the drawn index (Hypothesis favours
    # range ends), the others spread between.
    first, *rest = weights
    picks = [first] * weights[first] + [k for k in rest for _ in range(weights[k])]
    picks = picks[: weights[first] // 2 + 1] + picks[weights[first] :] + picks[weights[first] // 2 + 1 : weights[first]]
    return _single_shots(
        configs if configs is not None else scheduler_draws(), max_fills, shortcut, allow_over, tuple(picks)
    )


# An explicit example of the single-shot target (fuzz/targets/target_scheduler.py).
_NO_HIT = ExternalReply(kind="zero", store_len=0, undecided=0, extra=0, load_async=False)

# Shrunk on vLLM 0.29.0 (a suite defect, not a vLLM bug: see
# tests/harness/test_scheduler_resumed_requests.py): two concurrent fills in an
# 8-block pool; with the V1 model runner the second is preempted while the
# first decodes, then resumes with a local hit and is reported among the
# cached requests of the SchedulerOutput.
PREEMPTED_THEN_RESUMED = SingleShotScenario(
    config=SchedulerDraw(
        layout=LayoutDraw(
            (SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1, num_blocks=8
        ),
        max_num_batched_tokens=4,
        max_num_seqs=2,
        long_prefill_token_threshold=1,
        divergent_hits=True,
        kv_load_failure_policy="fail",
        model_runner="v1",
    ),
    shared_len=32,
    token_seed=0,
    fills=(PromptDraw(6, 0, 1, _NO_HIT), PromptDraw(10, 0, 3, _NO_HIT)),
    concurrent=True,
    evict_from=None,
    replay=PromptDraw(11, 0, 1, ExternalReply(kind="store", store_len=11, undecided=0, extra=0, load_async=False)),
    flavour="tail",
    probe=PromptDraw(9, 0, 1, _NO_HIT),
)
