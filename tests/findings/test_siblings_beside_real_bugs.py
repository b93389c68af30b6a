"""A known bug sets aside only itself, for every open registry entry that
names a sibling (``KnownBug.sibling``, fuzz/known_bugs.py): with the sibling
planted,

(a) the real bug's run (its pin's scenario, tests/known_bugs/runs.py) is
    still set aside as that entry: triage names it, and nothing of the real
    bug is left to report;
(b) the sibling's own run (its fixed run, fuzz.adapter.FIXED_RUNS, or a
    pin's builder) breaks the same claim, and triage reports it as new.

Every run is fixed (no search). Where one run shows both, the case plays it
once. Where the plant changes the real bug's path (the real bug no longer
happens with it), (a) is shown unplanted and the case says so. An open entry
with a sibling and no case here fails, so a new entry cannot be forgotten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from fuzz import adapter
from fuzz.adapter import FIXED_RUNS, SchedulerHarness, planted_scheduler_bug
from fuzz.known_bugs import KNOWN_BUGS, SUPPRESS_ENV, KnownBug, failures_of, match_violation, sort_out
from fuzz.model import AdmissionObservation, InvariantViolation, SpecDraw, StepObservation
from fuzz.runners.scheduler import run_fixed, run_single_shot, triage
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants import ownership as own
from invariants.connector import RESUMED_PAST_FAILED_TOKEN, check_failed_load_not_cached, check_failed_load_recomputed
from invariants.contents import UNBACKED_ENTRY, check_index_written, check_reads_written
from invariants.fate import UNBLOCKED_NOT_ADMITTED, check_unblocked_request_admitted
from invariants.hits import HIT_SHORTER, check_hit_matches_index
from invariants.promises import EVENTS_ORPHANED, check_events_chain
from invariants.scheduler import check_no_exception_escapes, check_running_requests_progress
from invariants.stranded import STRANDED
from tests.invariants.planted_runs import failed_load_run
from tests.known_bugs.runs import (
    EVENTS_HYBRID,
    FULL_PROMPT_ASYNC_LOAD,
    SYNC_LOAD_THEN_SAME_STEP_PARTIAL_HIT,
    checkpointed_prompts,
    eagle_resend,
    eagle_window_second_lookup,
    failed_async_load,
    failed_sync_load,
    failing_sync_load,
    lookup_after_a_shrink,
    one_prompt_with_events,
    padded_second_admission,
    pool_nearly_full_scenario,
    readmitted_after_a_failed_load,
    reset_running,
    rolled_back_below_an_image,
    rolled_back_over_a_step_in_flight,
    serve_failed_sync_load,
    shared_partial_hit_step,
    third_admission_past_hybrid_hit,
    three_decoding_requests,
)

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

VERSION = adapter.VLLM_VERSION
OPEN_WITH_SIBLING = [b for b in KNOWN_BUGS if b.sibling and b.fixed_in is None]


@pytest.fixture(autouse=True)
def _known_bugs_set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triage as a campaign runs it: known bugs set aside, not reported."""
    monkeypatch.delenv(SUPPRESS_ENV, raising=False)


class _Triaged:
    """A check that triages each step it is handed with ``checks`` (every
    check when none is named), as the stepper does, and keeps what it found
    instead of raising."""

    def __init__(self, *checks: Callable[..., None]) -> None:
        self.checks = checks or None
        self.unknown: list[InvariantViolation] = []
        self.known: list[str] = []

    def __call__(self, step: StepObservation, context: str = "") -> _Triaged:
        unknown, known = triage(step, self.checks)
        self.unknown += unknown
        self.known += [b for b in known if b not in self.known]
        return self

    def each(self, steps: Iterable[StepObservation]) -> _Triaged:
        for step in steps:
            self(step)
        return self

    def watching(self, harness: SchedulerHarness) -> None:
        """Triage every step ``harness`` takes (run_single_shot's on_harness)."""
        step = harness.step

        def triaged(*args: object, **kwargs: object) -> StepObservation:
            observation = step(*args, **kwargs)  # type: ignore[arg-type]
            self(observation)
            return observation

        harness.step = triaged  # type: ignore[method-assign]


