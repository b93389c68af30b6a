"""Cache-hit scenarios for the truncation target, built by construction.

A scenario is pure data: prompts that share prefixes (so cache hits really
happen), a per-group eviction plan (so per-group hits diverge), a replay
prompt, a lookup mode and an endpoint rule. :mod:`fuzz.targets` runs it on a
real ``KVCacheManager`` through the adapter.

Prompts are slices of one shared token sequence plus per-prompt suffixes, so
every prompt shares a prefix with the replay. A fraction of scenarios runs the
manager as the scheduler builds it for an EAGLE-style drafter, whose lookups
drop the last matched block. Shrinking goes towards fewer and shorter prompts,
no evictions, a joint lookup, an endpoint at the hit and no drafter.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from fuzz.model import Behaviour, EagleDraw, EndpointRule, LayoutDraw, TruncationScenario, classification_of_kind
from strategies.specs import kv_cache_layouts

__all__ = ["eagle_draws", "endpoint_rules", "truncation_scenarios"]

LOOKUP_MODES = ("joint", "per_group", "connector")
_EAGLE_CHOICES = ("never", "sometimes", "always")
# "cover_hit" is the shortest hit among must-cover (attention-like) groups:
# the boundary the scheduler's full-attention-driven lookup reports.
ANCHORS = ("cover_hit", "min_hit", "max_hit", "zero")


def endpoint_rules(*, max_steps: int = 2) -> st.SearchStrategy[EndpointRule]:
    """Endpoint rules: at, below or above an anchor hit, optionally misaligned.

    Shrinks to ``EndpointRule("cover_hit", 0, 0)``: the aligned attention hit.
    """
    if max_steps < 0:
        raise ValueError(f"max_steps={max_steps} < 0")
    return st.builds(
        EndpointRule,
        anchor=st.sampled_from(ANCHORS),
        steps=st.one_of(st.just(0), st.integers(-max_steps, max_steps)),
        remainder=st.one_of(st.just(0), st.integers(1, 64)),
    )


# Draft layers are attention layers (the model runner marks an attention
# module's spec ``is_draft``), so only attention-like groups can hold them.
_DRAFT_HOLDERS = (Behaviour.MUST_COVER, Behaviour.UNWRAPPED)


def eagle_draws(layout: LayoutDraw) -> st.SearchStrategy[EagleDraw]:
    """An EAGLE-style drafter for ``layout``: any set of its attention-like
    groups holds draft layers (``is_eagle_group``), or none is identified and
    vLLM flags every group. A group whose kind refuses the EAGLE drop never
    takes it (vLLM refuses such a drafter at its first lookup), so with one in
    the layout some other group must hold the draft layers; when none can,
    the strategy is empty.

    Shrinks towards no identified draft group (vLLM's fallback: all groups),
    else towards the first group that can hold draft layers.
    """
    rows = [classification_of_kind(g.kind) for g in layout.groups]
    holders = [i for i, row in enumerate(rows) if row.behaviour in _DRAFT_HOLDERS and not row.refuses_eagle_drop]
    fallback_ok = not any(row.refuses_eagle_drop for row in rows)
    if not holders:
        return st.just(EagleDraw(())) if fallback_ok else st.nothing()
    return st.lists(
        st.sampled_from(holders), unique=True, min_size=0 if fallback_ok else 1, max_size=len(holders)
    ).map(lambda ids: EagleDraw(tuple(sorted(ids))))


@st.composite
def _scenarios(
    draw: st.DrawFn,
    layouts: st.SearchStrategy[LayoutDraw],
    max_prompts: int,
    lookup_modes: tuple[str, ...],
    evicting_kinds: frozenset[str] | None,
    eagle: str,
) -> TruncationScenario:
    layout = draw(layouts, label="layout")
    s = layout.scheduler_block_size
    shared_len = draw(st.integers(0, 6 * s), label="shared length")
    shared = tuple(draw(st.lists(st.integers(0, 500), min_size=shared_len, max_size=shared_len), label="shared"))
    # Lists, not a count then that many draws: shrinking then deletes one
    # prompt (or eviction) without shifting the draws that follow.
    prompts = tuple(
        draw(
            st.lists(st.tuples(st.integers(0, shared_len), st.integers(1, 2 * s)), min_size=1, max_size=max_prompts),
            label="prompts (prefix, suffix)",
        )
    )
    chunk = draw(st.one_of(st.none(), st.integers(1, 4).map(lambda k: k * layout.hash_block_size)), label="prefill chunk")
    # Evictions as (group index, first evicted block) pairs: a group deleted
    # by shrinking leaves the other groups' pairs where they were. Groups of
    # kinds outside evicting_kinds keep all their blocks.
    eligible = [g for g, spec in enumerate(layout.groups) if evicting_kinds is None or spec.kind in evicting_kinds]
    cuts: dict[int, int] = {}
    if eligible:
        cuts = dict(
            draw(
                st.lists(st.tuples(st.sampled_from(eligible), st.integers(0, 12)), max_size=len(eligible),
                         unique_by=lambda pair: pair[0]),
                label="evictions (group, from block)",
            )
        )
    evict_from = tuple(cuts.get(g) for g in range(len(layout.groups)))
    replay = (draw(st.integers(0, shared_len), label="replay prefix"), draw(st.integers(1, 2 * s), label="replay tail"))
    # Size the pool from what the prompts need, so hits survive by default and
    # LRU pressure is a drawn choice (factor 1 with little slack), not an accident.
    longest = max(keep + suffix for keep, suffix in prompts + (replay,))
    per_prompt = sum(-(-longest // g.block_size) + 1 for g in layout.groups)
    factor = draw(st.integers(1, 4), label="pool / longest prompt")
    slack = draw(st.integers(0, 8), label="pool slack")
    layout = replace(layout, num_blocks=per_prompt * factor + slack + 1)
    mode = draw(st.sampled_from(lookup_modes), label="lookup mode")
    endpoint = draw(endpoint_rules(), label="endpoint")
    # One scenario in three speculates (nominally: generation leaves this last
    # draw off more often). Drawn last, so the draws before it are those of a
    # scenario without a drafter, and eagle="never" draws exactly those.
    drafter = None
    drafters = eagle_draws(layout)
    if not drafters.is_empty and (
        eagle == "always"
        or (eagle == "sometimes" and draw(st.integers(0, 2), label="speculative decoding (2: EAGLE-style)") == 2)
    ):
        drafter = draw(drafters, label="EAGLE draft groups")
        # With speculative decoding a Mamba layer's spec holds one state block
        # per speculative token (num_speculative_tokens), or none under ReplaySSM
        # (vLLM's MambaBase.get_kv_cache_spec); the pool grows by as many.
        extra = draw(st.integers(0, 4), label="speculative state blocks (0: ReplaySSM)")
        fields = [classification_of_kind(g.kind).speculative_blocks for g in layout.groups]
        if extra and any(fields):
            groups = tuple(
                g if field is None else replace(g, params=g.params + ((field, extra),))
                for g, field in zip(layout.groups, fields)
            )
            per_prompt += extra * sum(field is not None for field in fields)
            layout = replace(layout, groups=groups, num_blocks=per_prompt * factor + slack + 1)
    return TruncationScenario(layout, shared, prompts, chunk, evict_from, replay, mode, endpoint, drafter)


def truncation_scenarios(
    *,
    layouts: st.SearchStrategy[LayoutDraw] | None = None,
    max_prompts: int = 4,
    lookup_modes: tuple[str, ...] = LOOKUP_MODES,
    evicting_kinds: tuple[str, ...] | None = None,
    eagle: str = "sometimes",
) -> st.SearchStrategy[TruncationScenario]:
    """Truncation scenarios over ``layouts`` (default: hybrid layouts with full
    attention and Mamba plus up to two other drawable groups).

    ``lookup_modes`` restricts how the replay is looked up; ``evicting_kinds``
    restricts evictions to groups of those spec kinds (default: any group);
    ``eagle`` says whether scenarios speculate with an EAGLE-style drafter
    (:func:`eagle_draws`): ``"sometimes"`` (one in three), ``"always"``
    (wherever the layout allows one) or ``"never"``.
    """
    if max_prompts < 1:
        raise ValueError(f"max_prompts={max_prompts} < 1")
    if not lookup_modes or set(lookup_modes) - set(LOOKUP_MODES):
        raise ValueError(f"lookup_modes={lookup_modes} must be a non-empty subset of {LOOKUP_MODES}")
    if layouts is None:
        layouts = kv_cache_layouts(min_groups=2, max_groups=4, required=("FullAttentionSpec", "MambaSpec"))
    if eagle not in _EAGLE_CHOICES:
        raise ValueError(f"eagle={eagle!r} must be one of {_EAGLE_CHOICES}")
    kinds = None if evicting_kinds is None else frozenset(evicting_kinds)
    return _scenarios(layouts, max_prompts, tuple(lookup_modes), kinds, eagle)
