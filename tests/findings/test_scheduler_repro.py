"""Every planted scheduler-path bug becomes a standalone vLLM test.

For each planted bug (:data:`fuzz.adapter.PLANTED_SCHEDULER_BUGS`: the
``Scheduler.schedule`` edits and the wrong ``truncate_computed_blocks``
variants): the single-shot fuzzer finds it with every check on, the writer
(:mod:`fuzz.repro.scheduler`) shrinks the operation log and writes a pytest
file importing vLLM and the standard library only, and that file fails with
the bug planted and passes without it. The same holds for the state machine
(other scheduler configurations: tests/findings/test_scheduler_repro_configs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from fuzz.adapter import planted_scheduler_bug
from fuzz.model import InvariantViolation
from fuzz.repro.scheduler import (
    _check_of,
    WRITABLE,
    repro_size,
    scheduler_repro,
    scheduler_repro_of_failure,
    shrink_oplog,
    shrunk_log_of_failure,
)
from fuzz.runners.scheduler import run_single_shot
from fuzz.targets import target_scheduler
from fuzz.targets.target_scheduler import UNSUPPORTED
from fuzz.hunting import without_module_constants as _no_local_constants  # edits elsewhere must not move the search
from invariants import connector as conn
from invariants import scheduler as inv
from tests.findings.repro_checks import (
    ALLOWED_IMPORTS,
    SEARCH,
    check_repro,
    fixed_case_log,
    fixed_run_cases,
    imports_of,
    planted_search_strategy,
    run_repro,
)
from tests.known_bugs._pin import known_vllm_bug
from tests.support.harnesses import harness_of
from tests.support.search import planted_failure

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

# Planted bug -> the invariant the campaign's checks (all of them) report first.
BUGS = {
    "pre_fix_assert_all": "no-exception",
    "fallback_discards_hit": "diverged-falls-back",
    "skip_truncation": "computed-adds-up",
    "truncation_one_block_short": "local-part-covered",
    "reports_external_twice": "computed-below-num-tokens",
    # The KV-connector protocol's planted bugs.
    "asks_connector_unaligned": "external-contiguous",
    "tells_connector_total": "told-external-accounted",
    "hands_connector_cached_blocks": "load-blocks-cover",
    "keeps_tail_and_loads": "no-exception",
    "skips_meta_on_empty_step": "meta-built-once",
    "async_load_counted_scheduled": "no-exception",
    "no_sync_load_flag": "sync-load-announced",
    "connector_finished_twice": "finished-once",
    "async_load_computes_at_once": "no-exception",
    # A request that skips the prefix cache (skip_reading_prefix_cache).
    "skipping_request_loads_external": "skip-reads-no-cache",
    "skipping_request_reads_local_cache": "skip-reads-no-cache",
    # What the blocks hold (the file carries the suite's BlockContents).
    "caches_async_load_early": "index-written",
}
# The scheduler-tier limit for the pre-fix assert (issue 13).
LIMITS = {"pre_fix_assert_all": {"groups": 2, "requests": 3, "steps": 6}}
# The seed the every-check search draws from: the one it drew from when it
# was written out here (Hypothesis's digest of that function), so it meets
# the examples BUGS and LIMITS describe.
EVERY_CHECK_SEED = int("4310643ec278f8bbb670fcbe5de934a7d7c6ee64511ee660098f1cb5dc758a5a7b182e504e296483f2e257760f3fe0d4", 16)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_becomes_a_standalone_repro(bug: str, tmp_path: Path) -> None:
    # The first failing single-shot example, every check on (as the campaign runs it).
    violation, _ = planted_failure(bug, planted_search_strategy(), settings=SEARCH, module_constants=False,
                                   seed=EVERY_CHECK_SEED)
    assert violation.invariant == BUGS[bug], str(violation)
    with planted_scheduler_bug(bug):
        log = shrunk_log_of_failure(violation, violation.invariant)  # the shrunk run the file replays
        source = None if log is None else scheduler_repro(log, invariant=violation.invariant, target="scheduler-single-shot", seed=0,
                                                           violation=str(violation))
    assert log is not None
    size = repro_size(log)
    for what, limit in LIMITS.get(bug, {}).items():
        assert size[what] <= limit, (bug, size)
    check_repro(source, bug, tmp_path)


def test_the_state_machine_shrunk_program_becomes_a_repro(tmp_path: Path) -> None:
    bug = "skip_truncation"
    with planted_scheduler_bug(bug), pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(target_scheduler.SchedulerMachine,
                                  settings=settings(SEARCH, max_examples=300, stateful_step_count=30))
    violation = caught.value
    with planted_scheduler_bug(bug):
        source = scheduler_repro_of_failure(target="scheduler-machine", seed=0,
                                            invariant=violation.invariant, violation=str(violation),
                                            failure=violation)
    check_repro(source, bug, tmp_path)


# Planted bugs on the failed-load paths only the state machine reaches (its
# fail_next_*_loads rules): searched with their check alone (as
# tests/invariants/test_scheduler_planted.py does), shrunk, written. Budget 0: a fixed
# run instead (_FIXED_LOGS), as for a preempted request's stale output.
MACHINE_BUGS = {
    # 0: the fixed scenario below. A search meets Mamba layouts first, where
    # unmodified vLLM already breaks the claim (mamba-failed-load-rollback,
    # set aside per instance in a campaign, but not in a file that states the
    # whole claim).
    "resumes_past_invalid_block": (conn.check_failed_load_recomputed, 0),
    "evicts_invalid_blocks_on_recompute": (conn.check_failed_load_not_cached, 1500),
    "failed_async_load_kept": (conn.check_failed_load_recomputed, 0),  # 0: the fixed scenario below
}


def _failed_load_log(bug: str, async_load: bool = True):  # type: ignore[no-untyped-def]
    """The connector protocol's async- (or sync-) load-fails-recompute run
    (tests/invariants/planted_runs.py), planted: a derandomized machine search for it
    moved with unrelated edits, so this case starts from the fixed scenario."""
    from tests.invariants.planted_runs import failed_load_run

    with planted_scheduler_bug(bug):
        harness, _ = failed_load_run(async_load, "recompute")
    return harness.oplog


# Planted bug -> its fixed run's log and the invariant it breaks.
_FIXED_LOGS = {
    "failed_async_load_kept": lambda bug: (_failed_load_log(bug), "failed-load-recomputed"),
    "resumes_past_invalid_block": lambda bug: (_failed_load_log(bug, async_load=False), "failed-load-recomputed"),
}


def test_a_failure_that_needs_no_connector_gets_a_file_without_one(tmp_path: Path) -> None:
    """The cache-salt plant's fixed run loads and saves nothing: shrinking
    replays it on a scheduler without a KV connector, and the file carries
    no connector class, store or KVTransferConfig, yet fails planted (in
    the kit's check) and passes unplanted. A connector claim keeps it."""
    from fuzz.model import SchedulerDraw
    from fuzz.repro.shrink import _may_drop_connector
    from tests.invariants.planted_cases import FIXED_CASES

    bug = "cache_salt_not_hashed"
    log, invariant = fixed_case_log(bug)
    assert log.config.draw.connector
    (check,) = [c for c, _, b, *_ in FIXED_CASES if b == bug]
    assert not _may_drop_connector(log, "told-external-accounted")
    with planted_scheduler_bug(bug):
        log = shrink_oplog(log, invariant, checks=(check,))
    assert not log.config.draw.connector and not log.config.draw.divergent_hits
    source = scheduler_repro(log, invariant=invariant, target="scheduler-machine", seed=0, violation="")
    assert source is not None and "no KV connector" in source
    for absent in ("class ScriptedConnector", "KVTransferConfig", "STORE = ", "RECORDED_ANSWERS", "kv_connector_module_path"):
        assert absent not in source, absent
    check_repro(source, bug, tmp_path, check=_check_of(invariant))
    with pytest.raises(ValueError, match="divergent"):
        SchedulerDraw(log.config.draw.layout, connector=False)


@pytest.mark.parametrize("bug", sorted(MACHINE_BUGS))
def test_a_planted_failed_load_bug_becomes_a_standalone_repro(bug: str, tmp_path: Path) -> None:
    check, budget = MACHINE_BUGS[bug]
    if not budget:
        log, invariant = _FIXED_LOGS[bug](bug)
        assert log is not None
        with planted_scheduler_bug(bug):
            log = shrink_oplog(log, invariant, checks=(check,))
        source = scheduler_repro(log, invariant=invariant, target="scheduler-machine", seed=0, violation="")
        check_repro(source, bug, tmp_path)
        return
    search = settings(SEARCH, max_examples=budget, stateful_step_count=30)
    with (
        planted_scheduler_bug(bug),
        target_scheduler.checks_for_machine((check,)),
        _no_local_constants(),  # what else the session imported must not move the search
        pytest.raises(InvariantViolation) as caught,
    ):
        run_state_machine_as_test(target_scheduler.SchedulerMachine, settings=search)
    invariant = caught.value.invariant
    assert invariant in WRITABLE
    with planted_scheduler_bug(bug):
        log = shrink_oplog(caught.value.oplog, invariant, checks=(check,))
    source = scheduler_repro(log, invariant=invariant, target="scheduler-machine", seed=0, violation="")
    check_repro(source, bug, tmp_path)


def test_every_planted_scheduler_bug_has_a_repro_case() -> None:
    from fuzz.adapter import PLANTED_OWNERSHIP_BUGS, PLANTED_SCHEDULER_BUGS

    cases = set(BUGS) | set(MACHINE_BUGS) | {bug for _, bug in CHECK_ALONE} | set(OWNERSHIP_BUGS) | set(fixed_run_cases())
    # tests/findings/test_scheduler_repro_configs.py: the speculative-decoding repros.
    cases.add("rejected_drafts_stay_computed")  # test_a_planted_spec_decode_bug_becomes_a_standalone_repro
    cases.add("records_first_sampled_token")  # test_accepted_drafts_recorded_as_other_tokens_...
    cases.add("drafts_never_cut")  # tests/findings/test_triage_planted.py: a new assert beside a known one
    # tests/findings/test_known_bug_siblings.py: siblings of known bugs, triage cases.
    from fuzz.adapter import SIBLING_PLANTS

    cases |= set(SIBLING_PLANTS)
    # Plants of a claim no file states yet (its row's repro=False): shown on their fixed run only.
    from invariants.table import INVARIANTS

    cases |= {bug for row in INVARIANTS if row.tier == "scheduler" and not row.repro for bug in row.planted}
    assert cases == set(PLANTED_SCHEDULER_BUGS), cases ^ set(PLANTED_SCHEDULER_BUGS)
    assert set(OWNERSHIP_BUGS) == set(PLANTED_OWNERSHIP_BUGS)
    assert set(BUGS.values()) | set(OWNERSHIP_BUGS.values()) <= WRITABLE


def test_invariants_it_cannot_state_get_no_file() -> None:
    from fuzz.model import ExternalReply, LayoutDraw, SpecDraw

    # A run of its own: the test must not depend on which test ran before.
    harness = harness_of(LayoutDraw((SpecDraw("FullAttentionSpec", 4),), 4, 16))
    harness.add_request(range(8), reply=ExternalReply("store", store_len=4))
    harness.step()
    log = harness.oplog
    assert log.steps, "the run recorded no step"
    assert scheduler_repro(log, invariant="no-exception", target="t", seed=0, violation="") is not None
    assert "an-invariant-it-cannot-state" not in WRITABLE
    assert scheduler_repro(log, invariant="an-invariant-it-cannot-state", target="t", seed=0, violation="") is None


def test_groups_the_failure_does_not_need_shrink_away() -> None:
    """The any-layout target's shrunk pre-fix failure, as a campaign first
    wrote it (3 groups): replay-shrinking drops the second full-attention
    group, the two requests and two steps stay."""
    from fuzz.model import ExternalReply, LayoutDraw, SpecDraw

    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4), SpecDraw("FullAttentionSpec", 4)),
                        hash_block_size=1, num_blocks=19)
    with planted_scheduler_bug("pre_fix_assert_all"):
        harness = harness_of(layout, batch=4, seqs=1, model_runner="v2")
        harness.add_request(range(0, 42, 7), reply=ExternalReply("store", store_len=6))
        harness.step()
        harness.add_request(range(0, 70, 7), reply=ExternalReply("store", store_len=10))
        assert harness.step().error_type == "AssertionError"
        shrunk = shrink_oplog(harness.oplog, "no-exception")
    assert repro_size(shrunk) == {"groups": 2, "blocks": 19, "requests": 2, "steps": 2}, shrunk.config.draw


