"""Hypothesis strategies for the scheduler state machine
(``fuzz/targets/target_scheduler.py``): its configurations (pools sized for
several requests at once, prefill cadence, context length, KV events), the
failing-load runs' one-group configurations, and the per-request draws its
rules make (generation lengths, cache salts, images, pool pressure)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from hypothesis import strategies as st

from fuzz.model import Behaviour, LayoutDraw, SchedulerDraw, SpecDraw, classification_of_kind
from strategies.scheduler import (
    _blocks_needed,
    _is_mamba,
    _spare_blocks,
    generation_lengths,
    scheduler_draws,
    scheduler_layouts,
)
from strategies.specs import drawable_kinds, kv_cache_layouts

__all__ = [
    "MACHINE_ADAPTERS",
    "MACHINE_MAX_LORAS",
    "adapter_of",
    "drafting_configs",
    "drafting_pressures",
    "failing_load_configs",
    "generation_lengths",
    "image_lengths",
    "image_tokens",
    "images",
    "prefix_image",
    "machine_configs",
    "namespaces",
    "pressure_lengths",
]


# What a request's blocks are hashed under besides its tokens: nothing, a
# tenant's cache salt, or a LoRA adapter (requests draw prompts from shared
# prefixes, so every namespace sends the same tokens).
_NAMESPACES: tuple[tuple[str | None, str | None, str | None], ...] = (
    (None, None, None), (None, None, None), ("tenant-a", None, None), (None, "adapter-b", None),
    (None, None, "embeds-a"), (None, None, "embeds-b"),
)
# The LoRA adapters a step of the machine may batch (--max-loras): one, so
# requests of its two adapters (adapter_of) compete for the slot (a waiting
# request of the other adapter is skipped while one runs).
MACHINE_MAX_LORAS = 1
MACHINE_ADAPTERS = ("adapter-b", "adapter-c")


def adapter_of(lora: str | None, max_tokens: int) -> str | None:
    """The adapter a request drawn under one (:func:`namespaces`) runs
    under: one of :data:`MACHINE_ADAPTERS` by the parity of its drawn
    ``max_tokens``, so the second adapter costs no draw of its own (the
    choice sequence, and every run not under an adapter, are unchanged)."""
    return None if lora is None else MACHINE_ADAPTERS[max_tokens % 2]


def namespaces() -> st.SearchStrategy[tuple[str | None, str | None, str | None]]:
    """A request's (``cache_salt``, LoRA adapter, prompt-embeddings tag):
    none in a third of the requests, a tenant's salt in a sixth, an
    adapter in a sixth (which one: :func:`adapter_of`), and in a third
    prompt embeddings in place of its token ids, of one of two tags
    (requests of one tag may share cached KV, of two tags never). Drawn
    inside the range; shrinks to none."""
    return st.integers(0, len(_NAMESPACES) - 1).map(lambda k: _NAMESPACES[k])


# The images a prompt may carry: three, so that requests sending the same
# tokens may carry different ones at the same placeholder, and a prompt may
# carry again, elsewhere, a picture another prompt sent.
_IMAGES = ("image-a", "image-b", "image-c")


def image_tokens(block: int) -> int:
    """The placeholder length of the smallest images, on a machine of
    ``block``-token scheduler blocks: half a block and one more, so that an
    image at a block's middle straddles two."""
    return block // 2 + 1


