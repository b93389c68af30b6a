"""Known vLLM bug (a missed hit, performance only): under an EAGLE-style
drafter, a single-group cache drops one block more than a hybrid one when
a block-aligned prompt is sent again.

Found by: ``hit-matches-index`` once it predicted hits under the EAGLE
drop (2026-12-04), on the first program written to exercise that rule;
the scenario below is that program.

Analysis (vLLM 0.33.0, ``vllm/v1/core/kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py``):

- The drafter writes the KV of a hit's last position with the token after
  it, so a speculating lookup must not keep a last block unless the token
  after it is the request's own. ``HybridKVCacheCoordinator`` checks this
  by looking one drop unit past the candidate length (up to the request's
  hashed length, past ``num_tokens - 1``) and dropping what it found
  there: a block is kept when the index holds the block after it under the
  request's own chain.
- ``UnitaryKVCacheCoordinator`` (one KV-cache group) looks no further than
  ``num_tokens - 1`` and drops the last block it found. For a prompt whose
  length is a whole number of blocks, the last block is never looked at,
  so the drop takes a block the hybrid rule keeps: a 12-token prompt on
  4-token blocks sent twice hits 4 tokens, where a full-attention group
  beside a sliding window (the hybrid coordinator, the same cache) hits 8.
  A 32-token prompt on 16-token blocks hits nothing.
- On a lone sliding window the same blindness can lose the whole hit: the
  window's search needs its window and the block after it within the
  limit, finds no such run, and falls back to the run from token 0. A
  9-token prompt on 3-token blocks under a 3-token window, resent as a
  prefix of a 10-token one whose first block the window freed uncached,
  hits 0 where the index (entries 6 and 9) serves 6. Found by the state
  machine from scratch (2026-12-05, 600 s campaign, shrunk to the program
  of the second test below).
- Nothing wrong is read: the extra block is recomputed. (Neither rule
  proves the dropped-or-kept block's draft KV was written by a request
  with the same next token; vLLM issue 50438 proposes keys that would.)

Reach: engine in principle. A model whose target and draft layers form one
KV-cache group, an EAGLE-style drafter with the block drop, prefix caching
on, and an identical block-aligned prompt sent again: vLLM's own code path
(``Scheduler`` builds ``KVCacheManager(use_eagle=...)``, which builds the
unitary coordinator for one group). Shown through the scheduler API.

Strict xfail: this turns red the day the two coordinators agree; then set
``fixed_in`` on the ``eagle-resend-drops-proven-block`` entry of
fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.model import LayoutDraw, SpecDraw
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.hits import check_hit_matches_index
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.known_bugs.runs import eagle_resend
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def test_the_hybrid_coordinator_keeps_the_block_the_next_one_proves() -> None:
    """The control: full attention beside a sliding window (the hybrid
    coordinator) holds all three blocks in both groups and hits 8."""
    adm = eagle_resend(SpecDraw("FullAttentionSpec", 4), SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 8),)))
    check_hit_matches_index(adm)
    assert adm.index_hold == ((4, 8, 12), (4, 8, 12)) and adm.local_hit == 8, adm.describe()


@known_vllm_bug("vLLM bug eagle-resend-drops-proven-block (fuzz/known_bugs.py)")
def test_a_single_group_keeps_the_block_the_next_one_proves() -> None:
    adm = eagle_resend(SpecDraw("FullAttentionSpec", 4))
    assert adm.index_hold == ((4, 8, 12),) and adm.hit_drops == (4,), adm.describe()
    with shown_as("eagle-resend-drops-proven-block"):
        check_hit_matches_index(adm)


@known_vllm_bug("vLLM bug eagle-resend-drops-proven-block (fuzz/known_bugs.py)")
def test_a_single_window_keeps_the_hit_the_next_block_proves() -> None:
    """The campaign's shrunk program (its group a SlidingWindowMLASpec, here
    the plain spec: the same manager): a 10-token prompt, then its first 9
    tokens, on one window of 3 tokens over 3-token blocks, one sequence and
    4 tokens a step (sync, k = 1, no draft accepted)."""
    layout = LayoutDraw((SpecDraw("SlidingWindowSpec", 3, (("sliding_window", 3),)),), hash_block_size=3,
                        num_blocks=13)
    harness = harness_of(layout, batch=4, seqs=1, model_runner="v2", speculative_method="eagle",
                         num_speculative_tokens=1, draft_acceptance=(0,))
    harness.add_request(range(0, 70, 7), max_tokens=1)
    harness.drain()
    rid = harness.add_request(range(0, 63, 7), max_tokens=1)
    (adm,) = [a for a in harness.step().admissions if a.request_id == rid]
    assert adm.index_hold == ((6, 9),) and adm.hit_limit == 8 and adm.hit_drops == (3,), adm.describe()
    with shown_as("eagle-resend-drops-proven-block"):
        check_hit_matches_index(adm)
