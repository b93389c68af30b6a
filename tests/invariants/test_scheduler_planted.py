"""Every scheduler invariant catches a planted bug on the scheduler path.

Each case plants one bug (:func:`fuzz.adapter.planted_scheduler_bug`:
``Scheduler.schedule`` recompiled with one small edit, or a wrong
``truncate_computed_blocks``), runs the single-shot fuzzer with only the
invariant under test enabled, and expects that invariant to fail. The
failing scenario is then replayed on unmodified vLLM, where it must pass:
the failure is the planted bug's, not something else the search ran into.
The unplanted runs of the same targets pass in fuzz/targets/target_scheduler.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from fuzz.adapter import FIXED_RUNS, PLANTED_OWNERSHIP_BUGS, PLANTED_SCHEDULER_BUGS, SIBLING_PLANTS, planted_scheduler_bug
from fuzz.hunting import without_module_constants as _no_local_constants
from fuzz.repro.shrink import replay_violation
from fuzz.known_bugs import KNOWN_BUGS
from fuzz.targets import target_scheduler
from fuzz.model import ExternalReply, LayoutDraw, SpecDraw
from fuzz.runners.scheduler import STALE_OUTPUT, Stepper, run_fixed, run_single_shot
from invariants import cache as cache_checks
from invariants import contents as contents_checks
from invariants import scheduler as inv
from invariants.ownership import OWNERSHIP_CHECKS
from invariants.promises import check_hits_within_namespace, check_preempted_resumable
from invariants.hits import check_hit_matches_index
from fuzz.model import InvariantViolation
from strategies.single_shot import single_shot_scenarios
from tests.invariants.planted_cases import CASES, CAUGHT_REAL_BUG, FIXED_CASES, MACHINE_CASES, SPEC_DECODE_CASES
from tests.invariants.planted_runs import speculating_harness
from tests.support.search import planted_failure
from tests.support.harnesses import harness_of

SEARCH = settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],  # the first failure is enough; no shrinking
    suppress_health_check=list(HealthCheck),
)


# Planted bugs whose trigger the single-shot scenarios draw rarely: an async
# load that leaves prompt tokens to compute (one async reply in four, and
# mostly the store holds the whole prompt); a connector answer no longer
# than the local sub-block tail ('partial tail kept': about 1% of examples;
# the first 400 derandomized ones stopped holding one when replays began
# drawing skip_reading_prefix_cache, whose answer vLLM drops).
BUDGET = {"async_load_computes_at_once": 2000, "keeps_tail_and_loads": 2000}


@pytest.mark.parametrize(
    ("check", "invariant", "bug", "shortcut"),
    CASES,
    ids=[f"{name}<-{bug}" for _, name, bug, _ in CASES],
)
def test_invariant_catches_planted_bug(
    check: Callable[..., None], invariant: str, bug: str, shortcut: bool
) -> None:
    violation, scenario = planted_failure(
        bug, single_shot_scenarios(shortcut=shortcut, allow_over=False),
        settings=settings(SEARCH, max_examples=BUDGET.get(bug, SEARCH.max_examples)), checks=(check,),
    )
    assert violation.invariant == invariant, str(violation)
    # The same scenario on unmodified vLLM satisfies the invariant.
    run_single_shot(scenario, (check,), record=False)


@pytest.mark.parametrize(("check", "invariant", "bug", "run", "label"), FIXED_CASES,
                         ids=[f"{name}<-{bug}" for _, name, bug, *_ in FIXED_CASES])
def test_invariant_catches_planted_bug_in_a_fixed_run(
    check: Callable[..., None], invariant: str, bug: str, run: Callable[..., Stepper], label: str | None
) -> None:
    with planted_scheduler_bug(bug), pytest.raises(InvariantViolation) as caught:
        run((check,))
    assert caught.value.invariant == invariant, str(caught.value)
    # Unmodified vLLM satisfies it, on a run that meets the case.
    unmodified = run((check,))
    assert label is None or label in unmodified.labels
    assert not unmodified.harness.live_request_ids


def test_an_rswa_group_is_judged_as_full_attention() -> None:
    """R-SWA looks hits up as full attention: a lone R-SWA group (4-token
    blocks, a one-block decode window) sent one 12-token prompt twice has a
    prediction and hits 8 (the limit is 11), and the full-attention lookup
    planted to round its limit up to a whole block serves 12, a hit longer
    than the index allows."""
    def run(checks: tuple[Callable[..., None], ...]) -> Stepper:
        layout = LayoutDraw((SpecDraw("RSWASpec", 4, (("rswa_window", 4),)),), hash_block_size=4, num_blocks=33)
        stepper = Stepper(harness_of(layout, batch=32, seqs=2), checks)
        seen = []
        for _ in range(2):
            rid = stepper.harness.add_request(range(12), max_tokens=6)
            seen += [a for a in stepper.step().admissions if a.request_id == rid]
            stepper.drain()
        assert seen[-1].index_hold == ((4, 8, 12),) and seen[-1].local_hit == 8, seen[-1].describe()
        return stepper

    run((check_hit_matches_index,))
    with planted_scheduler_bug("lookup_rounds_limit_up"), pytest.raises(InvariantViolation) as caught:
        run((check_hit_matches_index,))
    assert caught.value.invariant == "hit-matches-index", str(caught.value)


def test_a_request_preempted_with_its_step_in_flight_is_resumable() -> None:
    """Async scheduling on a producer: vLLM preempts requests whose step is
    still running (their output placeholders are counted stale instead);
    right after each such schedule() the claim holds on unmodified vLLM."""
    run = run_fixed(FIXED_RUNS["delivers_stale_output"], (check_preempted_resumable,))
    assert STALE_OUTPUT in run.labels




def _speculating_run(async_scheduling: bool):  # type: ignore[no-untyped-def]
    """:func:`speculating_harness` run to the end."""
    return speculating_harness(async_scheduling).drain(context="speculating")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("check", "invariant", "bug"), SPEC_DECODE_CASES)
def test_a_planted_spec_decode_bug_is_caught(
    check: Callable[..., None], invariant: str, bug: str, async_scheduling: bool
) -> None:
    steps = _speculating_run(async_scheduling)
    assert any(v.num_rejected for s in steps for v in s.draft_verifications), "no draft was rejected"
    assert not [v for s in steps for v in inv.step_violations(s, (check,))]
    with planted_scheduler_bug(bug):
        steps = _speculating_run(async_scheduling)
    found = [v for s in steps for v in inv.step_violations(s, (check,))]
    assert found and {v.invariant for v in found} == {invariant}, found


def test_every_planted_bug_is_used() -> None:
    used = {bug for *_, bug, _ in CASES} | {bug for *_, bug in MACHINE_CASES}
    used |= {bug for _, _, bug, *_ in FIXED_CASES} | {bug for *_, bug in SPEC_DECODE_CASES}
    # The ownership edits have their cases in tests/invariants/test_ownership_planted.py;
    # drafts_never_cut (a triage case) in tests/findings/test_triage_planted.py.
    # The siblings of known bugs: tests/findings/test_known_bug_siblings.py.
    expected = set(PLANTED_SCHEDULER_BUGS) - set(PLANTED_OWNERSHIP_BUGS) - {"drafts_never_cut"} - set(SIBLING_PLANTS)
    # An ownership edit may show a contents claim too (mamba_adopts_same_step_state: reads-written).
    assert used - set(PLANTED_OWNERSHIP_BUGS) == expected, expected ^ used


# A second row a fixed run's plant is named by (the run shows the first,
# planted_runs.SHOWN_AS): the test file that shows this check catching it.
SHOWN_ELSEWHERE = {
    contents_checks.check_keys_name_one_prefix: "tests/invariants/test_prefix_identity.py",
    cache_checks.check_hit_reaches_model: "tests/invariants/test_cache.py",
}


def test_every_scheduler_check_has_a_planted_case() -> None:
    checks = {c for c, *_ in CASES} | {c for c, *_ in MACHINE_CASES} | {c for c, *_ in FIXED_CASES}
    checks |= {c for c, *_ in SPEC_DECODE_CASES} | set(CAUGHT_REAL_BUG) | set(SHOWN_ELSEWHERE)
    # The ownership checks have their cases in tests/invariants/test_ownership_planted.py.
    expected = {*inv.STEP_CHECKS, *inv.ADMISSION_CHECKS, inv.check_no_leaked_blocks} - set(OWNERSHIP_CHECKS)
    assert checks == expected, expected ^ checks
    assert set(CAUGHT_REAL_BUG.values()) <= {b.id for b in KNOWN_BUGS if b.fixed_in is None}


@pytest.mark.parametrize(
    ("bug", "invariants"),
    [
        # Keeping a diverged hit without the fallback leaves the Mamba state
        # missing at the resume point, or, on a layout whose lagging group is
        # another must-cover one (sliding window), that group's blocks, or
        # (a Mamba group with no hit at all) makes allocate_slots assert
        # inside schedule(): with every check on, whichever the machine meets
        # first reports it.
        # (The ownership model sees the same missing state as a read of blocks
        # the request does not hold.) When the Mamba group's own hit is a
        # sub-block one in the block at the boundary's index (hit 18 of a
        # 24-token local part, 12-token blocks), that index holds a real
        # block and only diverged-falls-back, the claim about this very
        # fallback, sees it (met first once replays drew
        # skip_reading_prefix_cache and the mined constants changed).
        (
            "no_divergent_fallback",
            {"mamba-state-at-boundary", "local-part-covered", "no-exception", "read-blocks-held", "diverged-falls-back"},
        ),
        # Skipping the truncation keeps the sub-block tail's cached block in
        # the adopted blocks: the local part is miscounted, or, when the
        # external load past it fails, that block is inside the failed range
        # and keeps its hash (met first once the search ran without the
        # mined constants; the same op log on unmodified vLLM passes); or
        # the kept block's group caches full blocks whose parent no event
        # announced (events-chain: met first once the machine drew runs
        # without a connector; the op log passes on unmodified vLLM).
        ("skip_truncation", {"computed-adds-up", "failed-load-not-cached", "events-chain"}),
    ],
)
def test_state_machine_catches_planted_bug(bug: str, invariants: set[str]) -> None:
    """The stateful machine checks every invariant after every step too.
    (Without the constants Hypothesis mines from the loaded modules: with
    them, which example it meets first moved with any literal added to the
    suite.)"""
    machine_search = settings(SEARCH, max_examples=300, stateful_step_count=30)
    with planted_scheduler_bug(bug), _no_local_constants(), pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(target_scheduler.SchedulerMachine, settings=machine_search)
    assert caught.value.invariant in invariants, str(caught.value)
    # The planted edit is what breaks it: the same operations on unmodified
    # vLLM keep the claim.
    log = caught.value.oplog  # the shrunk run's, carried by its violation
    assert log is not None and replay_violation(log, caught.value.invariant) is None, str(caught.value)


def test_the_machine_reports_the_first_violation_of_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a step raises, teardown steps no further: it used to serve what
    was queued and could raise a later, different violation in place of the
    first (seen: failed-load-not-cached at step 32 reported for a run whose
    step 31 broke computed-adds-up; that program then replayed to the other
    one and wrote no repro)."""
    from fuzz.runners import scheduler as runner

    steps: list[tuple[int, list[str]]] = []
    triage = runner.triage

    def recording(step, checks=None):  # type: ignore[no-untyped-def]
        unknown, known = triage(step, checks)
        steps.append((step.step, [v.invariant for v in unknown]))
        return unknown, known

    monkeypatch.setattr(runner, "triage", recording)
    machine_search = settings(SEARCH, max_examples=300, stateful_step_count=30)
    with planted_scheduler_bug("skip_truncation"), pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(target_scheduler.SchedulerMachine, settings=machine_search)
    last_run = steps[max(i for i, (n, _) in enumerate(steps) if n == 1):]
    broken = [(n, found) for n, found in last_run if found]
    assert len(broken) == 1, f"the last run stepped on after its first violation: {broken}"
    assert caught.value.invariant == broken[0][1][0], (broken, str(caught.value))


