"""A known bug sets aside only its own instances: a bug planted beside it,
breaking the same claim at the same vLLM call in another group or state,
is reported as new while the real bug is still set aside.

Matching is per instance (:func:`fuzz.known_bugs.sort_out`): a violation
whose instances are all one known bug's is set aside; one with other
instances is reported, cut to them.
"""

from __future__ import annotations

import pytest

from fuzz import adapter
from fuzz.adapter import SIBLING_PLANTS, planted_scheduler_bug
from fuzz.known_bugs import known_bug, match_violation, sort_out
from fuzz.model import Instance, InvariantViolation, StepObservation, StrandedRequest
from fuzz.runners.scheduler import run_single_shot, triage
from invariants import ownership as own
from invariants.scheduler import (
    check_kv_matches_tokens,
    check_running_requests_progress,
)
from invariants.stranded import (
    STRANDED,
    STRANDED_BEHIND_ENCODER_AFTER_FAILED_LOAD,
    STRANDED_BEHIND_PLACEHOLDERS_AFTER_FAILED_LOAD,
    STRANDED_ENCODER_AFTER_FAILED_LOAD,
    STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD,
)
from tests.known_bugs.runs import FULL_PROMPT_ASYNC_LOAD, reset_running, rolled_back_over_a_step_in_flight

VERSION = adapter.VLLM_VERSION
WHOLE_LOAD = "full-prompt-async-load-replays-outside-window"
LANDED = "Scheduler._update_waiting_for_remote_kv"


def _held(instances: tuple[Instance, ...]) -> InvariantViolation:
    return InvariantViolation("read-blocks-held", "reads", where=LANDED, instances=instances)


def test_a_violation_is_set_aside_only_when_every_instance_is_known() -> None:
    real = Instance(own.READ_DROPPED_AFTER_WHOLE_LOAD, "MambaSpec", 0, ("r1",), ())
    freed = Instance(own.READ_NOT_HELD, "FullAttentionSpec", 1, ("r1",), (7,))
    assert sort_out(_held((real,)), VERSION) == ([WHOLE_LOAD], None)
    assert match_violation(_held((real,)), VERSION) is known_bug(WHOLE_LOAD)
    known, rest = sort_out(_held((real, freed)), VERSION)
    assert known == [WHOLE_LOAD] and rest is not None and rest.instances == (freed,), rest
    assert (rest.invariant, rest.where, rest.state, rest.group_kind) == (
        "read-blocks-held", LANDED, own.READ_NOT_HELD, "FullAttentionSpec")
    assert match_violation(_held((real, freed)), VERSION) is None
    # The same state in a group that holds every block before the point: new.
    other_group = Instance(own.READ_DROPPED_AFTER_WHOLE_LOAD, "FullAttentionSpec", 1, ("r1",), ())
    assert sort_out(_held((other_group,)), VERSION)[0] == []


def test_a_violation_is_matched_once() -> None:
    """What sort_out leaves (the runner's triage) is no known bug's, and the
    findings writer's match_violation does not match it again; a violation
    nothing sorted out (the truncation tier, a run reporting known bugs) is
    matched there."""
    real = Instance(own.READ_DROPPED_AFTER_WHOLE_LOAD, "MambaSpec", 0, ("r1",), ())
    freed = Instance(own.READ_NOT_HELD, "FullAttentionSpec", 1, ("r1",), (7,))
    untriaged = _held((real,))
    assert not untriaged.sorted_out and match_violation(untriaged, VERSION) is known_bug(WHOLE_LOAD)
    _, rest = sort_out(_held((real, freed)), VERSION)
    assert rest is not None and rest.sorted_out and match_violation(rest, VERSION) is None
    _, unknown = sort_out(_held((freed,)), VERSION)
    assert unknown is not None and unknown.sorted_out


def _step(**fields: object) -> StepObservation:
    return StepObservation(
        step=9, admissions=(), error=None, error_type=None, error_where=None, dishonest_replies=(),
        num_scheduled={}, newly_scheduled=(), preempted=frozenset(), finished=frozenset(), **fields,
    )


