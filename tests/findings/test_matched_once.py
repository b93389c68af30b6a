"""A violation is matched against the known bugs once: what
:func:`fuzz.known_bugs.sort_out` leaves of it (the runner's triage) is no
known bug's, and the findings writer's :func:`~fuzz.known_bugs.match_violation`
does not match it again; a violation nothing sorted out (the truncation tier,
a run that reports known bugs) is matched there, once."""

from __future__ import annotations

from fuzz import adapter
from fuzz.known_bugs import known_bug, match_violation, sort_out
from fuzz.model import Instance, InvariantViolation
from invariants import ownership as own

VERSION = adapter.VLLM_VERSION
WHOLE_LOAD = "full-prompt-async-load-replays-outside-window"
LANDED = "Scheduler._update_waiting_for_remote_kv"
REAL = Instance(own.READ_DROPPED_AFTER_WHOLE_LOAD, "MambaSpec", 0, ("r1",), ())
FREED = Instance(own.READ_NOT_HELD, "FullAttentionSpec", 1, ("r1",), (7,))


def _held(*instances: Instance) -> InvariantViolation:
    return InvariantViolation("read-blocks-held", "reads", where=LANDED, instances=instances)


def test_a_violation_nothing_sorted_out_is_matched_by_the_findings_writer() -> None:
    violation = _held(REAL)
    assert not violation.sorted_out
    assert match_violation(violation, VERSION) is known_bug(WHOLE_LOAD)


def test_what_sort_out_leaves_is_not_matched_again() -> None:
    known, rest = sort_out(_held(REAL, FREED), VERSION)
    assert known == [WHOLE_LOAD] and rest is not None and rest.sorted_out
    assert match_violation(rest, VERSION) is None
    _, unknown = sort_out(_held(FREED), VERSION)
    assert unknown is not None and unknown.sorted_out and match_violation(unknown, VERSION) is None


def test_a_violation_of_known_instances_only_is_set_aside_whole() -> None:
    assert sort_out(_held(REAL), VERSION) == ([WHOLE_LOAD], None)
