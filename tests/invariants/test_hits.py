"""hit-matches-index's rules on hand-made observations: the reach of a
full-attention group (full blocks, then one partial entry with sub-block
hits on), Mamba states, sliding windows, attention chunks, the alignment, the limit, and
the divergent-hit connector's local hit (invariants/hits.py)."""

from __future__ import annotations

import pytest

from fuzz.model import AdmissionObservation, GroupInfo, InvariantViolation, MissedHit, group_behaviour
from invariants.hits import (
    HIT_LONGER, HIT_LONGER_WITHOUT_EAGLE_PROOF, HIT_SHORTER, HIT_SHORTER_EAGLE_PROOF_PAST_LIMIT, HIT_SHORTER_INSIDE_A_FULL_BLOCK,
    HIT_SHORTER_EAGLE_WINDOW_FROM_ZERO, check_hit_matches_index, predicted_hit,
)

FULL, MAMBA = "vllm.v1.kv_cache_interface.FullAttentionSpec", "vllm.v1.kv_cache_interface.MambaSpec"
WINDOW = "vllm.v1.kv_cache_interface.SlidingWindowSpec"
CHUNKED = "vllm.v1.kv_cache_interface.ChunkedLocalAttentionSpec"


def _adm(groups: list[tuple[str, int]], held: list[tuple[int, ...]], *, align: int, limit: int, hit: int = 0,
         divergent: bool = False, windows: tuple[int, ...] = (), chunks: tuple[int, ...] = (),
         drops: tuple[int, ...] = ()) -> AdmissionObservation:
    infos = tuple(GroupInfo(i, cls, (), size, True) for i, (cls, size) in enumerate(groups))
    return AdmissionObservation(
        request_id="r0", step=1, num_tokens=limit + 1, groups=infos, spans=tuple(None for _ in groups),
        behaviours=tuple(group_behaviour(g) for g in infos), span_rules=tuple(None for _ in groups),
        scheduler_block_size=max(s for _, s in groups), hash_block_size=align, null_block_id=0,
        divergent_capable=divergent, local_hit=hit, local_blocks=(), hit_diverged=False, per_group_hits=(),
        joint_hit=hit, joint_blocks=(), index_hold=tuple(held), hit_alignment=align, hit_limit=limit,
        hit_windows=windows, hit_chunks=chunks, hit_drops=drops,
    )


@pytest.mark.parametrize(
    ("groups", "held", "align", "limit", "expected"),
    [
        # Full blocks only, capped by the limit and broken by a missing block.
        ([(FULL, 4)], [(4, 8, 12)], 4, 12, 12),
        ([(FULL, 4)], [(4, 8, 12)], 4, 11, 8),
        ([(FULL, 4)], [(4, 12)], 4, 12, 4),
        # Sub-block hits: one partial entry past the full run; none without them.
        ([(FULL, 8)], [(8, 12)], 4, 20, 12),
        ([(FULL, 8)], [(8, 12)], 8, 20, 8),
        # Two full-attention groups: the shorter reach, aligned.
        ([(FULL, 4), (FULL, 8)], [(4, 8, 12, 16), (8, 12)], 4, 20, 12),
        # Mamba: exactly a length it holds a state for, within the full-attention reach.
        ([(FULL, 4), (MAMBA, 8)], [(4, 8, 12, 16), (8, 24)], 8, 30, 8),
        ([(MAMBA, 8)], [(8, 24)], 8, 30, 24),
    ],
)
def test_the_longest_hit_the_index_allows(groups, held, align, limit, expected) -> None:
    predicted = predicted_hit(_adm(groups, held, align=align, limit=limit))
    assert predicted is not None and predicted[0] == expected, predicted