def _stranded(rid: str, *, placeholders: int = 0, failed_load: bool = False, encoder: bool = False,
              needs_encoder: bool = False) -> StrandedRequest:
    return StrandedRequest(rid, 8, 9, 8, 1, placeholders, 5, recomputed_failed_load=failed_load,
                           holds_later_encoder_output=encoder, needs_encoder_output=needs_encoder or encoder)


def test_each_stranded_request_is_its_own_instance() -> None:
    """One request stranded with the known bug's placeholders no longer
    relabels the step: a request behind it is named so; one stranded with
    an encoder output of its own in a step without placeholders is its own
    known bug, beside a plain stall, which is reported."""
    step = _step(stranded=(_stranded("r1", placeholders=1, failed_load=True), _stranded("r2")))
    (v,) = check_running_requests_progress.violations(step)
    assert [i.state for i in v.instances] == [
        STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD, STRANDED_BEHIND_PLACEHOLDERS_AFTER_FAILED_LOAD]
    assert [i.requests for i in v.instances] == [("r1",), ("r2",)]
    assert triage(step, (check_running_requests_progress,)) == (
        [], ["failed-sync-load-recompute-keeps-output-placeholder"])
    step = _step(stranded=(_stranded("r1", failed_load=True, encoder=True), _stranded("r2")))
    unknown, known = triage(step, (check_running_requests_progress,))
    assert known == ["encoder-output-held-past-failed-load-rollback"], known
    assert [[i.state for i in u.instances] for u in unknown] == [[STRANDED]], unknown


def test_a_request_waiting_for_the_encoder_room_a_stuck_rollback_holds_is_that_bug_and_no_other() -> None:
    """The encoder cache held whole by a request the failed-load rollback
    stranded (the model-cost bench's machine hunt on unmodified vLLM 0.33.0:
    a cache of 9 embeddings, the stuck request's later image in it, another
    request's next image of 9 never given room): a request whose next image
    has no output yet waits behind it and is set aside with it. A request
    stranded for another reason in the same step, and one waiting for the
    encoder in a step with no such holder, are still reported."""
    step = _step(stranded=(_stranded("r2", failed_load=True, encoder=True), _stranded("r6", needs_encoder=True)))
    (v,) = check_running_requests_progress.violations(step)
    assert [i.state for i in v.instances] == [STRANDED_ENCODER_AFTER_FAILED_LOAD, STRANDED_BEHIND_ENCODER_AFTER_FAILED_LOAD]
    assert triage(step, (check_running_requests_progress,)) == ([], ["encoder-output-held-past-failed-load-rollback"])
    step = _step(stranded=(_stranded("r2", failed_load=True, encoder=True), _stranded("r6")))
    unknown, known = triage(step, (check_running_requests_progress,))
    assert known == ["encoder-output-held-past-failed-load-rollback"] and [
        [i.state for i in u.instances] for u in unknown] == [[STRANDED]], (known, unknown)
    unknown, known = triage(_step(stranded=(_stranded("r6", needs_encoder=True),)), (check_running_requests_progress,))
    assert known == [] and [[i.state for i in u.instances] for u in unknown] == [[STRANDED]], unknown


def test_kv_from_other_tokens_is_judged_per_request() -> None:
    from fuzz.model import KvFromOtherToken

    after_failed_load = KvFromOtherToken("r1", 8, 5, 6, 3, recomputed_failed_load=True)
    plain = KvFromOtherToken("r2", 4, 5, 6, 3)
    step = _step(kv_from_other_tokens=(after_failed_load, plain))
    unknown, known = triage(step, (check_kv_matches_tokens,))
    assert known == ["failed-sync-load-recompute-keeps-output-placeholder"], known
    assert [[i.requests for i in u.instances] for u in unknown] == [[("r2",)]], unknown


def test_every_sibling_only_plant_is_an_open_known_bugs_sibling() -> None:
    from fuzz.known_bugs import KNOWN_BUGS

    open_siblings = {b.sibling for b in KNOWN_BUGS if b.sibling and b.affects(VERSION)}
    assert set(SIBLING_PLANTS) <= open_siblings, set(SIBLING_PLANTS) - open_siblings