# The real vLLM bugs of tests/known_bugs/test_known_vllm_bugs_scheduler.py, through the
# writer: the generated files fail on the installed vLLM while it has the bug.
# (The hand-written pins stay: the Mamba undercount's is one allocate_slots
# call on a bare manager, clearer than any scheduler program.)
@pytest.mark.parametrize("bug_id", ["mamba-external-block-undercount", "same-step-cow-chain"])
def test_a_real_vllm_bug_regenerates_as_a_failing_repro(bug_id: str, tmp_path: Path) -> None:
    from fuzz.adapter import VLLM_VERSION
    from fuzz.known_bugs import known_bug
    from tests.known_bugs.runs import pool_nearly_full_scenario, shared_partial_hit_harness

    if not known_bug(bug_id).affects(VLLM_VERSION):
        pytest.skip(f"{bug_id} does not affect vLLM {VLLM_VERSION}")
    if bug_id == "mamba-external-block-undercount":
        harness, step = pool_nearly_full_scenario()
        log, invariant = harness.oplog, "no-exception"
    else:
        shared = shared_partial_hit_harness(2)
        shared.step()
        log, invariant = shared.oplog, "copy-source-ready"
    assert log is not None
    source = scheduler_repro(log, invariant=invariant, target="tests/known_bugs/test_known_vllm_bugs_scheduler.py", seed=None,
                             violation=bug_id)
    assert source and imports_of(source) <= ALLOWED_IMPORTS
    path = tmp_path / f"test_{bug_id.replace('-', '_')}.py"
    path.write_text(source)
    failure = run_repro(path, tmp_path, None)
    assert failure is not None, f"the generated repro of {bug_id} passes on vLLM {VLLM_VERSION}"
    expected = "ValueError" if invariant == "no-exception" else ", which copy "
    assert expected in str(failure), str(failure)


