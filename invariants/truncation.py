"""Invariants of ``KVCacheManager.truncate_computed_blocks(blocks, n)``.

Each ``check_*`` makes one claim about one observed call and raises
:class:`InvariantViolation` naming the group, spec type, block size, endpoint
and the numbers that disagree. Expected behaviour per group comes from
:mod:`fuzz.model._classification`, never from isinstance checks here.

Block arithmetic: a prefix-cacheable group with block size ``b`` needs
``n // b`` blocks to cover endpoint ``n`` (``n`` is a multiple of ``b`` when
the endpoint is aligned to the scheduler block, the LCM of all ``b``).

With an EAGLE-style drafter (``KVCacheManager(use_eagle=True)``) nothing here
changes: vLLM drops the last matched block in the *lookup* (the single-type
managers' ``find_longest_cache_hit(drop_eagle_block=...)``, driven by the
coordinator's ``drop_eagle_group_ids``), so the blocks handed to
``truncate_computed_blocks`` and the hits the endpoint is drawn from already
lack it; the truncation itself reads neither ``use_eagle`` nor the group
flags (``kv_cache_manager.py``, ``truncate_computed_blocks``). The claims stay
relative to the input each group holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fuzz.model import Behaviour, GroupTruncation, InvariantViolation, TruncationObservation
from fuzz.model import group_behaviour, group_kind, group_name

__all__ = [
    "TRUNCATION_CHECKS",
    "WHERE",
    "check_all_truncation_invariants",
    "check_input_lists_unchanged",
    "check_misaligned_endpoint_rejected",
    "check_must_cover_groups_cover_endpoint",
    "check_no_unexpected_failure",
    "check_output_is_prefix_of_input",
    "check_pool_free_count_unchanged",
    "check_refcounts_and_hashes_unchanged",
    "check_scratch_groups_stay_empty",
    "check_whole_state_groups_clamped",
    "loud_failure_expected",
]


# The vLLM call every check here judges.
WHERE = "KVCacheManager.truncate_computed_blocks"


def _fail(invariant: str, obs: TruncationObservation, message: str, group: GroupTruncation | None = None) -> None:
    raise InvariantViolation(
        invariant,
        f"{message}\n{obs.describe()}",
        where=WHERE,
        group_kind=None if group is None else group_kind(group.info),
        exception=obs.error_type,
        frames=obs.error_frames,
        statement=obs.error_statement,
    )


def _name(g: GroupTruncation) -> str:
    return group_name(g.info)


def _behaviour(g: GroupTruncation) -> Behaviour:
    return group_behaviour(g.info)


def _groups(obs: TruncationObservation, behaviour: Behaviour) -> Iterator[GroupTruncation]:
    return (g for g in obs.groups if _behaviour(g) is behaviour)


def _misaligned(obs: TruncationObservation) -> list[GroupTruncation]:
    return [
        g
        for g in obs.groups
        if _behaviour(g) is not Behaviour.SCRATCH and obs.endpoint % g.info.block_size
    ]


def loud_failure_expected(obs: TruncationObservation) -> bool:
    """True when the call must raise: a must-cover group is short, or the
    endpoint is not a multiple of some prefix-cacheable group's block size."""
    short = any(
        len(g.input_before) < obs.endpoint // g.info.block_size
        for g in _groups(obs, Behaviour.MUST_COVER)
    )
    return short or bool(_misaligned(obs))


def check_must_cover_groups_cover_endpoint(obs: TruncationObservation) -> None:
    """A must-cover group returns exactly ``n // block_size`` blocks; if its
    input holds fewer, the call fails loudly instead of returning it short."""
    if _misaligned(obs):
        return  # rejected for misalignment; that claim is checked separately
    for g in _groups(obs, Behaviour.MUST_COVER):
        need = obs.endpoint // g.info.block_size
        have = len(g.input_before)
        if have < need and obs.error is None:
            _fail(
                "must-cover",
                obs,
                f"{_name(g)} holds {have} blocks but endpoint {obs.endpoint} needs "
                f"{need}; the call returned {len(g.output or ())} blocks instead of "
                "failing loudly (a short attention group was silently accepted)",
                g,
            )
        if have >= need and g.output is not None and len(g.output) != need:
            _fail(
                "must-cover",
                obs,
                f"{_name(g)} returned {len(g.output)} blocks for endpoint "
                f"{obs.endpoint}; expected exactly {need}",
                g,
            )


def check_whole_state_groups_clamped(obs: TruncationObservation) -> None:
    """A whole-state (Mamba) group returns exactly ``min(n // block_size,
    len(input))`` blocks: it may be short, never longer than needed."""
    for g in _groups(obs, Behaviour.MAY_BE_SHORT):
        if g.output is None:
            continue
        need = obs.endpoint // g.info.block_size
        expected = min(need, len(g.input_before))
        if len(g.output) != expected:
            _fail(
                "whole-state-clamped",
                obs,
                f"{_name(g)} returned {len(g.output)} blocks; expected "
                f"min({obs.endpoint} // {g.info.block_size}, {len(g.input_before)}) "
                f"= {expected}",
                g,
            )