def _set_aside(found: _Triaged, bug: KnownBug, *, alone: bool = True) -> None:
    """(a): triage named ``bug`` and left none of its instances to report;
    ``alone``: nothing else was reported either (the plant did not fire)."""
    assert bug.id in found.known, (bug.id, found.known, found.unknown)
    assert not [v for v in found.unknown if any(bug.shows_in(f) for f in failures_of(v))], found.unknown
    if alone:
        assert found.unknown == [], found.unknown


def _new(unknown: Iterable[InvariantViolation], bug: KnownBug, claim: str) -> list[tuple[str, str | None, str]]:
    """(b): the violations of ``claim`` triage reported, each no instance of
    ``bug`` nor of any other known bug; their instances as (where, group
    kind, state)."""
    reported = [v for v in unknown if v.invariant == claim]
    assert reported, f"no {claim} reported as new: {list(unknown)}"
    for v in reported:
        assert not any(bug.shows_in(f) for f in failures_of(v)), str(v)
        assert sort_out(v, VERSION)[0] == [] and match_violation(v, VERSION) is None, str(v)
    return sorted({(f.where, f.group_kind, f.state) for v in reported for f in failures_of(v)}, key=repr)


def _raised_new(bug: KnownBug, claim: str, play: Callable[[], object]) -> list[tuple[str, str | None, str]]:
    """(b) on a stepper's run (run_fixed): it raises the first violation
    that is no known bug; that one is ``claim``'s."""
    with pytest.raises(InvariantViolation) as caught:
        play()
    return _new([caught.value], bug, claim)


def _admission_set_aside(adm: AdmissionObservation, bug: KnownBug) -> None:
    """(a) for a lookup (a pin's builder returns the admission, or a bare
    manager's): triaged as the step that admitted it, it is ``bug`` alone."""
    step = StepObservation(
        step=0, admissions=(adm,), error=None, error_type=None, error_where=None, dishonest_replies=(),
        num_scheduled={}, newly_scheduled=(), preempted=frozenset(), finished=frozenset(),
    )
    _set_aside(_Triaged(check_hit_matches_index)(step), bug)


CASES: dict[str, Callable[[KnownBug], None]] = {}


def _case(*bug_ids: str) -> Callable[[Callable[[KnownBug], None]], Callable[[KnownBug], None]]:
    def register(case: Callable[[KnownBug], None]) -> Callable[[KnownBug], None]:
        for bug_id in bug_ids:
            CASES[bug_id] = case
        return case

    return register


@_case("same-step-cow-chain")
def _cow_chain_beside_an_adopted_mamba_state(bug: KnownBug) -> None:
    """One run shows both: two requests copy the same partial hit in one
    step (the chain, full attention) while two more on another root adopt a
    Mamba state written in that step (same-step-hazard, Mamba)."""
    found = _Triaged()
    with planted_scheduler_bug(bug.sibling):
        found(shared_partial_hit_step(2, second_root=True))
    _set_aside(found, bug, alone=False)
    assert _new(found.unknown, bug, "same-step-hazard") == [
        (own.WHERE_NEW_BLOCK, "MambaSpec", own.HAZARD_STATE_ADOPTED)]


@_case("same-step-partial-hit-reads-unwritten-block")
def _partial_hit_copy_beside_an_adopted_mamba_state(bug: KnownBug) -> None:
    found = _Triaged()
    with planted_scheduler_bug(bug.sibling):
        run_single_shot(SYNC_LOAD_THEN_SAME_STEP_PARTIAL_HIT, (), record=False, on_harness=found.watching)
        sibling = _raised_new(bug, "same-step-hazard", lambda: run_fixed(FIXED_RUNS[bug.sibling],
                                                                          (own.check_no_same_step_hazard,)))
    _set_aside(found, bug)
    assert sibling == [(own.WHERE_NEW_BLOCK, "MambaSpec", own.HAZARD_STATE_ADOPTED)]


