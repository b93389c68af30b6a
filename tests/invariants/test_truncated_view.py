"""The truncated-view claim on the admission a CI benchmark met (pinned from
the scheduler-machine campaign on unmodified vLLM 0.33.0, where the claim
then took every copy-on-write destination of the step as the request's own)."""

from __future__ import annotations

import dataclasses

import pytest

from fuzz.model import AdmissionObservation, Behaviour, GroupInfo, InvariantViolation
from invariants.scheduler import check_truncated_view

_KV = "vllm.v1.kv_cache_interface."


def _group(index: int, kind: str, block_size: int) -> GroupInfo:
    return GroupInfo(index=index, spec_class=_KV + kind, inner_classes=(), block_size=block_size,
                     prefix_cacheable=True)


# r5 (30 tokens) on FullAttention(4) + Mamba(4) + FullAttention(12), hash
# block 1: a local hit of 28 (tail 4 in the 12-token scheduler block) and 5
# external tokens from 24, so the local part is cut to 24. Block 16 of the
# third group covers tokens [12, 24): a request admitted earlier in the same
# step had a sub-block hit ending inside it, so vLLM copied that tail into the
# fresh block 16, keyed it at allocation (that request's forward fills the
# rest) and r5's lookup found it full. r5 adopts it as a cached block; its
# own blocks past the view (18, 19, 20, 21) are no copy's destination.
SAME_STEP_COPY = AdmissionObservation(
    request_id="r5",
    step=7,
    num_tokens=30,
    groups=(_group(0, "FullAttentionSpec", 4), _group(1, "MambaSpec", 4), _group(2, "FullAttentionSpec", 12)),
    spans=(None, None, None),
    behaviours=(Behaviour.MUST_COVER, Behaviour.MAY_BE_SHORT, Behaviour.MUST_COVER),
    span_rules=(None, None, None),
    scheduler_block_size=12,
    hash_block_size=1,
    null_block_id=0,
    divergent_capable=False,
    local_hit=28,
    local_blocks=((1, 5, 6, 11, 10, 14, 13), (0, 0, 0, 0, 0, 0, 15), (8, 16, 17)),
    hit_diverged=False,
    per_group_hits=(28, 28, 28),
    joint_hit=28,
    joint_blocks=((1, 5, 6, 11, 10, 14, 13), (0, 0, 0, 0, 0, 0, 15), (8, 16, 17)),
    asked_with=24,
    reply=5,
    alloc_local_tokens=24,
    alloc_local_blocks=((1, 5, 6, 11, 10, 14), (0, 0, 0, 0, 0, 0), (8, 16)),
    alloc_external_tokens=5,
    alloc_ok=True,
    admitted=True,
    num_computed_tokens=29,
    connector_external_tokens=5,
    block_table=((1, 5, 6, 11, 10, 14, 18, 19), (0, 0, 0, 0, 0, 0, 0, 20), (8, 16, 21)),
    cow_dst_ids=frozenset({16}),
)


def test_a_cached_block_another_request_copied_into_is_no_adopted_tail() -> None:
    check_truncated_view(SAME_STEP_COPY)


@pytest.mark.parametrize("own_copy", [21, 19])
def test_a_copy_into_the_requests_own_block_past_the_view_is_an_adopted_tail(own_copy: int) -> None:
    adm = dataclasses.replace(SAME_STEP_COPY, cow_dst_ids=frozenset({16, own_copy}))
    with pytest.raises(InvariantViolation, match=rf"blocks \[{own_copy}\] are copy-on-write destinations") as caught:
        check_truncated_view(adm)
    assert caught.value.invariant == "truncated-view"


def test_adopting_the_tail_itself_is_a_wrong_view() -> None:
    """vLLM keeping the lookup's tail block 17 (the sub-block tail) instead of
    cutting the third group's view at 24."""
    adm = dataclasses.replace(SAME_STEP_COPY, alloc_local_blocks=((1, 5, 6, 11, 10, 14), (0, 0, 0, 0, 0, 0), (8, 16, 17)))
    with pytest.raises(InvariantViolation, match="not the view truncated at 24") as caught:
        check_truncated_view(adm)
    assert caught.value.invariant == "truncated-view"