@pytest.mark.parametrize(
    ("check", "invariant", "bug"), MACHINE_CASES, ids=[f"{name}<-{bug}" for _, name, bug in MACHINE_CASES]
)
def test_state_machine_catches_planted_load_failure_bug(check: Callable[..., None], invariant: str, bug: str) -> None:
    """Failed loads come from the machine's fail_next_async_loads /
    fail_next_sync_loads rules; the check alone is run, so another claim
    the bug also breaks cannot hide it."""
    # A failed sync load needs a single-group layout (vLLM maps invalid block
    # ids back to requests only then) and the policy the bug is on: rarer.
    budget = 1500
    machine_search = settings(SEARCH, max_examples=budget, stateful_step_count=30)
    with (
        planted_scheduler_bug(bug),
        target_scheduler.checks_for_machine((check,)),
        _no_local_constants(),  # what else the session imported must not move the search
        pytest.raises(InvariantViolation) as caught,
    ):
        run_state_machine_as_test(target_scheduler.SchedulerMachine, settings=machine_search)
    assert caught.value.invariant == invariant, str(caught.value)


def test_a_window_group_dropping_an_adopted_block_is_no_cross_salt_hit() -> None:
    """Pinned from a 600 s campaign on unmodified vLLM (the claim then judged
    every adopted block): a lone sliding-window group (window 4, 2-token
    blocks); r10 and r11 (no salt) adopt blocks 1 and 3 from the prefix
    cache, then take external hits long enough that the window drops them
    (their tables hold the null block there), and the pool hands block 1,
    in the same step, to tenant a's r12, whose sync load fills it. No
    request reads a block of another salt: the claim holds."""
    layout = LayoutDraw(
        (SpecDraw("SlidingWindowSpec", 2, (("sliding_window", 4),)),), hash_block_size=2, num_blocks=13,
        max_model_len=24,
    )
    harness = harness_of(layout, batch=4, seqs=3, long_prefill_token_threshold=1, prefill_schedule_interval=4,
                         async_scheduling=True, model_runner="v2", kv_load_failure_policy="fail",
                         divergent_hits=True)
    run = Stepper(harness, (check_hits_within_namespace,))
    harness.add_request(range(131, 166, 7), max_tokens=1, reply=ExternalReply("zero"))
    harness.add_request(range(131, 173, 7), max_tokens=1)
    for _ in range(8):
        run.step()
    shared = [131, 138, 145, 152, 159]
    r10 = harness.add_request(shared + [166, 1000, 1000, 1001, 1000, 4512], max_tokens=4,
                              reply=ExternalReply("store", store_len=11))
    harness.add_request(shared + [3576, 3577, 3578, 3579], max_tokens=1, reply=ExternalReply("store", store_len=9))
    # The campaign's r12 asked the connector's store, which then kept saved KV
    # under bare tokens and answered 6 (the unsalted r1's); the store now keys
    # by namespace too, so the same answer is scripted.
    r12 = harness.add_request(shared + [166, 1000, 1000, 1001], max_tokens=1,
                              reply=ExternalReply("store", store_len=6), cache_salt="tenant-a")
    step = run.step()
    (adm,) = [a for a in step.admissions if a.request_id == r10]
    dropped = set(adm.alloc_local_blocks[0]) - set(adm.block_table[0])
    assert dropped, "the window kept every adopted block: the run no longer meets the case"
    assert dropped & set(harness.contents.tables[r12][0]), "no dropped block went to tenant a's request"
    run.drain()


@pytest.mark.parametrize(
    ("bug", "change"),
    [
        ("hit_stops_a_block_early", {"hits": (0, 8)}),
        ("stored_event_names_itself_parent", {"events": (("BlockRemoved", 1),)}),
        ("max_tokens_skip_unguarded", {"label": "preemption"}),
    ],
    ids=["hits", "events", "label"],
)
def test_a_fixed_run_that_no_longer_meets_its_case_fails_loudly(bug: str, change: dict[str, object]) -> None:
    """A fixed run whose unmodified play no longer shows what it was written
    to show (a hit, a KV event, a branch) fails, instead of passing its
    self-test for want of a trigger."""
    run_fixed(FIXED_RUNS[bug], ())
    with pytest.raises(AssertionError, match="no longer meets its case"):
        run_fixed(dataclasses.replace(FIXED_RUNS[bug], **change), ())  # type: ignore[arg-type]