def test_a_freed_block_beside_the_whole_prompt_recompute_is_reported_as_new() -> None:
    """landed_load_frees_first_block frees the full-attention group's first
    block when the async load lands: read-blocks-held at the same call as
    the real bug, in a full-attention group, in another state. The Mamba
    group's read of the dropped state is still the known bug."""
    with planted_scheduler_bug("landed_load_frees_first_block"), pytest.raises(InvariantViolation) as caught:
        run_single_shot(FULL_PROMPT_ASYNC_LOAD, record=False)
    v = caught.value
    assert v.invariant == "read-blocks-held" and v.where == LANDED, str(v)
    assert [(i.group_kind, i.state) for i in v.instances] == [("FullAttentionSpec", own.READ_NOT_HELD)], str(v)
    assert match_violation(v, VERSION) is None


def test_control_the_whole_prompt_recompute_alone_is_set_aside() -> None:
    labels = run_single_shot(FULL_PROMPT_ASYNC_LOAD, record=False)
    assert labels is not None and f"known vLLM bug: {WHOLE_LOAD}" in labels, labels


def test_a_mamba_state_adopted_while_written_is_new_beside_the_known_copy_chains() -> None:
    """mamba_adopts_same_step_state: same-step-hazard at the call the
    partial-hit bug blames (BlockPool.get_new_blocks), in a Mamba group and
    another state; the full-attention copy chain of the same step is still
    the known same-step-cow-chain."""
    from tests.known_bugs.runs import shared_partial_hit_step

    with planted_scheduler_bug("mamba_adopts_same_step_state"):
        step = shared_partial_hit_step(2, second_root=True)
    unknown, known = triage(step)
    assert known == ["same-step-cow-chain"], known
    hazards = [v for v in unknown if v.invariant == "same-step-hazard"]
    assert [(v.where, [(i.group_kind, i.state) for i in v.instances]) for v in hazards] == [
        (own.WHERE_NEW_BLOCK, [("MambaSpec", own.HAZARD_STATE_ADOPTED)])], hazards


def test_a_recompute_past_the_failed_block_is_new_beside_the_mamba_rollback() -> None:
    """resumes_past_invalid_block resumes one block past the first failed
    block: failed-load-recomputed at the same call and on the same Mamba
    group as mamba-failed-load-rollback, in another state (past the failed
    token, not inside the load); unplanted, the same run is the known bug."""
    from invariants.connector import (
        RESUMED_INSIDE_LOAD_WITHOUT_STATE,
        RESUMED_PAST_FAILED_TOKEN,
        check_failed_load_recomputed,
    )
    from tests.known_bugs.runs import failed_sync_load

    def caught() -> InvariantViolation:
        with pytest.raises(InvariantViolation) as exc:
            for step in failed_sync_load("MambaSpec"):
                check_failed_load_recomputed(step)
        return exc.value

    real = caught()
    assert [(i.group_kind, i.state) for i in real.instances] == [("MambaSpec", RESUMED_INSIDE_LOAD_WITHOUT_STATE)]
    assert match_violation(real, VERSION) is known_bug("mamba-failed-load-rollback")
    with planted_scheduler_bug("resumes_past_invalid_block"):
        sibling = caught()
    assert [(i.group_kind, i.state) for i in sibling.instances] == [("MambaSpec", RESUMED_PAST_FAILED_TOKEN)]
    assert sibling.where == real.where and match_violation(sibling, VERSION) is None


def test_copy_source_ready_sets_aside_only_the_full_attention_chain_across_requests() -> None:
    """The claim is no longer switched off: only a full-attention copy
    reading another request's same-step destination is same-step-cow-chain;
    a chain in a Mamba group, or within one request, is reported."""
    from invariants.contents import COPY_OF_OTHER_REQUESTS_COPY, COPY_OF_OWN_COPY

    def chain(state: str, kind: str, group: int) -> Instance:
        return Instance(state, kind, group, ("r2", "r1"), (1, 2, 5))

    real = chain(COPY_OF_OTHER_REQUESTS_COPY, "FullAttentionSpec", 0)
    for other in (chain(COPY_OF_OTHER_REQUESTS_COPY, "MambaSpec", 1), chain(COPY_OF_OWN_COPY, "FullAttentionSpec", 0)):
        v = InvariantViolation("copy-source-ready", "chains", where="Scheduler.schedule", instances=(real, other))
        known, rest = sort_out(v, VERSION)
        assert known == ["same-step-cow-chain"] and rest is not None and rest.instances == (other,), rest