def image_lengths(block: int, budget: int) -> st.SearchStrategy[int]:
    """The placeholder length of every image of a run (an image's
    identifier fixes its size, and the model's largest item sizes the
    encoder cache: ``max(budget, length)`` embeddings, as vLLM's
    ``MultiModalBudget`` does for a ``budget``-token batch): in half the
    runs :func:`image_tokens` (several outputs fit the cache), in the
    others more than half the budget (two never fit together: an image
    waits until an output no request holds can be evicted) up to a block
    past it (one output fills the cache and is read over several steps),
    never past two blocks (longer images made long prompts, prefilled over
    many steps under a small budget: a costlier run, no new state), so a
    budget of more than four blocks is not pressed. Shrinks to
    :func:`image_tokens`."""
    if block < 1 or budget < 1:
        raise ValueError(f"block={block}, budget={budget}: both must be >= 1")
    low = min(max(2, budget // 2 + 1), 2 * block)
    return st.one_of(st.just(image_tokens(block)), st.integers(low, max(low, min(budget + block, 2 * block))))


def images(num_tokens: int, block: int, anchored: int | None = None, *, length: int | None = None
           ) -> st.SearchStrategy[tuple[tuple[str, int, int], ...]]:
    """The images a prompt of ``num_tokens`` tokens carries, (identifier,
    placeholder offset, placeholder length) each, in prompt order, every
    one ``length`` tokens long (default :func:`image_tokens`): on a shared
    prefix that carries an image at ``anchored`` (the offset; None: none)
    inside the prompt, that image in half the prompts, another image at
    the same placeholder in a quarter (the same tokens, another picture),
    and none in a quarter (the same tokens as text); then, in half the
    prompts, one or two more anywhere after it where they fit, each one of
    the three pictures (so one an earlier prompt sent, at another place),
    each ending the prompt in half the draws (its blocks are then hashed
    as the request decodes). Shrinks to the prefix's image alone."""
    length = image_tokens(block) if length is None else length
    if length < 1:
        raise ValueError(f"length={length} < 1")

    @st.composite
    def carried(draw: st.DrawFn) -> tuple[tuple[str, int, int], ...]:
        found: tuple[tuple[str, int, int], ...] = ()
        if anchored is not None and anchored + length <= num_tokens:
            k = draw(st.integers(0, 3), label="prefix image (3: none)")
            found = () if k == 3 else ((_IMAGES[k // 2], anchored, length),)
        end = found[0][1] + length if found else 0
        for _ in range(draw(st.sampled_from((0, 1, 0, 2)), label="more images")):
            room = num_tokens - length - end
            if room < 0:
                break
            last = draw(st.booleans(), label="image ends the prompt")
            at = num_tokens - length if last else end + draw(st.integers(0, room), label="image gap")
            found += ((draw(st.sampled_from(_IMAGES), label="picture"), at, length),)
            end = at + length
        return found

    return carried()


def prefix_image(prefix: Sequence[int], block: int) -> int | None:
    """Where a shared prefix carries an image (the placeholder's offset), or
    None: one prefix in two does, by its first token (a conversation whose
    turns share a picture), at one token in, mid-block or a block in."""
    if not prefix or prefix[0] % 2 != 1:
        return None
    return (1, block // 2, block)[(prefix[0] // 4) % 3]


def pressure_lengths(layout: LayoutDraw, free_ahead: int, cached: int) -> st.SearchStrategy[int]:
    """Lengths of a request on tokens nobody shares that presses an idle pool
    until it evicts some of a cached prefix: ``free_ahead`` free blocks sit
    before the prefix's ``cached`` blocks in the pool's eviction order, and
    the request needs (by :func:`_blocks_needed`) ``free_ahead + 1`` to
    ``free_ahead + cached`` blocks, so LRU eviction takes 1 to all of the
    prefix's blocks. Never more than the pool frees (``free_ahead +
    cached``): vLLM would hold such a request back for good. Shrinks to the
    shortest (one evicted block)."""
    if free_ahead < 0 or cached < 1:
        raise ValueError(f"free_ahead={free_ahead}, cached={cached}: need free_ahead >= 0 and cached >= 1")
    # _blocks_needed never falls as tokens grow: scan up from one token (a
    # request of n prompt tokens and one output token holds n + 1).
    lo = hi = None
    n = 1
    while n < 64 * layout.scheduler_block_size and _blocks_needed(layout, n + 1) <= free_ahead + cached:
        if _blocks_needed(layout, n + 1) > free_ahead:
            lo = n if lo is None else lo
            hi = n
        n += 1
    return st.just(1) if lo is None or hi is None else st.integers(lo, hi)


@st.composite
def _drafting_pressures(
    draw: st.DrawFn, layout: LayoutDraw, free: int, config: SchedulerDraw, max_model_len: int
) -> tuple[int, int, int]:
    k = config.num_speculative_tokens or 0
    most = min(4, config.max_num_seqs)

    def share(n: int) -> int:
        # The most tokens one of n requests may hold in its share of the
        # pool, its k speculative slots counted.
        return max(1, _most_tokens(layout, free // n, k))

    # The most requests (they fill the pool fastest) down to the fewest whose
    # tables can outgrow their shares within the context (a request's last
    # step holds up to k + 1 slots past its length less its accepted drafts).
    fit = [n for n in range(2, most + 1) if share(n) + k + 2 < max_model_len]
    n = most - draw(st.integers(0, most - (fit[0] if fit else most)), label="drafting requests fewer")
    held = share(n)
    # Prompts the first step prefills whole (one budget, each under the
    # long-prefill threshold), at most half the share: every request then
    # decodes, with drafts, before the pool runs out.
    budget = config.max_num_batched_tokens // n
    if config.long_prefill_token_threshold:
        budget = min(budget, config.long_prefill_token_threshold)
    prompt = draw(st.integers(1, max(1, min(budget, held // 2))), label="drafting prompt tokens")
    # Past the share by k + 2 tokens (every table then needs a block more
    # than its share, whatever the drafts accepted; the share never
    # under-counts) to two more, clipped to the context.
    extra = draw(st.integers(0, 2), label="drafting tokens past the share")
    max_tokens = max(1, min(held + k + 2 + extra, max_model_len - 1) - prompt)
    return n, prompt, max_tokens


def drafting_pressures(
    layout: LayoutDraw, free: int, config: SchedulerDraw, max_model_len: int
) -> st.SearchStrategy[tuple[int, int, int]]:
    """``(requests, prompt tokens, max_tokens)`` for 2 to ``max_num_seqs``
    (at most 4) requests on tokens nobody shares that press an idle pool of
    ``free`` blocks while all of them decode with drafts: as many requests
    as allowed, down to as few as can outgrow the pool within
    ``max_model_len``, prompts short
    enough to be prefilled in the first step (within the token budget and
    the long-prefill threshold, at most half a request's share of the
    pool), and generation lengths that take each request past its share of
    the pool (:func:`_most_tokens` of ``free / requests`` blocks, its
    speculative slots counted) by its speculative tokens and two to four,
    within ``max_model_len``. The requests
    decode in lockstep, so their tables outgrow the pool at about the same
    step: vLLM then preempts the last running one, decoding with drafts.
    A layout with no group whose table grows with the tokens (windowed and
    whole-state groups alone) does not run out. Shrinks to the most
    requests, one prompt token, and the least past the share."""
    return _drafting_pressures(layout, free, config, max_model_len)


def _fewest_blocks(group: SpecDraw, tokens: int) -> int:
    """The fewest blocks a group may hold for a request of ``tokens``
    tokens: one per ``block_size`` tokens, but a window's or chunk's worth
    and one for a windowed group (span), one for a whole-state or scratch
    group (never an over-count: a request sized past it holds at least a
    block more than that)."""
    c = classification_of_kind(group.kind)
    if c.behaviour in (Behaviour.MAY_BE_SHORT, Behaviour.SCRATCH):
        return 1
    whole = -(-tokens // group.block_size)
    span = c.span and group.param(c.span[0])
    return min(whole, -(-span // group.block_size) + 1) if span else whole


def _most_tokens(layout: LayoutDraw, free_blocks: int, lookahead: int) -> int:
    """The most tokens one request may hold in ``free_blocks`` blocks (by
    :func:`_fewest_blocks`), ``lookahead`` slots past them; 1 << 20 where
    no group grows with the tokens."""
    def fits(n: int) -> bool:
        return sum(_fewest_blocks(g, n + lookahead) for g in layout.groups) <= free_blocks

    if not fits(1):
        return 0
    lo = 1  # fits; the first power of two past it that does not is hi
    while lo < 1 << 20 and fits(2 * lo):
        lo *= 2
    if lo >= 1 << 20:
        return 1 << 20
    hi = 2 * lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _longest_request(layout: LayoutDraw, free_blocks: int, lookahead: int) -> int:
    """The most tokens one request can hold in ``free_blocks`` blocks, with
    ``lookahead`` speculative slots past them: a block per ``block_size``
    tokens of every token-proportional group (windowed ones counted whole),
    and per whole-state group its running state, the state kept at the last
    block boundary and one per speculative token."""
    whole_state = sum(2 + lookahead for g in layout.groups if _is_mamba(g))
    per_token = [g.block_size for g in layout.groups if not _is_mamba(g)]
    room = free_blocks - whole_state
    if not per_token:
        return 1 << 20 if room >= 0 else 0
    # The largest n + lookahead with sum(ceil(.. / b)) <= room.
    n = max(0, room * min(per_token) // len(per_token))
    while n > 0 and sum(-(-(n + lookahead) // b) for b in per_token) > room:
        n -= 1
    while sum(-(-(n + 1 + lookahead) // b) for b in per_token) <= room:
        n += 1
    return n


@st.composite
def _machine_configs(draw: st.DrawFn, configs: st.SearchStrategy[SchedulerDraw],
                     connector_optional: bool = False) -> SchedulerDraw:
    config = draw(configs, label="config")
    layout = config.layout
    # Room for about one long request, plus some: requests from the machine
    # are up to ~8 scheduler blocks, so several at once mean real pressure.
    need = _blocks_needed(layout, 6 * layout.scheduler_block_size)
    # A producer's pool is always tight: vLLM preempts a request whose step
    # is in flight only for one (it defers no frees), so its runs need the
    # pressure that makes preemptions.
    spare = st.integers(0, need // 2) if config.kv_role == "kv_producer" else _spare_blocks(need)
    num_blocks = 1 + need + draw(spare, label="spare blocks")
    # Three configurations in eight hold local prefills back to every 2nd-4th
    # executed step while requests decode (the engine's
    # --prefill-schedule-interval); drawn last, inside the range (Hypothesis
    # favours its ends), so the other fields shrink as before. Shrinks to 1.
    interval = draw(st.sampled_from((1, 1, 2, 1, 3, 1, 4, 1)), label="prefill_schedule_interval")
    # One configuration in four serves a context (max_model_len) of 2-8
    # scheduler blocks, about as long as its requests: prompts are then
    # trimmed to fit (the machine's clients trim to the context, as the
    # engine refuses longer prompts), outputs stop at the limit, and vLLM
    # clips speculative steps there and pads none past it. Never below the
    # long-prefill threshold (vLLM refuses that). Drawn last, inside the
    # range; shrinks to the roomy default.
    limit = layout.max_model_len
    if draw(st.integers(0, 3), label="context near the requests (2: yes)") == 2:
        s = layout.scheduler_block_size
        low = max(2 * s + 1, config.long_prefill_token_threshold)
        limit = draw(st.integers(low, max(low, 8 * s)), label="max_model_len")
    # The engine starts only if one request of max_model_len tokens fits the
    # pool (vLLM's KV-cache memory check); an operator with a small pool
    # lowers max_model_len. So does the machine: a request that can never
    # fit would be admitted, preempt itself and be admitted again forever.
    # (The long-prefill threshold stays within it: vLLM refuses less.)
    fits = _longest_request(layout, num_blocks - 1, config.num_speculative_tokens or 0)
    limit = max(min(limit, fits), config.long_prefill_token_threshold, 2)
    # Three serving options, each on in half the configurations, from one
    # draw (drawn last, shrinks to all off): KV events published
    # (--kv-events-config; the harness replays them as a router would), the
    # engine's metrics (log_stats, as `vllm serve` runs; SchedulerDraw.metrics),
    # and finished-id sets (a data-parallel engine core).
    # In the same draw, for the general machine (its high three bits all
    # set: about one configuration in eight), an engine without a KV
    # connector, vLLM's default: the scheduler's connector-less paths (no
    # lookup, no metadata, no hand-off), with no connector role or
    # connector answers left to draw. Those bits at 6, for a layout
    # without a Mamba group: prefix caching off
    # (--no-enable-prefix-caching): the pool caches nothing, only the
    # connector's external tokens are ever computed ahead. At 5, for a
    # layout without a Mamba group: chunked prefill off
    # (--no-enable-chunked-prefill), a prompt scheduled whole or not at all;
    # the context is then cut to the step's token budget, as vLLM requires
    # (where the long-prefill threshold allows it).
    options = draw(st.integers(0, 63 if connector_optional else 7),
                   label="kv events | engine metrics | finished-id sets | no connector | no prefix caching | "
                         "no chunked prefill")
    kv_events, metrics, finished_sets = bool(options & 1), bool(options & 2), bool(options & 4)
    chunked = True
    if options >> 3 == 7:
        config = dataclasses.replace(config, connector=False, kv_role="kv_both", divergent_hits=False)
    elif options >> 3 == 6 and not layout.has_mamba:
        config = dataclasses.replace(config, prefix_caching=False)
    elif (options >> 3 == 5 and not layout.has_mamba
          and config.long_prefill_token_threshold <= config.max_num_batched_tokens):
        chunked, limit = False, min(limit, config.max_num_batched_tokens)
    return dataclasses.replace(
        config,
        chunked_prefill=chunked,
        layout=dataclasses.replace(layout, num_blocks=num_blocks, max_model_len=limit),
        prefill_schedule_interval=interval,
        kv_events=kv_events,
        metrics=metrics,
        finished_sets=finished_sets,
        max_loras=MACHINE_MAX_LORAS,  # LoRA on: a sixth of the requests run under one of two adapters (namespaces)
    )


# The layout families of the machine's configurations (scheduler_layouts).
_LAYOUT_WEIGHTS = (6, 2, 2, 1, 2, 2)


def machine_configs(
    *, configs: st.SearchStrategy[SchedulerDraw] | None = None
) -> st.SearchStrategy[SchedulerDraw]:
    """Scheduler configurations for the state machine (default: every layout
    family, the core case first) with a pool sized from one ~6-block
    request up to three times that, in three configurations in eight a
    prefill cadence (``prefill_schedule_interval`` 2-4), in one in four a
    context (``max_model_len``) of 2-8 scheduler blocks, in half each KV
    events, the engine's metrics and finished-id sets on, and (the default
    configurations only) in about one in eight no KV connector and, for a
    layout without a Mamba group (about a third), in about one in ten each
    prefix caching off and chunked prefill off (the context cut to the
    token budget; 8 and 10 of the 96 such in 300 derandomized draws).
    Shrinks towards the smallest pool, no cadence, a roomy context, no
    events, no metrics, a connector, prefix caching and chunked prefill on."""
    if configs is not None:  # a caller's own configurations keep their connector (and their draws)
        return _machine_configs(configs)
    configs = scheduler_draws(
        layouts=scheduler_layouts(weights=_LAYOUT_WEIGHTS), asynchronous=True, producers=True, speculative=True
    )
    return _machine_configs(configs, connector_optional=True)


@functools.cache
def drafting_configs() -> st.SearchStrategy[SchedulerDraw]:
    """:func:`machine_configs`' layouts, pools and draws, speculating where
    a drafter accepts the layout, with two to four sequences, and under
    async scheduling (half of them) a producer's (``kv_producer``): async
    scheduling defers the frees of a request whose step is in flight, as a
    decoding request's always is, but a producer's frees none late. The
    configurations on which requests decoding with drafts can outgrow the
    pool and one of them be preempted holding its drafts. Shrinks as
    :func:`machine_configs` does, to two sequences."""
    configs = scheduler_draws(
        layouts=scheduler_layouts(weights=_LAYOUT_WEIGHTS), asynchronous=True, producers=True, speculative=True,
        speculating_only=True,
    ).map(lambda c: dataclasses.replace(
        c, max_num_seqs=max(2, c.max_num_seqs), kv_role="kv_producer" if c.async_scheduling else c.kv_role))
    return _machine_configs(configs)


# Lone groups that a failed synchronous load rolls back to a point they keep
# no state for: a whole-state group (one state per load) and windowed groups
# (blocks below the window are freed).
_ROLLBACK_KINDS = ("MambaSpec", "SlidingWindowSpec", "SlidingWindowMLASpec", "ChunkedLocalAttentionSpec")


@functools.cache
def failing_load_configs() -> st.SearchStrategy[SchedulerDraw]:
    """State-machine configurations (:func:`machine_configs`' pools, budgets,
    policies, runners, async scheduling) on one KV-cache group: the only
    layout whose connector may report failed loads block by block (vLLM maps
    ``invalid_block_ids`` to requests for one group only). Half the layouts
    are a lone whole-state or windowed group (where a rollback can land on a
    point with no state), half any one group. Either failure policy, half
    each. Never a producer (``kv_producer`` loads nothing, so it has no load
    to fail). Shrinks to a lone group of the first kind."""
    kinds = tuple(k for k in _ROLLBACK_KINDS if k in drawable_kinds())
    lone = kv_cache_layouts(min_groups=1, max_groups=1)
    layouts = st.one_of(kv_cache_layouts(kinds=kinds, min_groups=1, max_groups=1), lone) if kinds else lone
    return _machine_configs(scheduler_draws(layouts=layouts, asynchronous=True))