@pytest.mark.parametrize(
    ("groups", "windows", "held", "align", "limit", "expected"),
    [
        # An 8-token window on 4-token blocks reads the 7 tokens before the
        # hit: the last two blocks, whatever lies further back.
        ([(WINDOW, 4)], (8,), [(8, 12)], 4, 12, 12),
        ([(WINDOW, 4)], (8,), [(4, 12)], 4, 12, 4),
        ([(WINDOW, 4)], (8,), [(12,)], 4, 12, 0),
        ([(WINDOW, 4)], (8,), [(8, 12, 16)], 4, 15, 12),
        # ceil((window - 1) / block) blocks: a 5-token window needs one, a 10-token one three.
        ([(WINDOW, 4)], (5,), [(12,)], 4, 12, 12),
        ([(WINDOW, 4)], (10,), [(8, 12)], 4, 12, 0),
        ([(WINDOW, 4)], (10,), [(4, 8, 12)], 4, 12, 12),
        # A window of one token still needs the hit's last block.
        ([(WINDOW, 4)], (1,), [(4, 12)], 4, 12, 12),
        ([(WINDOW, 4)], (1,), [(4,)], 4, 12, 4),
        # Near token 0 the window needs only the blocks there are.
        ([(WINDOW, 4)], (16,), [(4, 8)], 4, 12, 8),
        # The hit is a whole number of the window's blocks and of the alignment.
        ([(WINDOW, 4)], (5,), [(4, 8, 12)], 8, 14, 8),
        ([(WINDOW, 8)], (9,), [(8, 16, 24)], 4, 30, 24),
        # Beside full attention: the longest length within its reach the window serves.
        ([(FULL, 4), (WINDOW, 4)], (0, 5), [(4, 8), (12,)], 4, 12, 0),
        ([(FULL, 4), (WINDOW, 4)], (0, 5), [(4, 8, 12), (8,)], 4, 12, 8),
        ([(FULL, 4), (WINDOW, 4)], (0, 5), [(4, 8, 12, 16), (8, 16)], 4, 14, 8),
        # Two windows: a length both serve.
        ([(WINDOW, 4), (WINDOW, 4)], (5, 9), [(4, 12, 16), (8, 12)], 4, 16, 12),
        # With Mamba: a state the window also serves, within the full-attention reach.
        ([(FULL, 4), (WINDOW, 4), (MAMBA, 8)], (0, 5, 0), [(4, 8, 12, 16), (8, 16), (8, 16)], 8, 20, 16),
        ([(FULL, 4), (WINDOW, 4), (MAMBA, 8)], (0, 5, 0), [(4, 8, 12, 16), (8,), (8, 16)], 8, 20, 8),
        ([(WINDOW, 4), (MAMBA, 8)], (5, 0), [(16,), (8, 16)], 8, 20, 16),
    ],
)
def test_the_longest_hit_a_sliding_window_serves(groups, windows, held, align, limit, expected) -> None:
    predicted = predicted_hit(_adm(groups, held, align=align, limit=limit, windows=windows))
    assert predicted is not None and predicted[0] == expected, predicted


@pytest.mark.parametrize(
    ("groups", "chunks", "held", "align", "limit", "expected"),
    [
        # 8-token chunks on 4-token blocks: the blocks of the hit's last chunk, none before it.
        ([(CHUNKED, 4)], (8,), [(4, 8, 12)], 4, 12, 12),
        ([(CHUNKED, 4)], (8,), [(12,)], 4, 12, 12),
        ([(CHUNKED, 4)], (8,), [(12,)], 4, 15, 12),
        # A length at a chunk boundary needs no block at all.
        ([(CHUNKED, 4)], (8,), [()], 4, 12, 8),
        ([(CHUNKED, 4)], (8,), [(4, 8)], 4, 20, 16),
        ([(CHUNKED, 4)], (8,), [(4, 8, 16)], 4, 20, 16),
        ([(CHUNKED, 4)], (8,), [(4, 8, 20)], 4, 20, 20),
        # Beside full attention, within its reach.
        ([(FULL, 4), (CHUNKED, 4)], (0, 8), [(4, 8, 12), (4,)], 4, 12, 8),
        ([(FULL, 4), (CHUNKED, 4)], (0, 8), [(4,), (4, 8, 12)], 4, 12, 4),
        ([(FULL, 4), (CHUNKED, 4)], (0, 8), [(4, 8, 12), (12,)], 4, 12, 12),
    ],
)
def test_the_longest_hit_a_chunked_local_group_serves(groups, chunks, held, align, limit, expected) -> None:
    predicted = predicted_hit(_adm(groups, held, align=align, limit=limit, chunks=chunks))
    assert predicted is not None and predicted[0] == expected, predicted