def check_no_unexpected_failure(obs: TruncationObservation) -> None:
    """The call succeeds whenever it has no reason to fail: every must-cover
    group covers the endpoint and the endpoint is aligned. In particular a
    short whole-state group is not a reason (the pre-PR-51468 crash)."""
    if obs.error is None or loud_failure_expected(obs):
        return
    short = [
        f"{_name(g)} holds {len(g.input_before)} < {obs.endpoint // g.info.block_size}"
        for g in _groups(obs, Behaviour.MAY_BE_SHORT)
        if len(g.input_before) < obs.endpoint // g.info.block_size
    ]
    why = "; short whole-state groups: " + ", ".join(short) if short else ""
    first_short = next(
        (g for g in _groups(obs, Behaviour.MAY_BE_SHORT) if len(g.input_before) < obs.endpoint // g.info.block_size),
        None,
    )
    _fail(
        "no-unexpected-failure",
        obs,
        f"the call raised although every must-cover group covers endpoint "
        f"{obs.endpoint} and it is aligned{why}",
        first_short,
    )


def check_output_is_prefix_of_input(obs: TruncationObservation) -> None:
    """Each returned group is a prefix of its input: the same block objects,
    in the same order."""
    for g in obs.groups:
        if g.output is None:
            continue
        got = [(b.obj_id, b.block_id) for b in g.output]
        want = [(b.obj_id, b.block_id) for b in g.input_before[: len(g.output)]]
        if len(g.output) > len(g.input_before) or got != want:
            _fail(
                "prefix-view",
                obs,
                f"{_name(g)} returned block ids {[b.block_id for b in g.output]}, "
                f"not a prefix of its input {[b.block_id for b in g.input_before]} "
                "(same objects, same order)",
                g,
            )


def check_input_lists_unchanged(obs: TruncationObservation) -> None:
    """The caller's tuple and per-group lists are the same objects afterwards,
    with the same length and block ids."""
    if obs.tuple_obj_id_before != obs.tuple_obj_id_after:
        _fail("input-unchanged", obs, "the input KVCacheBlocks.blocks tuple was replaced")
    for g in obs.groups:
        ids_before = [b.block_id for b in g.input_before]
        ids_after = [b.block_id for b in g.input_after]
        if g.list_obj_id_before != g.list_obj_id_after or ids_before != ids_after:
            _fail(
                "input-unchanged",
                obs,
                f"{_name(g)} input changed from {ids_before} to {ids_after}"
                + (" (list object replaced)" if g.list_obj_id_before != g.list_obj_id_after else ""),
                g,
            )


def check_refcounts_and_hashes_unchanged(obs: TruncationObservation) -> None:
    """No input block's ``ref_cnt`` or ``block_hash`` changes."""
    for g in obs.groups:
        for before, after in zip(g.input_before, g.input_after):
            if before.is_null:
                continue  # the null block's ref_cnt is not maintained by vLLM
            if (before.ref_cnt, before.block_hash) != (after.ref_cnt, after.block_hash):
                _fail(
                    "refcounts-unchanged",
                    obs,
                    f"{_name(g)} block {before.block_id}: ref_cnt {before.ref_cnt} -> "
                    f"{after.ref_cnt}, hash changed: {before.block_hash != after.block_hash}",
                    g,
                )


def check_pool_free_count_unchanged(obs: TruncationObservation) -> None:
    """The block pool's free count is the same before and after."""
    if obs.free_blocks_before != obs.free_blocks_after:
        _fail(
            "pool-unchanged",
            obs,
            f"free blocks went from {obs.free_blocks_before} to {obs.free_blocks_after}",
        )


def check_scratch_groups_stay_empty(obs: TruncationObservation) -> None:
    """A non-prefix-cacheable group: empty in, empty out."""
    for g in _groups(obs, Behaviour.SCRATCH):
        if not g.input_before and g.output:
            _fail(
                "scratch-empty",
                obs,
                f"{_name(g)} is not prefix-cacheable and came in empty, but returned "
                f"block ids {[b.block_id for b in g.output]}",
                g,
            )


def check_misaligned_endpoint_rejected(obs: TruncationObservation) -> None:
    """An endpoint that is not a multiple of a prefix-cacheable group's block
    size is rejected loudly."""
    bad = _misaligned(obs)
    if bad and obs.error is None:
        g = bad[0]
        _fail(
            "misaligned-rejected",
            obs,
            f"endpoint {obs.endpoint} is not a multiple of {_name(g)}'s block size "
            f"(remainder {obs.endpoint % g.info.block_size}) but the call returned "
            f"{len(g.output or ())} blocks instead of failing",
            g,
        )


# Invariant name (as in InvariantViolation.invariant) -> its check.
TRUNCATION_CHECKS: dict[str, Callable[[TruncationObservation], None]] = {
    "must-cover": check_must_cover_groups_cover_endpoint,
    "whole-state-clamped": check_whole_state_groups_clamped,
    "no-unexpected-failure": check_no_unexpected_failure,
    "prefix-view": check_output_is_prefix_of_input,
    "input-unchanged": check_input_lists_unchanged,
    "refcounts-unchanged": check_refcounts_and_hashes_unchanged,
    "pool-unchanged": check_pool_free_count_unchanged,
    "scratch-empty": check_scratch_groups_stay_empty,
    "misaligned-rejected": check_misaligned_endpoint_rejected,
}


def check_all_truncation_invariants(
    obs: TruncationObservation, only: str | None = None
) -> None:
    """Run every truncation check (or just the one named ``only``)."""
    checks = TRUNCATION_CHECKS.values() if only is None else [TRUNCATION_CHECKS[only]]
    for check in checks:
        check(obs)
