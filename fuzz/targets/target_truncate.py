"""Property targets for ``KVCacheManager.truncate_computed_blocks``.

Lookup results are produced the real way (prefill, free, evict, look up), then
truncated at a drawn endpoint; every truncation invariant is checked. The
strategy factories and the check are shared with ``python -m fuzz run``
(see :mod:`fuzz.registry`), so pytest and the campaign run the same thing.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from fuzz.runners.truncation import carrying_run, run_truncation_scenario
from invariants.truncation import check_all_truncation_invariants
from fuzz.model import LayoutDraw, SpecDraw
from fuzz.model import EndpointRule, TruncationScenario
from strategies.scenarios import truncation_scenarios
from strategies.specs import kv_cache_layouts


def check_truncation_scenario(scenario: TruncationScenario, only: str | None = None) -> None:
    """Run ``scenario`` and check every truncation invariant (or only one); a
    violation carries the run (:func:`fuzz.runners.truncation.carrying_run`)."""
    obs = run_truncation_scenario(scenario)
    if obs is not None:
        with carrying_run(scenario, obs):
            check_all_truncation_invariants(obs, only)


def hybrid_scenarios() -> st.SearchStrategy[TruncationScenario]:
    """Full attention + Mamba (+ up to two other groups)."""
    return truncation_scenarios()


def any_layout_scenarios() -> st.SearchStrategy[TruncationScenario]:
    """Any 1-4 group layout of every drawable spec kind."""
    return truncation_scenarios(layouts=kv_cache_layouts(min_groups=1, max_groups=4))


# The seed (vLLM PR 51468): full attention + Mamba with 16-token blocks, a
# 4-block prefix cached, the Mamba state evicted, the replay's full-attention
# hit (64 tokens) deeper than Mamba's (0): truncating at 64 must clamp Mamba.
SEED_PR_51468 = TruncationScenario(
    layout=LayoutDraw(
        (SpecDraw("FullAttentionSpec", 16), SpecDraw("MambaSpec", 16)), hash_block_size=16, num_blocks=32
    ),
    shared=tuple(range(96)),
    prompts=((64, 0),),
    prefill_chunk=16,
    evict_from=(None, 0),
    replay=(80, 16),
    lookup_mode="per_group",
    endpoint=EndpointRule("cover_hit", 0, 0),
)


@example(scenario=SEED_PR_51468)
@given(scenario=hybrid_scenarios())
def fuzz_truncate_hybrid(scenario: TruncationScenario) -> None:
    """Full attention + Mamba (+ up to two other groups), real lookups."""
    check_truncation_scenario(scenario)


@given(scenario=any_layout_scenarios())
def fuzz_truncate_any_layout(scenario: TruncationScenario) -> None:
    """Any 1-4 group layout of every drawable spec kind, real lookups."""
    check_truncation_scenario(scenario)