@pytest.mark.parametrize(
    ("groups", "windows", "drops", "held", "align", "limit", "expected"),
    [
        # One full-attention group: a length needs the entry one drop unit past
        # it; a resend of a cached block-aligned prompt (limit 11 of 12 tokens)
        # is proven by the block past the limit.
        ([(FULL, 4)], (), (4,), [(4, 8, 12)], 4, 11, 8),
        ([(FULL, 4)], (), (4,), [(4, 8, 12)], 4, 12, 8),
        ([(FULL, 4)], (), (4,), [(4, 8)], 4, 20, 4),
        ([(FULL, 4)], (), (4,), [(4,)], 4, 20, 0),
        # Sub-block hits: the drop is one hash unit, and a partial entry proves it.
        ([(FULL, 8)], (), (4,), [(8, 12)], 4, 20, 8),
        ([(FULL, 8)], (), (4,), [(8, 16)], 4, 20, 12),
        # A group that holds no draft layers (drop 0) keeps its whole reach.
        ([(FULL, 4), (WINDOW, 4)], (0, 8), (4, 0), [(4, 8, 12, 16), (8, 12)], 4, 15, 12),
        # A sliding window needs its window before the length and its block after it.
        ([(WINDOW, 4)], (8,), (4,), [(4, 8, 12)], 4, 12, 8),
        ([(WINDOW, 4)], (8,), (4,), [(4, 8)], 4, 12, 4),
        ([(FULL, 4), (WINDOW, 4)], (0, 8), (4, 4), [(4, 8, 12, 16), (8, 12, 16)], 4, 15, 12),
        # A one-token window reads no block before the length: the block after it
        # alone serves it (vLLM adopts the null block below; found on a lone
        # SlidingWindowMLASpec group, block 1, window 1, whose entry 1 was evicted).
        ([(WINDOW, 1)], (1,), (1,), [(2,)], 1, 2, 1),
        ([(WINDOW, 4)], (1,), (4,), [(8,)], 4, 12, 4),
        # Without the drop it still needs a block: vLLM's search stops on a cached one.
        ([(WINDOW, 1)], (1,), (0,), [(2,)], 1, 2, 2),
        ([(WINDOW, 1)], (1,), (0,), [()], 1, 2, 0),
        # A Mamba group never drops: a state within the full-attention group's proven reach.
        ([(FULL, 4), (MAMBA, 8)], (), (4, 0), [(4, 8, 12, 16), (8, 16)], 8, 15, 8),
        ([(FULL, 4), (MAMBA, 8)], (), (4, 0), [(4, 8, 12, 16, 20), (8, 16)], 8, 16, 16),
    ],
)
def test_the_longest_hit_with_an_eagle_drop(groups, windows, drops, held, align, limit, expected) -> None:
    predicted = predicted_hit(_adm(groups, held, align=align, limit=limit, windows=windows, drops=drops))
    assert predicted is not None and predicted[0] == expected, predicted


def test_no_prediction_for_a_chunk_vllms_lookup_refuses() -> None:
    """Chunks not a whole number of blocks, or a hit alignment other than
    the chunked group's block (an assertion in vLLM's lookup)."""
    assert predicted_hit(_adm([(CHUNKED, 4)], [(4, 8)], align=4, limit=12, chunks=(6,))) is None
    assert predicted_hit(_adm([(FULL, 8), (CHUNKED, 4)], [(8,), (4, 8)], align=8, limit=12, chunks=(0, 8))) is None


def test_a_divergent_hit_connector_gets_the_full_attention_groups_own_reach() -> None:
    groups, held = [(FULL, 4), (MAMBA, 8)], [(4, 8, 12, 16), (8,)]
    assert predicted_hit(_adm(groups, held, align=4, limit=20, divergent=True))[0] == 16  # type: ignore[index]
    # A Mamba state past the full-attention reach: vLLM falls back to the joint hit.
    assert predicted_hit(_adm(groups, [(4,), (8,)], align=4, limit=20, divergent=True))[0] == 0  # type: ignore[index]
    # A window group's own hit is compared like the Mamba group's.
    groups, windows = [(FULL, 4), (WINDOW, 4), (MAMBA, 8)], (0, 5, 0)
    held = [(4, 8, 12, 16), (4, 8), (8,)]
    assert predicted_hit(_adm(groups, held, align=4, limit=20, divergent=True, windows=windows))[0] == 16  # type: ignore[index]
    held = [(4, 8), (4, 8, 12), (8,)]
    assert predicted_hit(_adm(groups, held, align=4, limit=20, divergent=True, windows=windows))[0] == 8  # type: ignore[index]


def test_longer_is_a_violation_shorter_a_missed_hit_equal_passes() -> None:
    groups, held = [(FULL, 4)], [(4, 8)]
    check_hit_matches_index(_adm(groups, held, align=4, limit=12, hit=8))
    with pytest.raises(MissedHit) as short:
        check_hit_matches_index(_adm(groups, held, align=4, limit=12, hit=4))
    assert "4 cached token(s) recomputed" in str(short.value)
    with pytest.raises(InvariantViolation) as long:
        check_hit_matches_index(_adm(groups, held, align=4, limit=12, hit=12))
    assert not isinstance(long.value, MissedHit) and long.value.state == "a hit longer than the index holds"


