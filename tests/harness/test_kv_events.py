"""The KV-event replay (fuzz/adapter/_events.py) on hand-made events, and
the harness publishing real ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fuzz.adapter import SchedulerHarness
from fuzz.adapter._events import EventLog, event_gaps, index_counts
from fuzz.model import LayoutDraw, SchedulerDraw, SpecDraw


def _stored(group: int, *keys: int, parent: int | None = None, tokens: int = 4, block_size: int = 4) -> object:
    fields = {"block_hashes": list(keys), "group_idx": group, "parent_block_hash": parent,
              "token_ids": [0] * tokens, "block_size": block_size}
    return type("BlockStored", (), fields)()


def _removed(group: int, *keys: int) -> object:
    return type("BlockRemoved", (), {"block_hashes": list(keys), "group_idx": group})()


def _cleared() -> object:
    return type("AllBlocksCleared", (), {})()


def _block(block_id: int) -> SimpleNamespace:
    return SimpleNamespace(block_id=block_id)


def _index(entries: dict[tuple[int, int], list[int]]) -> dict[tuple[int, int], list[int]]:
    # A map key -> {block id: block}, as vLLM's BlockHashToBlockMap keeps it;
    # here the key is already (group, external hash).
    cached = {key: {b: _block(b) for b in ids} for key, ids in entries.items()}
    return index_counts(cached, lambda key: key)


def test_a_key_two_blocks_hold_is_announced_twice() -> None:
    log = EventLog()
    log.replay([_stored(0, 7, 8), _stored(0, 7)])
    assert event_gaps(log.counts, _index({(0, 7): [3, 5], (0, 8): [4]})) == []
    # One of the two withdrawn: the key stays, held once.
    log.replay([_removed(0, 7)])
    assert event_gaps(log.counts, _index({(0, 7): [5], (0, 8): [4]})) == []


def test_an_unannounced_removal_and_an_unannounced_entry_are_gaps() -> None:
    log = EventLog()
    log.replay([_stored(1, 7), _removed(1, 7), _removed(1, 7)])
    assert event_gaps(log.counts, _index({(1, 9): [2]})) == [(1, 7, -1, ()), (1, 9, 0, (2,))]


def test_a_stored_event_whose_parent_no_event_announced_in_its_group_is_an_orphan() -> None:
    log = EventLog()
    # 7 announced in group 0: a child of 7 there is placed; in group 1, or of
    # 9 (never announced), or of 7 once withdrawn, it is not.
    log.replay([_stored(0, 7), _stored(0, 8, parent=7), _stored(1, 5, parent=7), _stored(0, 6, parent=9, tokens=2,
                                                                                      block_size=2)])
    log.replay([_removed(0, 7), _stored(0, 4, parent=7)])
    assert log.take_orphans() == [(1, 7, 5, 4, 4), (0, 9, 6, 2, 2), (0, 7, 4, 4, 4)]
    assert log.take_orphans() == []


def test_groups_are_kept_apart_and_a_clear_forgets_everything() -> None:
    log = EventLog()
    log.replay([_stored(0, 7), _stored(1, 7)])
    assert event_gaps(log.counts, _index({(0, 7): [1]})) == [(1, 7, 1, ())]
    log.replay([_cleared()])
    assert event_gaps(log.counts, _index({})) == []


def test_an_unknown_event_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown KV event"):
        EventLog().replay([type("BlockMoved", (), {})()])


@pytest.mark.parametrize("kv_events", [False, True], ids=["off", "on"])
def test_the_harness_replays_what_vllm_publishes(kv_events: bool) -> None:
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=9)
    harness = SchedulerHarness(SchedulerDraw(layout, max_num_batched_tokens=32, max_num_seqs=2, kv_events=kv_events))
    steps = []
    for i in range(4):
        harness.add_request(range(100 * i, 100 * i + 13), max_tokens=2)
        steps += harness.drain()
    assert all(not s.event_gaps for s in steps)
    assert any(s.events_replayed for s in steps) == kv_events
    if kv_events:
        assert harness.observer.events is not None
        seen = harness.observer.events.events_seen
        # 4 prompts x 3 full blocks stored; the last two prompts evict 3 + 3.
        assert seen["BlockStored"] >= 4 and seen["BlockRemoved"] >= 2, seen
    else:
        assert harness.observer.events is None
