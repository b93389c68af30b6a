"""Property targets for ``KVCacheManager.truncate_computed_blocks``.

Lookup results are produced the real way (prefill, free, evict, look up), then
truncated at a drawn endpoint; every truncation invariant is checked.
"""

from __future__ import annotations

from hypothesis import given

from fuzz.targets.truncation import run_truncation_scenario
from invariants.truncation import check_all_truncation_invariants
from strategies.scenarios import TruncationScenario, truncation_scenarios
from strategies.specs import kv_cache_layouts


def check_truncation_scenario(scenario: TruncationScenario, only: str | None = None) -> None:
    """Run ``scenario`` and check every truncation invariant (or only one)."""
    obs = run_truncation_scenario(scenario)
    if obs is not None:
        check_all_truncation_invariants(obs, only)


@given(scenario=truncation_scenarios())
def fuzz_truncate_hybrid(scenario: TruncationScenario) -> None:
    """Full attention + Mamba (+ up to two other groups), real lookups."""
    check_truncation_scenario(scenario)


@given(scenario=truncation_scenarios(layouts=kv_cache_layouts(min_groups=1, max_groups=4)))
def fuzz_truncate_any_layout(scenario: TruncationScenario) -> None:
    """Any 1-4 group layout of every drawable spec kind, real lookups."""
    check_truncation_scenario(scenario)
