"""Every request's fate (fuzz/adapter/_fate.py, invariants/fate.py): the
harness's record of finishes and aborts, on real schedulers, and the
claims' verdicts on hand-made rows."""

from __future__ import annotations

import dataclasses

import pytest

from fuzz.adapter import FIXED_RUNS, SchedulerHarness
from fuzz.model import (
    ExternalReply,
    LayoutDraw,
    RequestPlaces,
    SpecDraw,
    StepObservation,
    WaitingRequest,
)
from invariants.fate import (
    IN_TWO_PLACES,
    LOST,
    REPORTED_TWICE,
    STALL_BOUND,
    UNBLOCKED_NOT_ADMITTED,
    check_request_in_one_place,
    check_unblocked_request_admitted,
)
from tests.support.harnesses import harness_of

_RUN = FIXED_RUNS["lost_when_pool_full"]


def _harness() -> SchedulerHarness:
    return SchedulerHarness(_RUN.config)


def _clean(step: StepObservation) -> None:
    check_request_in_one_place(step)
    check_unblocked_request_admitted(step)


def test_a_finished_request_aborted_afterwards_keeps_its_one_fate() -> None:
    harness = _harness()
    rid = harness.add_request(range(10), max_tokens=1)
    for step in harness.drain():
        _clean(step)
    assert harness.fate.finish_reports[rid] == 1
    harness.abort(rid)  # vLLM ignores it; the record does too
    rid2 = harness.add_request(range(50, 60), max_tokens=1)
    for step in harness.drain():
        _clean(step)
    assert rid not in harness.fate.aborted and harness.fate.finish_reports[rid2] == 1


@pytest.mark.parametrize("during_step", [False, True], ids=["between-steps", "during-step"])
def test_an_aborted_request_is_in_one_place(during_step: bool) -> None:
    harness = _harness()
    rid = harness.add_request(range(10), max_tokens=8)
    _clean(harness.step())
    harness.abort(rid, during_step=during_step)
    for step in [harness.step(), *harness.drain()]:
        _clean(step)
    assert rid in harness.fate.aborted and not harness.fate.finish_reports[rid]


def test_every_waiting_request_is_judged_unblocked_only_while_idle() -> None:
    """Three requests on 9 blocks: none is judged while two run; the last
    step leaves nothing waiting."""
    harness = _harness()
    for prompt in _RUN.prompts:
        harness.add_request(prompt.tokens, max_tokens=prompt.max_tokens)
    steps = harness.drain()
    assert steps and not harness.scheduler.requests
    assert not [w for s in steps for w in s.waiting_unblocked]


def _step(**rows: object) -> StepObservation:
    return dataclasses.replace(_harness().step(), **rows)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("places", "reports", "state"),
    [((), 0, LOST), (("running", "waiting"), 0, IN_TWO_PLACES), (("waiting", "finished"), 1, IN_TWO_PLACES),
     (("finished",), 2, REPORTED_TWICE)],
)
def test_a_request_not_in_exactly_one_place_is_reported(places: tuple[str, ...], reports: int, state: str) -> None:
    step = _step(places=(RequestPlaces("r0", places, reports, "WAITING"), RequestPlaces("r1", ("running",), 0, "RUNNING")))
    found = check_request_in_one_place.violations(step)  # type: ignore[attr-defined]
    assert [(v.invariant, v.state) for v in found] == [("request-in-one-place", state)]


def test_a_stall_is_reported_at_the_bound() -> None:
    row = WaitingRequest("r0", "WAITING", STALL_BOUND - 1, 16, 6, "waiting")
    check_unblocked_request_admitted(_step(waiting_unblocked=(row,)))
    found = check_unblocked_request_admitted.violations(  # type: ignore[attr-defined]
        _step(waiting_unblocked=(dataclasses.replace(row, steps=STALL_BOUND),)))
    assert [(v.invariant, v.state) for v in found] == [("unblocked-request-admitted", UNBLOCKED_NOT_ADMITTED)]


def test_an_async_load_refused_for_its_speculative_step_reservation_is_no_stall() -> None:
    """Pinned from a 240 s campaign on unmodified vLLM (the bound then
    capped drafts and lookahead at max_model_len): full attention beside a
    one-token window, 1-token blocks, 12 free, EAGLE with 3 drafts and
    max_model_len 3. A 1-token prompt whose connector loads it async is
    refused for ever: vLLM keeps free, for its admission, a speculative
    decode step's 1 + 3 + 3 tokens in each group (14 blocks), however
    short the request. vLLM's documented reservation, not a stall."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 1), SpecDraw("SlidingWindowSpec", 1, (("sliding_window", 1),))),
                        hash_block_size=1, num_blocks=13, max_model_len=3)
    harness = harness_of(layout, batch=16, seqs=2, model_runner="v1", speculative_method="eagle",
                         num_speculative_tokens=3, draft_acceptance=(1,))
    rid = harness.add_request([7], max_tokens=1, reply=ExternalReply("store", store_len=1, load_async=True))
    for _ in range(4):
        _clean(harness.step())
    assert harness.status_of(rid) == "WAITING", "the request was admitted: the run no longer meets the case"
