"""The eviction watch (fuzz/adapter/_evictions.py) on real schedulers: how
each free block came back, which cached blocks allocations evict, and the
blocks still free at each eviction, from its own model of the pool."""

from __future__ import annotations

from fuzz.adapter import SchedulerHarness
from fuzz.model import LayoutDraw, SpecDraw
from tests.support.harnesses import harness_of


def _harness(*groups: SpecDraw, num_blocks: int, batch: int = 32) -> SchedulerHarness:
    layout = LayoutDraw(groups, hash_block_size=4, num_blocks=num_blocks)
    return harness_of(layout, batch=batch, seqs=2)


def _drain(harness: SchedulerHarness) -> list:
    steps = []
    while harness.live_request_ids and len(steps) < 64:
        steps.append(harness.step())
    return steps


def test_a_finished_request_comes_back_per_table_index_and_its_cached_blocks_are_evicted_tail_first() -> None:
    h = _harness(SpecDraw("FullAttentionSpec", 4), num_blocks=9)
    watch = h.evictions
    assert set(watch.free) == set(range(1, 9)) and all(f.step == 0 and not f.keys for f in watch.free.values())
    h.add_request(range(13), max_tokens=2)
    _drain(h)
    # 14 computed tokens: 3 cached blocks and a partial tail with no key.
    mine = sorted((f for f in watch.free.values() if f.request is not None), key=lambda f: f.index)
    assert [(f.index, bool(f.keys), f.group) for f in mine] == [(0, True, 0), (1, True, 0), (2, True, 0), (3, False, 0)]
    assert len({f.release for f in mine}) == 1
    for prompt in (range(100, 113), range(200, 213)):
        h.add_request(prompt, max_tokens=2)
        steps = _drain(h)
    evicted = [e for s in steps for e in s.evictions]
    # The third prompt takes the first one's last two cached blocks, tail first.
    assert [(e.freed.request, e.freed.index) for e in evicted] == [("r0", 2), ("r0", 1)], [e.describe() for e in evicted]
    first = evicted[0]
    assert first.keys == first.freed.keys and first.freed.block not in {s.block for s in first.survivors}
    # The block handed out after it in the same call is still a survivor of the first.
    assert evicted[1].freed.block in {s.block for s in first.survivors}
    assert h.evictions.judged == 2


def test_a_prefix_hit_takes_a_block_out_of_the_watched_pool() -> None:
    h = _harness(SpecDraw("FullAttentionSpec", 4), num_blocks=17)
    h.add_request(range(13), max_tokens=2)
    _drain(h)
    cached = {f.block for f in h.evictions.free.values() if f.keys}
    assert len(cached) == 3
    h.add_request(range(13), max_tokens=2)
    h.step()  # the hit adopts all three
    assert not cached & set(h.evictions.free)


def test_blocks_a_window_drops_come_back_outside_a_request_free() -> None:
    # A 24-token prompt in chunks of 8 on an 8-token window: the chunks after
    # the first drop the blocks the window has passed (remove_skipped_blocks).
    h = _harness(SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 8),)), num_blocks=17, batch=8)
    h.add_request(range(24), max_tokens=1)
    _drain(h)
    dropped = [f for f in h.evictions.free.values() if f.step > 0 and f.request is None]
    assert dropped, [f.describe() for f in h.evictions.free.values()]
    assert all(f.index is None and f.release is None for f in dropped)