def _triaged(steps: list[StepObservation], check: object) -> tuple[list[InvariantViolation], list[str]]:
    unknown: list[InvariantViolation] = []
    known: list[str] = []
    for step in steps:
        u, k = triage(step, (check,))  # type: ignore[arg-type]
        unknown += u
        known += [b for b in k if b not in known]
    return unknown, known


def test_a_failed_block_freed_by_the_rollback_is_new_beside_the_rollback_over_a_step_in_flight() -> None:
    """rollback_frees_failed_block frees the first failed block when
    _update_requests_with_invalid_blocks rolls the request back: the
    recompute's read-blocks-held at the same call, in a full-attention
    group (the real bug's kinds drop blocks or keep states). The Mamba
    group's rollback over the step in flight, planted or not, is still
    mamba-rollback-over-in-flight-step; one violation holding both is cut
    to the full-attention instance."""
    from invariants.ownership import WHERE_ROLLED_BACK, check_read_blocks_held

    assert _triaged(rolled_back_over_a_step_in_flight("FullAttentionSpec"), check_read_blocks_held) == ([], [])
    real_bug = "mamba-rollback-over-in-flight-step"
    assert _triaged(rolled_back_over_a_step_in_flight("MambaSpec"), check_read_blocks_held) == ([], [real_bug])
    with planted_scheduler_bug("rollback_frees_failed_block"):
        unknown, known = _triaged(rolled_back_over_a_step_in_flight("FullAttentionSpec"), check_read_blocks_held)
        assert known == [], known
        assert [(v.invariant, v.where, [(i.group_kind, i.state) for i in v.instances]) for v in unknown[:1]] == [
            ("read-blocks-held", WHERE_ROLLED_BACK, [("FullAttentionSpec", own.READ_NOT_HELD)])], unknown
        assert _triaged(rolled_back_over_a_step_in_flight("MambaSpec"), check_read_blocks_held) == ([], [real_bug])
    (sibling,) = unknown[0].instances
    real = Instance(own.ROLLED_BACK_IN_FLIGHT, "MambaSpec", 0, ("r1",), ())
    both = InvariantViolation("read-blocks-held", "both", where=WHERE_ROLLED_BACK, instances=(real, sibling))
    known, rest = sort_out(both, VERSION)
    assert known == [real_bug] and rest is not None and rest.instances == (sibling,), rest


def test_another_raise_in_the_running_reset_is_new_beside_the_deferred_frees() -> None:
    """no-exception has one state and no group: reset_preempts_loading_requests
    raises at the same call (Scheduler.reset_prefix_cache) from another
    statement (_preempt_request's assert on a request whose async load is in
    flight), and is reported; the deferred frees' RuntimeError, planted or
    not, is still reset-running-fails-on-deferred-frees."""
    from invariants.scheduler import check_no_exception_escapes

    real_bug = "reset-running-fails-on-deferred-frees"
    assert triage(reset_running(async_scheduling=True, async_load=False), (check_no_exception_escapes,)) == (
        [], [real_bug])
    with planted_scheduler_bug("reset_preempts_loading_requests"):
        assert triage(reset_running(async_scheduling=True, async_load=False), (check_no_exception_escapes,)) == (
            [], [real_bug])
        unknown, known = triage(reset_running(async_scheduling=False, async_load=True), (check_no_exception_escapes,))
    assert known == [], known
    assert [(v.invariant, v.where, v.exception, v.frames[0].rsplit(":", 1)[-1]) for v in unknown] == [
        ("no-exception", "Scheduler.reset_prefix_cache", "AssertionError", "Scheduler._preempt_request")], unknown
