"""Known vLLM bug: under an EAGLE-style drafter whose layers no group is
annotated with, on a layout of three specs, a prefix-cache hit keeps a
sliding-window block that no entry past it proves.

Found by: ``hit-matches-index`` in a 240 s campaign of the default targets
(2026-12-05, the scheduler machine, 191 s in), the first run after the
claim began predicting EAGLE hits on three or more specs; the program
below is built by hand to the same shape (the campaign's shrank to 154
steps).

Analysis (vLLM 0.33.0, ``vllm/v1/core/kv_cache_coordinator.py``,
``HybridKVCacheCoordinator.find_longest_cache_hit``):

- A dropping group looks one drop unit past the candidate length and drops
  what it found there, so it keeps a last block only where the entry after
  it is cached under the request's own chain (the drafter wrote the KV at
  the block's last position with the token after it). The fixed point
  verifies that once per candidate length: a lookup with the drop adds the
  group to ``eagle_verified``; a lookup *without* the drop that shrinks the
  length clears the set.
- With no group annotated as holding draft layers, the coordinator flags
  every group, Mamba included. The Mamba finder takes no margin and never
  drops; when it shrinks the length it is still a lookup "with the drop",
  so it is added and the set is not cleared.
- Full attention, an 8-token window and Mamba on 4-token blocks; a cached
  24-token prefix whose window entry at 12 was evicted; Mamba states at 8
  and 24; a 30-token request. Pass one: full attention 20, the window
  (margin, drop) 20, verified; Mamba shrinks to 8. Pass two: the window,
  still verified, is looked up at 8 *without* the drop and keeps its block
  4-8, whose proof, the entry at 12, is gone. The hit is 8; the rule allows
  0.
- What the drafter reads at the hit's last position may then be KV another
  request wrote with another next token: worse drafts, not a wrong output
  (the target verifies them).

Control: the same cache with the draft groups annotated (full attention and
the window; Mamba does not drop) hits 0, as the rule says.

Reach: scheduler-API as shown (no group annotated, three specs). vLLM's
planning annotates the groups holding draft layers and falls back to every
group when none is (and warns about unannotated drafters on Mamba models).

Strict xfail: this turns red the day vLLM re-verifies a window group after
any shrink; then set ``fixed_in`` on the ``eagle-verification-survives-shrink``
entry of fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.hits import check_hit_matches_index
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.known_bugs.runs import lookup_after_a_shrink

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def test_with_the_draft_groups_annotated_the_hit_is_proven() -> None:
    """The control: Mamba does not drop, its shrink clears the window's
    verification, and the window's second lookup drops again: 0."""
    adm = lookup_after_a_shrink((0, 1))
    assert adm.index_hold == ((4, 8, 12, 16, 20, 24), (4, 8, 16, 20, 24), (8, 24)), adm.describe()
    check_hit_matches_index(adm)
    assert adm.local_hit == 0, adm.describe()


@known_vllm_bug("vLLM bug eagle-verification-survives-shrink (fuzz/known_bugs.py)")
def test_a_window_group_proves_the_hit_it_keeps() -> None:
    adm = lookup_after_a_shrink(())
    assert adm.index_hold == ((4, 8, 12, 16, 20, 24), (4, 8, 16, 20, 24), (8, 24)), adm.describe()
    assert adm.hit_drops == (4, 4, 0), adm.describe()
    with shown_as("eagle-verification-survives-shrink"):
        check_hit_matches_index(adm)
