"""The index a lookup reads (``fuzz.adapter._hits.index_hold``, the model
side of hit-matches-index) on a real scheduler."""

from __future__ import annotations

import pytest

from fuzz.model import LayoutDraw, SpecDraw
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def test_groups_of_one_spec_hold_a_prefix_only_together() -> None:
    """Shrunk from a scheduler-machine campaign (a misfit of
    hit-matches-index, fixed): vLLM looks groups of one spec up together
    (the hybrid coordinator's spec groups), so a length counts for them only
    where every one holds it. Two identical Mamba groups beside full
    attention; one Mamba group's entries dropped from a copy of the index:
    neither holds a state any more."""
    from fuzz.adapter import _compat
    from fuzz.adapter._hits import index_hold
    from vllm.v1.core.kv_cache_utils import get_group_id

    layout = LayoutDraw((SpecDraw("MambaSpec", 4), SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)),
                        hash_block_size=4, num_blocks=41)
    harness = harness_of(layout, batch=32, seqs=2)
    harness.add_request(range(17), max_tokens=1)
    harness.drain()
    probe = harness._requests[harness.add_request(range(17), max_tokens=1)]
    cached = dict(_compat.prefix_cache_map(harness.pool))
    together = index_hold(harness.manager, probe, None, cached, harness.partial_hits_enabled)["index_hold"]
    assert together[0] == together[2] and together[0], together
    alone = {key: blocks for key, blocks in cached.items() if get_group_id(key) != 2}
    held = index_hold(harness.manager, probe, None, alone, harness.partial_hits_enabled)["index_hold"]
    assert held[0] == () and held[2] == () and held[1] == together[1], held
    harness.drain()
