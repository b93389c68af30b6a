"""Known vLLM bug (a missed hit, performance only): under an EAGLE-style
drafter, a sliding-window group on blocks finer than the hit alignment
rounds its run from token 0 down to the alignment before it drops the
EAGLE block, and loses a whole alignment unit more than the drop.

Found by: ``hit-matches-index`` once it predicted EAGLE hits (2026-12-04),
on a program written to exercise a window on finer blocks; the scenario
below is that program.

Analysis (vLLM 0.33.0, ``SlidingWindowManager.find_longest_cache_hit``
in ``vllm/v1/core/single_type_kv_cache_manager.py``):

- Full attention on 8-token blocks beside a sliding window of 64 tokens on
  4-token blocks: the hit alignment is 8. r0 (17 tokens) leaves the window
  group's blocks ending at 4, 8 and 12 cached, full attention's at 8 and 16.
- r1 (21 tokens, r0's 17 and 4 more): full attention reaches 16 and drops
  to 8. The window group is asked for 8 plus its 4-token margin: its right-
  to-left search finds blocks 3, 2 and 1 cached, fewer than the window
  needs, so it falls back to the run from token 0 (3 blocks, 12 tokens).
  It rounds that run down to the alignment (8), then drops the EAGLE block
  (4), then rounds again: 0. Dropping first gives 8, which its window
  (blocks 1 and 2) and the EAGLE proof (block 3) serve; the search path
  that does find a full run checks the alignment after the drop, as it
  should.
- The joint hit is 0 where the index serves 8: a whole alignment unit is
  recomputed on every prompt shorter than the window. Nothing wrong is read.
- With an 8-token window (the search finds a full run) the same program
  hits 8: the control below.

Reach: scheduler-API only as shown (the layout is drawn directly). vLLM's
own comment on that code names hybrid models whose groups have different
page sizes (Gemma 4) as where the window's block is finer than the
alignment; no modelled engine builds one here.

Strict xfail: this turns red the day vLLM drops before it aligns; then set
``fixed_in`` on the ``eagle-window-aligns-before-drop`` entry of
fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.hits import check_hit_matches_index
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.known_bugs.runs import eagle_window_second_lookup

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def test_a_window_whose_search_finds_its_run_serves_the_hit() -> None:
    """The control: an 8-token window needs three blocks with the EAGLE
    block, the search finds them, and r1 hits 8."""
    adm = eagle_window_second_lookup(8)
    check_hit_matches_index(adm)
    assert adm.local_hit == 8, adm.describe()


@known_vllm_bug("vLLM bug eagle-window-aligns-before-drop (fuzz/known_bugs.py)")
def test_a_window_longer_than_the_prefix_serves_the_hit() -> None:
    adm = eagle_window_second_lookup(64)
    assert adm.index_hold == ((8, 16), (4, 8, 12)) and adm.hit_drops == (8, 4), adm.describe()
    with shown_as("eagle-window-aligns-before-drop"):
        check_hit_matches_index(adm)