@_case("mamba-external-block-undercount")
def _mamba_undercount_beside_an_unreserved_copy(bug: KnownBug) -> None:
    """The sibling's run: one request on the cow chain's layout taking a
    partial hit, whose copy-on-write block admission no longer counts (the
    full-attention group, not the Mamba group's external state)."""
    found = _Triaged(check_no_exception_escapes, own.check_reservation_covers_allocation)
    sibling = _Triaged(own.check_reservation_covers_allocation)
    with planted_scheduler_bug(bug.sibling):
        found(pool_nearly_full_scenario()[1])
        sibling(shared_partial_hit_step(1))
    _set_aside(found, bug)
    assert sibling.known == []
    assert [(w, g) for w, g, _ in _new(sibling.unknown, bug, "reservation-covers-allocation")] == [
        ("KVCacheManager.allocate_slots", "FullAttentionSpec")]


@_case("mamba-failed-load-rollback")
def _mamba_rollback_beside_a_resume_past_the_failed_block(bug: KnownBug) -> None:
    """(a) unplanted: the plant resumes one block past the failed one, so
    the rollback into the load (the real bug) no longer happens; the same run
    planted is the sibling, on the same Mamba group and call."""
    _set_aside(_Triaged(check_failed_load_recomputed).each(failed_sync_load("MambaSpec")), bug)
    with planted_scheduler_bug(bug.sibling):
        sibling = _Triaged(check_failed_load_recomputed).each(failed_sync_load("MambaSpec"))
    assert sibling.known == []
    assert _new(sibling.unknown, bug, "failed-load-recomputed") == [
        ("Scheduler.update_from_output", "MambaSpec", RESUMED_PAST_FAILED_TOKEN)]


@_case("full-prompt-async-load-replays-outside-window")
def _whole_prompt_recompute_beside_a_freed_block(bug: KnownBug) -> None:
    """One run shows both: when the load lands the plant frees the
    full-attention group's first block, while the Mamba group's recompute
    reads the dropped state (the real bug)."""
    found = _Triaged(own.check_read_blocks_held)
    with planted_scheduler_bug(bug.sibling):
        run_single_shot(FULL_PROMPT_ASYNC_LOAD, (), record=False, on_harness=found.watching)
    _set_aside(found, bug, alone=False)
    assert (own.WHERE_ASYNC_LANDED, "FullAttentionSpec", own.READ_NOT_HELD) in _new(
        found.unknown, bug, "read-blocks-held")


@_case("abort-during-failed-sync-load-keeps-invalid-blocks-cached")
def _aborted_failed_load_beside_evictions_under_the_wrong_policy(bug: KnownBug) -> None:
    """The sibling's run: a failed sync load under the "fail" policy, not
    aborted; the plant evicts under "recompute" only, so its blocks stay."""
    found = _Triaged(check_failed_load_not_cached)
    with planted_scheduler_bug(bug.sibling):
        found(failing_sync_load(aborted=True)[1])
        sibling = _Triaged(check_failed_load_not_cached).each(failed_load_run(False, "fail")[1])
    _set_aside(found, bug)
    assert sibling.known == []
    assert [w for w, _, _ in _new(sibling.unknown, bug, "failed-load-not-cached")] == ["Scheduler.update_from_output"]


@_case("failed-sync-load-recompute-keeps-output-placeholder", "encoder-output-held-past-failed-load-rollback")
def _stranded_by_a_failed_load_beside_an_unguarded_skip(bug: KnownBug) -> None:
    """The sibling's fixed run: two requests decoding 3 tokens, stranded one
    token short of max_tokens with nothing in flight (no failed load)."""
    with planted_scheduler_bug(bug.sibling):
        if bug.id == "encoder-output-held-past-failed-load-rollback":
            stepper = rolled_back_below_an_image((("image-a", 1, 3), ("image-b", 4, 3)),
                                                 (check_running_requests_progress,))
            assert stepper.known == {bug.id}, stepper.known
        else:
            found = _Triaged(check_running_requests_progress)
            # The pin's builder gives up after 12 steps: the request is stranded.
            with pytest.raises(AssertionError, match="neither finished nor stranded"):
                serve_failed_sync_load(async_scheduling=True, max_tokens=1, check=found)
            _set_aside(found, bug)
        sibling = _raised_new(bug, "running-request-progresses",
                              lambda: run_fixed(FIXED_RUNS[bug.sibling], (check_running_requests_progress,)))
    assert sibling == [("Scheduler.schedule", None, STRANDED)]


