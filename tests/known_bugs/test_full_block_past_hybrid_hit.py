"""Known vLLM bug (a missed hit, performance only): with fine-grained hash
hits, a full-attention group whose cached full block spans the joint hit
serves nothing of that block, and the hybrid hit collapses.

Found by: ``hit-matches-index`` in the scheduler state machine (a missed
hit, exit 3), 2026-12-04; the scenario below is its shrunk program.

Analysis (vLLM 0.33.0, ``vllm/v1/core/kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py``):

- Full attention (8-token blocks), Mamba (4) and full attention (12), one
  token per hash unit, so sub-block hits are on; the connector takes no
  divergent hits. r0 (86 tokens, its first
  84 shared with r2) is loaded and cached: the 8-token group holds whole
  blocks to 80, Mamba a state at 80, the 12-token group whole blocks to 84.
- r2's lookup can only end at 80 (the 8-token group's reach, where Mamba
  has its state). The 12-token group holds positions 72-83 of that very
  prefix in one cached block (filed under the key at 84), but the
  coordinator asks it for the key at 80, a partial entry nothing files,
  so it offers its last whole block, 72; Mamba has no state at 72 and the
  joint hit falls to 0. The 80 cached tokens are loaded again (or
  recomputed without a connector).
- Full attention's KV is append-only: the block's first 8 positions are
  the prefix's, and a sub-block hit would copy the block as vLLM's own
  partial hits do. Nothing is corrupted; KV that is cached is not used.

Reach: scheduler-API only as shown (full-attention groups of two block
sizes beside Mamba are drawn directly; no modelled engine builds them). A
single full-attention group could meet it where a promotion drops its
partial entry at a Mamba checkpoint; not shown.

Strict xfail: this turns red the day vLLM serves the hit; then set
``fixed_in`` on the ``full-block-past-hybrid-hit-unused`` entry of
fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.hits import check_hit_matches_index
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.known_bugs.runs import third_admission_past_hybrid_hit

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def test_a_second_group_whose_blocks_end_at_the_hit_serves_it() -> None:
    """The control: with 16-token blocks the second group holds a whole block
    ending at 80, and r2 hits 80."""
    adm = third_admission_past_hybrid_hit(16)
    check_hit_matches_index(adm)
    assert adm.local_hit == 80, adm.describe()


@known_vllm_bug("vLLM bug full-block-past-hybrid-hit-unused (fuzz/known_bugs.py)")
def test_a_cached_full_block_serves_a_hit_inside_it() -> None:
    adm = third_admission_past_hybrid_hit(12)
    with shown_as("full-block-past-hybrid-hit-unused"):
        check_hit_matches_index(adm)
