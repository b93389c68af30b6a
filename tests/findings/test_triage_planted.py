"""Triage never swallows a new bug: a failure planted beside a known bug, in
the same vLLM function, is reported as new.

``drafts_never_cut`` plants an assert in ``Scheduler.schedule`` (speculating
runs: every running request's scheduled drafts are all its drafts), a few
lines from the known spec-decode padding assert
(``spec-decode-padding-cut-by-long-prefill-threshold``). Its signature names
its own statement, so the planted one is no known bug; the same operations
pass on unmodified vLLM.
"""

from __future__ import annotations

import pytest

from fuzz.adapter import planted_scheduler_bug
from fuzz.runners.scheduler import triage
from invariants.scheduler import check_no_exception_escapes
from tests.known_bugs.runs import three_decoding_requests


def test_a_new_assert_in_schedule_is_reported_as_new() -> None:
    with planted_scheduler_bug("drafts_never_cut"):
        steps = three_decoding_requests()
    failing = [s for s in steps if s.error]
    assert failing, "the planted assert never fired"
    unknown, known = triage(failing[0], (check_no_exception_escapes,))
    assert known == [], known
    assert [v.invariant for v in unknown] == ["no-exception"], unknown
    assert unknown[0].statement == "assert len(spec_token_ids) == len(request.spec_token_ids)", unknown[0].statement
    assert unknown[0].frames[0].endswith(":Scheduler.schedule"), unknown[0].frames


def test_control_the_same_run_passes_on_unmodified_vllm() -> None:
    steps = three_decoding_requests()
    for step in steps:
        check_no_exception_escapes(step)


def _reads_step(*reads):  # type: ignore[no-untyped-def]
    from fuzz.model import StepObservation

    return StepObservation(
        step=12, admissions=(), error=None, error_type=None, error_where=None, dishonest_replies=(),
        num_scheduled={"r3": 1, "r4": 1}, newly_scheduled=(), preempted=frozenset(), finished=frozenset(),
        unwritten_reads=reads,
    )


# Met by a 300 s machine campaign on unmodified vLLM 0.33.0 (full attention
# beside Mamba, 4-token blocks, async): in one step r4 reads a block a
# same-step copy took before its source was filled (same-step-partial-hit-
# reads-unwritten-block) and r3, recomputing its last token after an async
# load of its whole prompt, reads the Mamba state at 4 for 3
# (full-prompt-async-load-replays-outside-window).
_LOST_TO_COPY = ("r4", 0, "FullAttentionSpec", 11, 7, False, ((4, (-1, 10, None)),))
_AFTER_WHOLE_LOAD = ("r3", 1, "MambaSpec", 10, 3, True, ((3, (4, 10, None)),))
_UNEXPLAINED = ("r5", 0, "FullAttentionSpec", 12, 4, False, ((2, None),))


def test_a_step_showing_two_known_bugs_is_set_aside_as_both() -> None:
    from fuzz.model import UnwrittenRead
    from invariants.contents import check_reads_written

    step = _reads_step(UnwrittenRead(*_LOST_TO_COPY), UnwrittenRead(*_AFTER_WHOLE_LOAD))
    unknown, known = triage(step, checks=(check_reads_written,))
    assert unknown == [] and sorted(known) == [
        "full-prompt-async-load-replays-outside-window", "same-step-partial-hit-reads-unwritten-block"], known


def test_a_known_bug_beside_an_unexplained_read_still_reports_the_read() -> None:
    from fuzz.model import InvariantViolation, UnwrittenRead
    from invariants.contents import check_reads_written

    step = _reads_step(UnwrittenRead(*_LOST_TO_COPY), UnwrittenRead(*_UNEXPLAINED))
    unknown, known = triage(step, checks=(check_reads_written,))
    assert known == ["same-step-partial-hit-reads-unwritten-block"], known
    assert len(unknown) == 1 and "request r5" in str(unknown[0]) and "request r4" not in str(unknown[0]), unknown
    # The check alone still raises, on the first cause.
    with pytest.raises(InvariantViolation, match=r"\[reads-written\] request r4"):
        check_reads_written(step)