@_case("spec-decode-padding-cut-by-long-prefill-threshold")
def _padding_cut_beside_a_new_assert_in_schedule(bug: KnownBug) -> None:
    found = _Triaged(check_no_exception_escapes)
    with planted_scheduler_bug(bug.sibling):
        found(padded_second_admission("ngram", threshold=2))
        steps = three_decoding_requests()
    _set_aside(found, bug)
    sibling = _Triaged(check_no_exception_escapes).each(s for s in steps if s.error)
    assert sibling.known == [] and _new(sibling.unknown, bug, "no-exception")
    assert {v.statement for v in sibling.unknown} == {"assert len(spec_token_ids) == len(request.spec_token_ids)"}


@_case("second-attention-group-lags-divergent-connector-hit")
def _lagging_group_beside_the_pre_fix_truncate(bug: KnownBug) -> None:
    """(a) unplanted: the plant replaces truncate_computed_blocks by the
    pre-fix variant, which asserts in its place (vLLM's statement, the real
    bug's, never runs). The same run planted is the sibling: no-exception
    inside schedule(), raised by another function."""
    found = _Triaged(check_no_exception_escapes)
    found(readmitted_after_a_failed_load(divergent_hits=True))
    _set_aside(found, bug)
    sibling = _Triaged(check_no_exception_escapes)
    with planted_scheduler_bug(bug.sibling):
        sibling(readmitted_after_a_failed_load(divergent_hits=True))
    assert sibling.known == [] and _new(sibling.unknown, bug, "no-exception")
    (raised,) = sibling.unknown
    assert raised.exception == "AssertionError" and not raised.frames[0].endswith(
        ":KVCacheManager.truncate_computed_blocks"), raised.frames


@_case("partial-event-names-unannounced-parent")
def _partial_entry_event_beside_full_blocks_naming_themselves(bug: KnownBug) -> None:
    """One run shows both: the partial entry's event (the real bug) and,
    planted, a full-block event naming its own first block as parent."""
    found = _Triaged(check_events_chain)
    with planted_scheduler_bug(bug.sibling):
        one_prompt_with_events(EVENTS_HYBRID, 30, check=found)
    _set_aside(found, bug, alone=False)
    assert _new(found.unknown, bug, "events-chain") == [("BlockPool.cache_full_blocks", None, EVENTS_ORPHANED)]


@_case("mamba-rollback-over-in-flight-step")
def _rollback_over_a_step_in_flight_beside_a_freed_failed_block(bug: KnownBug) -> None:
    with planted_scheduler_bug(bug.sibling):
        found = _Triaged(own.check_read_blocks_held).each(rolled_back_over_a_step_in_flight("MambaSpec"))
        sibling = _Triaged(own.check_read_blocks_held).each(rolled_back_over_a_step_in_flight("FullAttentionSpec"))
    _set_aside(found, bug)
    assert sibling.known == []
    assert (own.WHERE_ROLLED_BACK, "FullAttentionSpec", own.READ_NOT_HELD) in _new(
        sibling.unknown, bug, "read-blocks-held")


@_case("reset-running-fails-on-deferred-frees")
def _deferred_frees_beside_a_reset_preempting_loads(bug: KnownBug) -> None:
    with planted_scheduler_bug(bug.sibling):
        found = _Triaged(check_no_exception_escapes)
        found(reset_running(async_scheduling=True, async_load=False))
        sibling = _Triaged(check_no_exception_escapes)
        sibling(reset_running(async_scheduling=False, async_load=True))
    _set_aside(found, bug)
    assert sibling.known == [] and _new(sibling.unknown, bug, "no-exception")
    (raised,) = sibling.unknown
    assert (raised.where, raised.frames[0].rsplit(":", 1)[-1]) == (
        "Scheduler.reset_prefix_cache", "Scheduler._preempt_request"), raised.frames


