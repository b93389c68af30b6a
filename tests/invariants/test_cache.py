"""The cache-model claims (``invariants/cache.py``) on real schedulers: the
model's entries and guarantees, and the forgetful pool the hit-length claim
cannot see. ``cache-keeps-entries`` is shown on its fixed run in
``tests/invariants/test_scheduler_planted.py``."""

from __future__ import annotations

import pytest

from fuzz.adapter import FIXED_RUNS, SchedulerHarness, planted_scheduler_bug
from fuzz.model import InvariantViolation, LayoutDraw, MissedHit, SpecDraw
from fuzz.runners.scheduler import Stepper, run_fixed
from invariants.cache import check_cache_keeps_entries, check_hit_reaches_model
from invariants.hits import check_eviction_order, check_hit_matches_index
from tests.support.harnesses import harness_of

RUN = FIXED_RUNS["free_forgets_keys"]  # one 13-token prompt sent twice, one after the other


def test_a_forgetful_pool_serves_less_than_the_model_guarantees() -> None:
    """The first request's free drops its 3 full blocks' keys: the resend's
    lookup serves 0 tokens where the model guarantees 12."""
    with planted_scheduler_bug("free_forgets_keys"), pytest.raises(MissedHit) as caught:
        run_fixed(RUN, (check_hit_reaches_model,))
    assert caught.value.invariant == "hit-reaches-model", str(caught.value)
    assert "served 0 token(s), the model guarantees 12" in str(caught.value)
    assert run_fixed(RUN, (check_hit_reaches_model, check_cache_keeps_entries)).hits == [0, 12]


def test_the_hit_length_claims_agree_with_a_forgetful_index() -> None:
    """Judged against vLLM's own index, the forgetful pool's short hit is
    the right one: only the fixed run's expected hits notice."""
    with planted_scheduler_bug("free_forgets_keys"), pytest.raises(AssertionError) as caught:
        run_fixed(RUN, (check_hit_matches_index, check_eviction_order))
    assert not isinstance(caught.value, InvariantViolation)
    assert "admissions hit [0, 0]" in str(caught.value)


def _harness(*specs: SpecDraw, num_blocks: int = 17, hash_block_size: int = 4) -> SchedulerHarness:
    layout = LayoutDraw(specs, hash_block_size=hash_block_size, num_blocks=num_blocks)
    return harness_of(layout, batch=32, seqs=2)


def test_the_model_files_full_blocks_and_forgets_on_a_reset_and_an_eviction() -> None:
    """A 13-token prompt computed in one step files its 3 full blocks (not
    the partial fourth); evicting one by id drops its entry only; a reset
    with nothing running clears the rest, and the resend then hits nothing
    without a missed hit."""
    harness = _harness(SpecDraw("FullAttentionSpec", 4))
    stepper = Stepper(harness, (check_cache_keeps_entries, check_hit_reaches_model))
    harness.add_request(range(13), max_tokens=2)
    stepper.step()
    stepper.drain()
    model = harness.cache_model
    assert model.on and sorted(t for keys in model._entries.values() for (_, _, t, _) in keys.values()) == [4, 8, 12]
    first = next(b for b, keys in model._entries.items() if any(t == 4 for (_, _, t, _) in keys.values()))
    harness.evict_shortcut({first})
    stepper.step()
    assert sorted(t for keys in model._entries.values() for (_, _, t, _) in keys.values()) == [8, 12]
    harness.reset_prefix_cache()
    stepper.step()
    assert not model._entries
    harness.add_request(range(13), max_tokens=2)
    stepper.step()
    stepper.drain()
    assert stepper.hits == [0, 0]


def test_no_model_where_it_is_not_exact() -> None:
    """A sliding window beside full attention: the model states nothing."""
    harness = _harness(SpecDraw("FullAttentionSpec", 4), SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 5),)),
                       num_blocks=33)
    assert not harness.cache_model.on


def test_the_hybrid_coordinator_files_whole_scheduler_blocks_only() -> None:
    """Full attention of 3-token and of 1-token blocks (scheduler block 3,
    no sub-block hits): an 8-token prompt computed at once files 6 tokens in
    both groups, not 8 in the 1-token one (a model error the any-layout
    target met with an MLA group, pinned here)."""
    harness = _harness(SpecDraw("FullAttentionSpec", 3), SpecDraw("FullAttentionSpec", 1), num_blocks=40,
                       hash_block_size=1)
    assert harness.cache_model.on and harness.scheduler_block_size == 3 and not harness.partial_hits_enabled
    stepper = Stepper(harness, (check_cache_keeps_entries, check_hit_reaches_model))
    harness.add_request(range(8), max_tokens=1)
    stepper.step()
    stepper.drain()
    filed = sorted((g, t) for keys in harness.cache_model._entries.values() for (_, g, t, _) in keys.values())
    assert filed == [(0, 3), (0, 6), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6)]