@pytest.mark.parametrize(
    ("groups", "windows", "drops", "held", "align", "limit", "hit", "state"),
    [
        # A lone group one drop short of a hit proven past the limit (a block-aligned resend).
        ([(FULL, 4)], (), (4,), [(4, 8, 12)], 4, 11, 4, HIT_SHORTER_EAGLE_PROOF_PAST_LIMIT),
        # A lone window whose proof lies past the limit loses the whole hit: its search
        # finds no run of the window and the block after within the limit.
        ([(WINDOW, 4)], (4,), (4,), [(8, 12)], 4, 11, 0, HIT_SHORTER_EAGLE_PROOF_PAST_LIMIT),
        ([(WINDOW, 4)], (8,), (4,), [(4, 8, 12)], 4, 11, 4, HIT_SHORTER_EAGLE_PROOF_PAST_LIMIT),
        # ... any other answer, or a proof within the limit: another missed hit.
        ([(WINDOW, 4)], (8,), (4,), [(4, 8, 12)], 4, 11, 0, HIT_SHORTER),
        ([(WINDOW, 4)], (4,), (4,), [(8, 12)], 4, 12, 0, HIT_SHORTER),
        # ... two short, or beside another group: another missed hit, not that one.
        ([(FULL, 4)], (), (4,), [(4, 8, 12)], 4, 11, 0, HIT_SHORTER),
        ([(FULL, 4), (MAMBA, 4)], (), (4, 0), [(4, 8, 12), (4, 8)], 4, 11, 4, HIT_SHORTER),
        # A window on finer blocks than the alignment, its run from token 0 shorter than
        # the window and the block after: one alignment unit short.
        ([(FULL, 8), (WINDOW, 4)], (0, 64), (8, 4), [(8, 16), (4, 8, 12)], 8, 20, 0,
         HIT_SHORTER_EAGLE_WINDOW_FROM_ZERO),
        # ... a window the run covers: another missed hit.
        ([(FULL, 8), (WINDOW, 4)], (0, 8), (8, 4), [(8, 16), (4, 8, 12)], 8, 20, 0, HIT_SHORTER),
        # One-token hash unit beside Mamba: the 8-token group proves 16 only at 17,
        # inside its cached full block 16-24 with no entry there; vLLM's search,
        # which reads no full block past 17, drops to 15 and the Mamba group to 9
        # (met by the state machine): the full-block bug, one drop past the hit.
        ([(FULL, 4), (FULL, 8), (MAMBA, 4)], (), (1, 1, 0), [(4, 8, 12, 16, 20), (8, 16, 24), (8, 9, 16)], 1, 26, 9,
         HIT_SHORTER_INSIDE_A_FULL_BLOCK),
        # ... entries at 17 (partial ones) in both full-attention groups: the proof is
        # there, another missed hit.
        ([(FULL, 4), (FULL, 8), (MAMBA, 4)], (), (1, 1, 0), [(4, 8, 12, 16, 17, 20), (8, 16, 17, 24), (8, 9, 16)], 1,
         26, 9, HIT_SHORTER),
    ],
)
def test_each_eagle_shortfall_is_told_apart(groups, windows, drops, held, align, limit, hit, state) -> None:
    """The missed hits known bugs match are told apart from any other
    shortfall, so triage cannot set a new one aside as a known one."""
    with pytest.raises(MissedHit) as short:
        check_hit_matches_index(_adm(groups, held, align=align, limit=limit, hit=hit, windows=windows, drops=drops))
    assert short.value.state == state, short.value


@pytest.mark.parametrize(
    ("drops", "held", "hit", "state"),
    [
        # Every group serves 8 without the drop; the window lacks 12, the entry proving 8.
        ((4, 4, 0), [(4, 8, 12, 16), (4, 8, 16), (8, 24)], 8, HIT_LONGER_WITHOUT_EAGLE_PROOF),
        # ... no drop at all, or a length a group does not serve even without it: another longer hit.
        ((), [(4, 8, 12, 16), (4, 16), (8, 24)], 8, HIT_LONGER),
        ((4, 4, 0), [(4, 8, 12, 16), (4, 8, 16), (8, 24)], 16, HIT_LONGER),
        # ... a full-attention group short of its proof: not that bug's shape.
        ((4, 4, 0), [(4, 8, 16), (4, 8, 12, 16), (8, 24)], 8, HIT_LONGER),
    ],
)
def test_a_longer_hit_missing_only_its_eagle_proof_is_told_apart(drops, held, hit, state) -> None:
    groups = [(FULL, 4), (WINDOW, 4), (MAMBA, 4)]
    with pytest.raises(InvariantViolation) as long:
        check_hit_matches_index(_adm(groups, held, align=4, limit=29, hit=hit, windows=(0, 8, 0), drops=drops))
    assert not isinstance(long.value, MissedHit) and long.value.state == state, long.value


def test_a_lone_group_kept_past_its_eagle_proof_is_another_longer_hit() -> None:
    """No group dropping at all (the planted eagle_drop_forgotten) on one
    full-attention group is not the three-spec bug's shape."""
    with pytest.raises(InvariantViolation) as long:
        check_hit_matches_index(_adm([(FULL, 4)], [(4, 8)], align=4, limit=16, hit=8, drops=(4,)))
    assert long.value.state == HIT_LONGER, long.value


def test_no_prediction_without_the_models_index() -> None:
    adm = _adm([(FULL, 4)], [(4,)], align=4, limit=12, hit=12)
    check_hit_matches_index(AdmissionObservation(**{**adm.__dict__, "index_hold": None}))