# The real bugs' lookups (their pins' builders) for the sibling that makes a
# sliding window ask for a block more; True: the lookup takes the same path
# planted. Planted, the verification bug's window group (its entry at 12
# evicted) finds no run long enough and the lookup hits 0, as the index
# allows: the real bug is not met, so (a) is shown unplanted.
_LOOKUPS: dict[str, tuple[Callable[[], AdmissionObservation], bool]] = {
    "full-block-past-hybrid-hit-unused": (lambda: third_admission_past_hybrid_hit(12), True),
    "eagle-resend-drops-proven-block": (lambda: eagle_resend(SpecDraw("FullAttentionSpec", 4)), True),
    "eagle-window-aligns-before-drop": (lambda: eagle_window_second_lookup(64), True),
    "eagle-verification-survives-shrink": (lambda: lookup_after_a_shrink(()), False),
}


@_case(*_LOOKUPS)
def _missed_or_unproven_hit_beside_a_window_asking_a_block_more(bug: KnownBug) -> None:
    """The sibling's fixed run: a 13-token prompt sent twice beside a 5-token
    window; the window group asks for a block more than it keeps cached, and
    the resend hits less than the index holds (a plain missed hit)."""
    lookup, same_path_planted = _LOOKUPS[bug.id]
    if not same_path_planted:
        _admission_set_aside(lookup(), bug)
    with planted_scheduler_bug(bug.sibling):
        if same_path_planted:
            _admission_set_aside(lookup(), bug)
        sibling = _raised_new(bug, "hit-matches-index",
                              lambda: run_fixed(FIXED_RUNS[bug.sibling], (check_hit_matches_index,)))
    assert sibling == [("KVCacheManager.get_computed_blocks", None, HIT_SHORTER)]


@_case("mamba-checkpoint-chunk-skips-boundary-state")
def _checkpoint_chunk_beside_a_tail_state_left_under_its_key(bug: KnownBug) -> None:
    """One run shows both: the checkpointed chunk's block cached as the
    state at its end (the real bug) and, planted, a partial-tail entry left
    on the block the next chunk overwrites."""
    found = _Triaged(check_index_written, check_reads_written)
    with planted_scheduler_bug(bug.sibling):
        checkpointed_prompts(checkpoints=True, checks=(found,))
    _set_aside(found, bug, alone=False)
    assert _new(found.unknown, bug, "index-written") == [("Scheduler.schedule", "MambaSpec", UNBACKED_ENTRY)]


@_case("failed-async-load-keeps-own-reservation")
def _stale_reservation_beside_deferred_requests_taking_slots(bug: KnownBug) -> None:
    """(a) unplanted: with one sequence slot the plant stops the waiting
    loop before it reaches the request, so its failed load is never taken
    back and the stale reservation never refuses it (no violation at all)."""
    assert failed_async_load(13, (check_unblocked_request_admitted,)).known == {bug.id}
    with planted_scheduler_bug(bug.sibling):
        sibling = _raised_new(bug, "unblocked-request-admitted",
                              lambda: run_fixed(FIXED_RUNS[bug.sibling], (check_unblocked_request_admitted,)))
    assert sibling == [("Scheduler.schedule", None, UNBLOCKED_NOT_ADMITTED)]


@pytest.mark.parametrize("bug", OPEN_WITH_SIBLING, ids=lambda b: b.id)
def test_the_sibling_is_new_and_the_real_bug_still_set_aside(bug: KnownBug) -> None:
    assert bug.id in CASES, f"{bug.id} names the sibling {bug.sibling} but has no case here"
    CASES[bug.id](bug)


def test_every_case_is_an_open_entry_with_a_sibling() -> None:
    assert OPEN_WITH_SIBLING, "no open registry entry names a sibling"
    assert set(CASES) <= {b.id for b in OPEN_WITH_SIBLING}, set(CASES) - {b.id for b in OPEN_WITH_SIBLING}
