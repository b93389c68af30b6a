"""The KV-event replay (fuzz/adapter/_events.py) on hand-made events, and
the harness publishing real ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fuzz.adapter import FIXED_RUNS, planted_scheduler_bug
from fuzz.adapter._event_payloads import PayloadLog, expected_extra_keys, stored_blocks
from fuzz.adapter._events import EventLog, IndexTally, event_gaps, index_counts
from fuzz.model import AddRequest, LayoutDraw, SpecDraw
from fuzz.runners.scheduler import run_fixed
from invariants.promises import check_events_carry_namespace, check_events_carry_tokens
from invariants.scheduler import STEP_CHECKS
from tests.support.harnesses import harness_of


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


class _Map:
    """vLLM's BlockHashToBlockMap in miniature: key -> block, or {block id: block}."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, int], object] = {}

    def insert(self, key: tuple[int, int], block: SimpleNamespace) -> None:
        held = self._cache.get(key)
        if held is None:
            self._cache[key] = block
        elif isinstance(held, dict):
            held[block.block_id] = block
        else:
            self._cache[key] = {held.block_id: held, block.block_id: block}

    def pop(self, key: tuple[int, int], block_id: int) -> None:
        held = self._cache.pop(key, None)
        if isinstance(held, dict):
            held.pop(block_id, None)
            if held:
                self._cache[key] = held


def test_the_tally_reports_what_a_whole_recount_reports() -> None:
    log, tally, index = EventLog(), IndexTally(lambda key: key), _Map()

    def both() -> list[tuple[int | None, int, int, tuple[int, ...]]]:
        whole = event_gaps(log.counts, index_counts(index._cache, lambda key: key))
        assert tally.gaps(log.counts, log.take_touched(), index, index._cache) == whole
        return whole

    assert both() == []
    index.insert((0, 7), _block(1))
    index.insert((0, 7), _block(2))
    log.replay([_stored(0, 7), _stored(0, 7)])
    assert both() == []
    # Withdrawn without an event: the map's own pop shows it; it stands
    # until something changes it.
    index.pop((0, 7), 1)
    assert both() == [(0, 7, 2, (2,))]
    assert both() == [(0, 7, 2, (2,))]
    log.replay([_removed(0, 7)])
    assert both() == []
    # Written past insert(): the map's size gives it away.
    index._cache[(1, 9)] = _block(3)
    assert both() == [(1, 9, 0, (3,))]
    # A reset puts a new map in place: every key of both is looked at.
    log.replay([_stored(1, 9), _stored(1, 4)])
    index = _Map()
    index.insert((1, 4), _block(5))
    assert both() == [(0, 7, 1, ()), (1, 9, 1, ())]
    log.replay([_cleared(), _stored(1, 4)])
    assert both() == []


@pytest.mark.parametrize("kv_events", [False, True], ids=["off", "on"])
def test_the_harness_replays_what_vllm_publishes(kv_events: bool) -> None:
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=9)
    harness = harness_of(layout, batch=32, seqs=2, kv_events=kv_events)
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


@pytest.mark.parametrize("bug", ["stored_event_tokens_shifted", "stored_event_drops_lora"])
def test_a_payload_that_disagrees_with_its_block_is_missed_by_every_other_check(bug: str) -> None:
    # Counts and parents still add up: only the payload claims see it
    # (tests/invariants/test_scheduler_planted.py shows those catching it).
    others = tuple(c for c in STEP_CHECKS if c not in (check_events_carry_tokens, check_events_carry_namespace))
    with planted_scheduler_bug(bug):
        stepper = run_fixed(FIXED_RUNS[bug], others)
    assert stepper.harness.observer.events is not None
    assert stepper.harness.observer.events.events_seen["BlockStored"] >= 1


def test_a_consumer_slices_an_event_per_key() -> None:
    event = _stored(0, 7, 8, parent=5, tokens=8, block_size=4)
    event.token_ids = list(range(8))
    event.extra_keys = [("adapter-b", "salt"), None]
    first, second = stored_blocks(event)
    assert (first.parent, first.tokens, first.extra_keys) == (5, (0, 1, 2, 3), ("adapter-b", "salt"))
    assert (second.parent, second.tokens, second.extra_keys) == (7, (4, 5, 6, 7), None)
    # A sparse group's event carries the tokens of the blocks it skips too:
    # no slice a consumer can trust.
    assert stored_blocks(_stored(1, 7, tokens=8, block_size=4))[0].tokens is None
    log = PayloadLog()
    log.replay([event, _removed(0, 7)])
    assert list(log.tree) == [(0, 8)] and len(log.take_stored()) == 2 and log.take_stored() == []


def test_the_extra_keys_a_block_must_carry() -> None:
    add = AddRequest("r1", tuple(range(13)), 2, None, 0, cache_salt="tenant-a", lora="adapter-b",
                     mm=(("image-a", 2, 6),))
    # LoRA name, each image overlapping the block at its offset in it, the
    # salt on the first block only.
    assert expected_extra_keys(add, 0, 4) == ("adapter-b", ("image-a", 2), "tenant-a")
    assert expected_extra_keys(add, 4, 8) == ("adapter-b", ("image-a", -2))
    assert expected_extra_keys(add, 8, 12) == ("adapter-b",)
    assert expected_extra_keys(AddRequest("r2", (0,) * 8, 2, None, 0), 4, 8) is None


def test_requests_hash_as_the_engine_does_when_an_eagle_hash_looks_ahead() -> None:
    """An EAGLE drafter without a KV connector: each block's hash also covers
    the token after it (``VllmConfig.num_hash_lookahead_tokens``), as
    ``EngineCore`` builds every request's hasher. The harness's requests
    must hash the same way: built with the legacy hasher, a request whose
    image starts right after its first block got the first block's key of a
    request without it there, while the pool announced that key with the
    image's extra key (an events-carry-namespace failure of the harness's
    own making, met by the model-cost bench's machine hunt)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=24)
    harness = harness_of(layout, batch=32, seqs=1, kv_events=True, connector=False, divergent_hits=False,
                         speculative_method="eagle", num_speculative_tokens=1, draft_acceptance=(0,))
    assert harness.scheduler.num_hash_lookahead_tokens == 1  # vLLM 0.33.0's engine hashes so
    tokens = tuple(range(100, 116))
    harness.add_request(tokens, max_tokens=2, request_id="r0", mm=(("image-a", 8, 4),))
    first = harness.scheduler.requests["r0"].block_hashes[0]
    steps = harness.drain()
    harness.add_request(tokens, max_tokens=2, request_id="r1", mm=(("image-a", 4, 4),))
    # The first block's hash covers token 4, where r1's image starts: not r0's key.
    assert harness.scheduler.requests["r1"].block_hashes[0] != first
    steps += harness.drain()
    for step in steps:
        check_events_carry_namespace(step)
