"""eviction-order's partial order on hand-made records (invariants/hits.py):
a block with no key before any cached one (a), a request's free of one
group tail first (b), earlier frees before later ones (c), and nothing said
of blocks the rules leave unordered."""

from __future__ import annotations

import pytest

from fuzz.model import Eviction, FreedBlock, MissedHit, StepObservation
from invariants.hits import check_eviction_order, reused_before


def _step(*evictions: Eviction) -> StepObservation:
    return StepObservation(
        step=5, admissions=(), error=None, error_type=None, error_where=None, dishonest_replies=(),
        num_scheduled={}, newly_scheduled=(), preempted=frozenset(), finished=frozenset(), evictions=evictions,
    )


def _freed(block: int, step: int, *, keyed: bool = True, request: str | None = None, index: int | None = None,
           release: int | None = None) -> FreedBlock:
    keys = (f"g0:{block:08x}@{4 * (block + 1)}",) if keyed else ()
    return FreedBlock(block, step, keys, request, None if request is None else 0, index, release)


# b: block 1 of request r0's free at step 2 (table index 0), cached.
B = _freed(1, 2, request="r0", index=0, release=1)


@pytest.mark.parametrize(
    ("c", "rule"),
    [
        # (a) no key: one that came back without a key, or one never used.
        (_freed(7, 3, keyed=False, request="r1", index=3, release=2), "(a)"),
        (_freed(8, 0, keyed=False), "(a)"),
        # (c) cached at an earlier step, whoever freed it.
        (_freed(4, 1, request="r9", index=0, release=0), "(c)"),
        (_freed(5, 1), "(c)"),
        # (b) later in the same free's table.
        (_freed(2, 2, request="r0", index=1, release=1), "(b)"),
    ],
)
def test_the_order_puts_these_ahead_of_a_cached_block(c: FreedBlock, rule: str) -> None:
    why = reused_before(c, B)
    assert why is not None and why.startswith(rule), why


@pytest.mark.parametrize(
    "c",
    [
        # Earlier in the same free's table: the free reaches it after b.
        _freed(0, 2, request="r0", index=0, release=1),
        # The same step, another request's free or another path: unordered.
        _freed(3, 2, request="r1", index=2, release=2),
        _freed(3, 2),
        # A later free, and a later table index of another free of r0 (a
        # preempted request freed again).
        _freed(6, 3, request="r0", index=5, release=3),
        _freed(6, 2, request="r0", index=5, release=2),
        # The block itself.
        B,
    ],
)
def test_the_order_says_nothing_of_these(c: FreedBlock) -> None:
    assert reused_before(c, B) is None


def test_a_block_that_came_back_without_a_key_is_not_judged() -> None:
    # It went to the front of the queue; the claim orders only cached blocks' evictions.
    b = _freed(1, 2, keyed=False, request="r0", index=0, release=1)
    assert reused_before(_freed(5, 1), b) is None and reused_before(_freed(7, 3, keyed=False), b) is None


def test_an_eviction_with_an_ordered_survivor_is_a_missed_hit_naming_both() -> None:
    head = Eviction(5, B, B.keys, (_freed(2, 2, request="r0", index=1, release=1), _freed(3, 2)))
    with pytest.raises(MissedHit) as caught:
        check_eviction_order(_step(head))
    v = caught.value
    assert v.invariant == "eviction-order" and v.where == "BlockPool.get_new_blocks"
    text = str(v)
    for fact in ("step 5", "block 1 ", "block 2 ", "request r0", "table index 1", "freed at step 2", "g0:00000001@8"):
        assert fact in text, (fact, text)
    assert "block 3 " not in text  # unordered: not named


def test_an_eviction_ahead_of_every_survivor_passes() -> None:
    # The tail block first, the survivors freed later or unordered with it.
    tail = _freed(2, 2, request="r0", index=1, release=1)
    check_eviction_order(_step(Eviction(5, tail, tail.keys, (B, _freed(3, 2), _freed(9, 4)))))
    check_eviction_order(_step())
