"""Every request's fate: where each request the harness added is after a
step, and whether a waiting request whose blockers are gone is admitted.

The truth is the harness's record (:mod:`fuzz.adapter._fate`): the finish
reports in the outputs it was fed back, the aborts it issued, and what it
saw in flight and free; vLLM's running list and waiting queues are read
only as the places vLLM put each request. Each check reports every
instance it finds (a known bug sets aside only its own request).
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.model import Fact, Instance, InvariantViolation, StepObservation, WaitingRequest

__all__ = [
    "FATE_CHECKS", "IN_TWO_PLACES", "LOST", "REPORTED_TWICE", "STALL_BOUND", "UNBLOCKED_AFTER_FAILED_ASYNC_LOAD",
    "UNBLOCKED_NOT_ADMITTED",
    "check_request_in_one_place", "check_unblocked_request_admitted",
]

# A waiting request whose blockers are all gone is admitted by the first
# schedule() that sees it so (nothing is running to take the budget, the
# pool or a sequence slot from it); two in a row that do not admit it are
# a stall. Two is below the quiet steps after which a drain gives up
# (fuzz.adapter._observations.QUIET_STEPS = 3), so the claim speaks first.
STALL_BOUND = 2

# The failing conditions (matched by known-bug signatures).
LOST = "in no place"
IN_TWO_PLACES = "in two places"
REPORTED_TWICE = "reported finished twice"
UNBLOCKED_NOT_ADMITTED = "waiting with every blocker gone"
UNBLOCKED_AFTER_FAILED_ASYNC_LOAD = "waiting with every blocker gone, unscheduled since its own async load failed"


def _context(step: StepObservation) -> str:
    return f"\n{step.describe()}" + (f"\n  scenario: {step.context}" if step.context else "")


def _place_violations(step: StepObservation) -> list[InvariantViolation]:
    found = []
    for row in step.places:
        if len(row.places) == 1 and row.finish_reports <= 1:
            continue
        state = LOST if not row.places else REPORTED_TWICE if row.finish_reports > 1 else IN_TWO_PLACES
        found.append(InvariantViolation(
            "request-in-one-place",
            f"{row.describe()}: every request the harness added must be, after each step, in exactly one "
            f"of running, one waiting queue, finished (reported once) or aborted by the harness{_context(step)}",
            # Which of the step's calls moved it is not observed; schedule() moves
            # requests between queues, update_from_output() reports finishes.
            where="Scheduler.update_from_output" if state == REPORTED_TWICE else "Scheduler.schedule",
            state=state,
            instances=(Instance(state, requests=(row.request_id,)),),
            # The places vLLM keeps it in: exactly one (no fact for a double report).
            facts=() if state == REPORTED_TWICE else (Fact("places", (row.request_id,), row.places, 1, "len"),),
        ))
    return found


def check_request_in_one_place(step: StepObservation) -> None:
    """A safety claim, after every step that raised nothing: every request
    the harness added is in exactly one place: vLLM's ``running`` list, one
    of its waiting queues, finished (an output the harness was fed back
    named it with a finish reason, and no other did) or aborted by the
    harness. In none, it is lost (its client never hears of it again); in
    two, vLLM may schedule or free it twice."""
    for violation in _place_violations(step):
        raise violation


check_request_in_one_place.violations = _place_violations  # type: ignore[attr-defined]


def _stall_state(row: WaitingRequest) -> str:
    return UNBLOCKED_AFTER_FAILED_ASYNC_LOAD if row.after_failed_async_load else UNBLOCKED_NOT_ADMITTED


def _stall_violations(step: StepObservation) -> list[InvariantViolation]:
    return [
        InvariantViolation(
            "unblocked-request-admitted",
            f"{row.describe()}: vLLM's waiting loop admits (or starts the load of) a waiting request "
            f"once nothing blocks it; {STALL_BOUND} schedule() calls in a row did not{_context(step)}",
            where="Scheduler._update_waiting_for_remote_kv" if row.after_failed_async_load else "Scheduler.schedule",
            state=_stall_state(row),
            instances=(Instance(_stall_state(row), requests=(row.request_id,)),),
            # Admitted (or its load started) by the first schedule() that saw
            # it unblocked: the first of the ``steps`` in a row.
            facts=(Fact("status", (row.request_id,), row.status, ("RUNNING", "WAITING_FOR_REMOTE_KVS"), "in",
                        step=step.step - row.steps + 1, after="schedule"),),
        )
        for row in step.waiting_unblocked
        if row.steps >= STALL_BOUND
    ]


def check_unblocked_request_admitted(step: StepObservation) -> None:
    """A liveness claim outside RUNNING: a WAITING, PREEMPTED or
    WAITING_FOR_REMOTE_KVS request (its load reported) whose blockers are
    all gone before a ``schedule()`` (nothing running, nothing in flight,
    room in the budget, the free pool holding every waiting request's
    upper-bound need, its connector answer decided) is admitted, or its
    load started, within :data:`STALL_BOUND` such steps."""
    for violation in _stall_violations(step):
        raise violation


check_unblocked_request_admitted.violations = _stall_violations  # type: ignore[attr-defined]

FATE_CHECKS: tuple[Callable[[StepObservation], None], ...] = (
    check_request_in_one_place,
    check_unblocked_request_admitted,
)