# The connector checks a planted bug never reaches first with every check on
# (the scheduler raises soon after): searched, shrunk and written with that
# check alone, as tests/invariants/test_scheduler_planted.py searches them.
CHECK_ALONE = [
    (conn.check_dropped_answer_loads_nothing, "keeps_tail_and_loads"),
    (conn.check_meta_names_scheduled, "async_load_counted_scheduled"),
    (conn.check_async_load_lands_first, "async_load_computes_at_once"),
    # With every check on, the block-ownership model sees the untouched
    # refcounts first (read-blocks-held): this case is about the leak.
    (inv.check_no_leaked_blocks, "truncate_touches_refcounts"),
    # With every check on, the block-ownership model may see the missing
    # Mamba state first (read-blocks-held: it did once replays drew
    # skip_reading_prefix_cache and the search moved); this case is about
    # the state at the resume boundary.
    (inv.check_mamba_state_at_resume_boundary, "no_divergent_fallback"),
    # With every check on, index-names-its-prefix sees the cached block the
    # partial hit writes into as soon as it is overwritten; this case is
    # about the later reader.
    (inv.check_reads_written, "partial_hit_shares_its_block"),
]


def _searched_with_its_check() -> list[tuple[Callable[..., None], str]]:
    """A plant the single-shot search shows caught (``SEARCHED`` of
    tests/invariants/test_scheduler_planted.py) that neither list above
    writes: searched with the check of the first row naming it alone."""
    from invariants.table import INVARIANTS
    from tests.invariants.planted_cases import SEARCHED

    written = set(BUGS) | {bug for _, bug in CHECK_ALONE}
    return [
        (next(row.check for row in INVARIANTS if row.tier == "scheduler" and bug in row.planted), bug)
        for bug in SEARCHED if bug not in written
    ]


