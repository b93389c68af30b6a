"""The table of invariants (invariants/table.py) agrees with the check tuples
the runners use, the planted bugs, the planted cases of the self-tests and
the repro writer."""

from __future__ import annotations

from collections import Counter

from fuzz.adapter import PLANTED_SCHEDULER_BUGS, PLANTED_TRUNCATE_BUGS, SIBLING_PLANTS
from fuzz.known_bugs import KNOWN_BUGS
from invariants import scheduler as sched
from invariants.table import INVARIANTS, invariant
from invariants.truncation import TRUNCATION_CHECKS
from tests.invariants import planted_cases

TRUNCATION = [row for row in INVARIANTS if row.tier == "truncation"]
SCHEDULER = [row for row in INVARIANTS if row.tier == "scheduler"]


def test_every_row_is_one_claim_of_a_known_tier() -> None:
    assert {row.tier for row in INVARIANTS} == {"truncation", "scheduler"}
    twice = [key for key, n in Counter((row.tier, row.name) for row in INVARIANTS).items() if n > 1]
    assert not twice
    twice = [check for check, n in Counter(row.check for row in INVARIANTS).items() if n > 1]
    assert not twice


def test_the_rows_are_the_checks_the_runners_run() -> None:
    assert {row.name: row.check for row in TRUNCATION} == TRUNCATION_CHECKS
    runs = {*sched.STEP_CHECKS, *sched.ADMISSION_CHECKS, sched.check_no_leaked_blocks}
    assert {row.check for row in SCHEDULER} == runs


def test_every_planted_bug_is_some_rows_case() -> None:
    assert {bug for row in TRUNCATION for bug in row.planted} == set(PLANTED_TRUNCATE_BUGS)
    # drafts_never_cut is a triage case (tests/findings/test_triage_planted.py):
    # an assert planted beside a known bug, which no invariant is about.
    # The siblings of known bugs are triage cases too (tests/findings/test_known_bug_siblings.py).
    assert {bug for row in SCHEDULER for bug in row.planted} == (
        set(PLANTED_SCHEDULER_BUGS) - {"drafts_never_cut"} - set(SIBLING_PLANTS))


def test_every_row_is_shown_failing() -> None:
    open_bugs = {b.id for b in KNOWN_BUGS if b.fixed_in is None}
    for row in INVARIANTS:
        assert row.planted or row.real_bug, f"{row.name}: no planted bug and no real one shows it failing"
        assert row.real_bug is None or row.real_bug in open_bugs, row


def test_the_self_tests_planted_cases_are_the_tables() -> None:
    cases = [(check, name, bug) for check, name, bug, *_ in planted_cases.CASES]
    cases += [(check, name, bug) for check, name, bug, *_ in planted_cases.MACHINE_CASES]
    cases += [(check, name, bug) for check, name, bug, *_ in planted_cases.FIXED_CASES]
    cases += [(check, name, bug) for check, name, bug, *_ in planted_cases.SPEC_DECODE_CASES]
    cases += [(check, name, bug) for check, name, bug, *_ in planted_cases.OWNERSHIP_CASES]
    cases += [(check, name, bug) for check, name, bug, *_ in planted_cases.CONNECTOR_CASES]
    for check, name, bug in cases:
        row = invariant(name)
        assert row.check is check and bug in row.planted, (name, bug, row)
    for bug, name, _ in planted_cases.TRUNCATION_CASES:
        assert bug in invariant(name, tier="truncation").planted, (name, bug)
    for check, bug in planted_cases.CAUGHT_REAL_BUG.items():
        assert next(row for row in SCHEDULER if row.check is check).real_bug == bug
