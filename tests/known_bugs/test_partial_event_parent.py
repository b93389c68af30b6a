"""Known vLLM bug: a partial prefix-cache entry's ``BlockStored`` event names a
parent key that no event announced.

Found by: ``events-chain`` in the scheduler state machine (KV events on,
a Mamba hybrid with a hash unit finer than its blocks), 2026-12-04.

Analysis (vLLM 0.33.0, ``vllm/v1/core/block_pool.py``):

- With fine-grained hash hits on (``KVCacheCoordinator.enable_partial_hash_hits``:
  Mamba in align mode, hash unit finer than the blocks), a prompt that ends
  inside a block past a hash boundary is cached as one partial entry at its
  last hash boundary ``L`` (``cache_partial_block``): the index files the
  block under the key at ``L``, beside the full blocks before it.
- Its ``BlockStored`` carries the last hash unit's tokens and names as
  ``parent_block_hash`` the request's fine-grained hash at ``L - h``
  (``_get_partial_block_parent_hash_and_start``). Unless ``L - h`` is a
  block boundary, nothing is filed under that key and no event announced
  it.
- A router that keeps a replica's announced blocks as a tree of prefixes
  (each block under its parent) cannot place the event: the partial hit the
  engine serves is never routed to.

Reach: in principle a real engine (a Mamba hybrid with
``--enable-prefix-caching`` in align mode and ``--kv-events-config``); shown
here through the scheduler API (the engine-reachable target does not draw KV
events).

Upstream: vllm-project/vllm issue 58119 (reported 2026-09-22, open) describes
this event first; PR 58121 (open) adds the skipped ancestry to it.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``partial-event-names-unannounced-parent`` entry of fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.model import SpecDraw
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.known_bugs.runs import EVENTS_HYBRID, one_prompt_with_events

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


@pytest.mark.parametrize("length", [17, 21])
def test_a_partial_entry_at_a_block_boundary_plus_one_unit_is_chained(length: int) -> None:
    """The control: a prompt whose last cacheable boundary is a block's (17
    tokens: 16) or one hash unit past it (21 tokens: the partial entry at
    20, its parent the full block's key at 16) publishes every parent first."""
    one_prompt_with_events(EVENTS_HYBRID, length)


def test_full_attention_alone_caches_no_partial_entry() -> None:
    """The control: without fine-grained hits (one full-attention group) the
    same 30-token prompt caches its full block only, its event chained."""
    one_prompt_with_events((SpecDraw("FullAttentionSpec", 16),), 30)


@known_vllm_bug("vLLM bug partial-event-names-unannounced-parent (fuzz/known_bugs.py)")
def test_a_partial_entrys_event_hangs_under_an_announced_parent() -> None:
    """30 tokens: the partial entry at 28 names as parent the key at 24,
    which nothing announced."""
    with shown_as("partial-event-names-unannounced-parent"):
        one_prompt_with_events(EVENTS_HYBRID, 30)