CHECK_ALONE += _searched_with_its_check()


@pytest.mark.parametrize(("check", "bug"), CHECK_ALONE, ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_a_check_alone_becomes_a_repro(check, bug: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    violation, _ = planted_failure(bug, planted_search_strategy(), settings=SEARCH, checks=(check,), module_constants=False)
    invariant = violation.invariant
    assert invariant in WRITABLE
    with planted_scheduler_bug(bug):
        log = shrink_oplog(violation.oplog, invariant, checks=(check,))
    source = scheduler_repro(log, invariant=invariant, target="scheduler-single-shot", seed=0, violation="")
    check_repro(source, bug, tmp_path)


def test_an_engine_reachable_finding_becomes_a_repro(tmp_path: Path) -> None:
    """The engine-reachable target's configurations come from vLLM's own
    planning: the writer keeps the planned groups (no group shrinking) and
    the file still fails planted and passes unplanted."""
    from fuzz.targets.target_scheduler import engine_reachable_strategy

    bug = "pre_fix_assert_all"

    violation, _ = planted_failure(bug, engine_reachable_strategy(), settings=settings(SEARCH, max_examples=600))
    with planted_scheduler_bug(bug):
        log = shrunk_log_of_failure(violation, violation.invariant)
        source = None if log is None else scheduler_repro(log, invariant=violation.invariant, target="scheduler-engine-reachable", seed=0,
                                                           violation=str(violation))
    assert log is not None and log.config.draw.engine is not None
    check_repro(source, bug, tmp_path)


# The block-ownership planted bugs (invariants/ownership.py): found as
# tests/invariants/test_ownership_planted.py finds them (its strategy per bug, the
# invariant's check alone), shrunk with that check, written.
OWNERSHIP_BUGS = {
    "mamba_frees_resume_state": "read-blocks-held",
    "mamba_adopts_same_step_state": "same-step-hazard",
    "cow_block_not_reserved": "reservation-covers-allocation",
    "mamba_count_goes_negative": "reservation-covers-allocation",
    "lookup_rounds_limit_up": "lookup-within-limit",
}
# Their repros, as measured here (groups / pool blocks / requests / steps, in
# the README): 1/11/1/2, 1/34/2/6, 2/43/2/4, 2/39/1/6, 1/24/2/1 in the order
# above. (The negative count's was 2/251/1/4 until the any-layout mix drew
# skip_reading_prefix_cache: the search now meets it with a 4-token budget,
# so its one 50-token request reaches the -1 at its sixth step.) The pool is the drawn one; the rest may not grow. The negative
# Mamba count needs a second group taking a block beside it: a lone -1
# hides nothing (no violation), so its repro keeps two groups.
LIMITS.update({
    "mamba_frees_resume_state": {"groups": 1, "requests": 1, "steps": 2},
    # Two groups since the replay draws decode lengths: the search's first
    # hit is now a full-attention + Mamba layout the shrinker keeps whole.
    "mamba_adopts_same_step_state": {"groups": 2, "requests": 2, "steps": 6},
    "cow_block_not_reserved": {"groups": 2, "requests": 2, "steps": 4},
    "mamba_count_goes_negative": {"groups": 2, "requests": 1, "steps": 6},
    "lookup_rounds_limit_up": {"groups": 1, "requests": 2, "steps": 1},
})


@pytest.mark.parametrize("bug", sorted(OWNERSHIP_BUGS))
def test_a_planted_ownership_bug_becomes_a_standalone_repro(bug: str, tmp_path: Path) -> None:
    from tests.invariants.planted_cases import OWNERSHIP_BUDGET, OWNERSHIP_CASES, OWNERSHIP_SEED

    ((check, invariant, strategy),) = [(c, i, st) for c, i, b, st in OWNERSHIP_CASES if b == bug]
    assert invariant == OWNERSHIP_BUGS[bug]
    # As tests/invariants/test_ownership_planted.py searches, without the
    # mined constants: what else the run imported must not move the search.
    violation, scenario = planted_failure(bug, strategy(), settings=settings(SEARCH, max_examples=OWNERSHIP_BUDGET),
                                          checks=(check,), module_constants=False, seed=OWNERSHIP_SEED)
    assert violation.invariant == invariant, str(violation)
    with planted_scheduler_bug(bug):
        with pytest.raises(InvariantViolation) as rerun:
            run_single_shot(scenario, (check,), record=False)
        log = shrink_oplog(rerun.value.oplog, invariant, checks=(check,))
    size = repro_size(log)
    for what, limit in LIMITS[bug].items():
        assert size[what] <= limit, (bug, size)
    source = scheduler_repro(log, invariant=invariant, target="scheduler-single-shot", seed=0, violation=str(violation))
    check_repro(source, bug, tmp_path)


class _ReproStillFails(Exception):
    """The generated repro fails on the installed vLLM: the bug is still there."""


# The real vLLM 0.33.0 bugs the ownership model found
# (tests/known_bugs/test_ownership_findings.py), through the writer: the
# generated file fails on the installed vLLM while it has the bug (a strict
# xfail, as the pins are: it turns red the day vLLM fixes the bug).
@known_vllm_bug("vLLM 0.33.0 has the bug: the written repro fails", raises=_ReproStillFails)
@pytest.mark.parametrize(
    "bug_id",
    [
        "same-step-partial-hit-reads-unwritten-block",
        "full-prompt-async-load-replays-outside-window",
        "mamba-failed-load-rollback",
    ],
)
def test_a_real_ownership_bug_regenerates_as_a_failing_repro(
    bug_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fuzz import known_bugs
    from fuzz.adapter import VLLM_VERSION
    from invariants import ownership as own
    from tests.known_bugs import runs as pins

    if not known_bugs.known_bug(bug_id).affects(VLLM_VERSION):
        pytest.skip(f"{bug_id} does not affect vLLM {VLLM_VERSION}")
    from tests.known_bugs.runs import failed_sync_load_run

    monkeypatch.setattr(known_bugs, "match", lambda failure, version: None)  # the pin must see its own bug
    if bug_id == "mamba-failed-load-rollback":
        # Its pin states failed-load-recomputed; the ownership model sees the
        # rolled-back request read the null block where its state should be.
        check, invariant = own.check_read_blocks_held, "read-blocks-held"
        log = failed_sync_load_run("MambaSpec")[0].oplog
    else:
        scenario, check = {
            "same-step-partial-hit-reads-unwritten-block": (
                pins.SYNC_LOAD_THEN_SAME_STEP_PARTIAL_HIT, own.check_no_same_step_hazard
            ),
            "full-prompt-async-load-replays-outside-window": (pins.FULL_PROMPT_ASYNC_LOAD, own.check_read_blocks_held),
        }[bug_id]
        with pytest.raises(InvariantViolation) as caught:
            run_single_shot(scenario, (check,), record=False)
        invariant, log = caught.value.invariant, caught.value.oplog
    log = shrink_oplog(log, invariant, checks=(check,))
    source = scheduler_repro(log, invariant=invariant, target="tests/known_bugs/test_ownership_findings.py",
                             seed=None, violation=bug_id)
    assert source and imports_of(source) <= ALLOWED_IMPORTS
    path = tmp_path / f"test_{bug_id.replace('-', '_')}.py"
    path.write_text(source)
    failure = run_repro(path, tmp_path, None)
    if failure is not None:
        # The file's own check fails, at the step the harness saw break.
        assert str(failure).startswith(f"step {log.steps[-1].index}:"), str(failure)
        raise _ReproStillFails(str(failure))
