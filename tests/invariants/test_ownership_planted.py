"""Every block-ownership invariant catches a bug planted in vLLM's block
bookkeeping, and only that invariant does.

Each case plants one bug (:func:`fuzz.adapter.planted_scheduler_bug` with an
ownership edit: one method of vLLM's single-type KV-cache managers
recompiled from its own source with one small edit), runs the single-shot
fuzzer with only the invariant under test enabled, and expects that
invariant to fail. The failing scenario is then replayed twice: with the bug
still planted and every *other* ownership check on, where none fails (the
planted bug breaks one rule), and on unmodified vLLM with the invariant
under test, where it passes (the failure is the planted bug's).

Then: a known vLLM bug does not blind the model. With the known same-step
copy-on-write chain present in a step, a planted hazard of another kind (a
Mamba state adopted in the step it is written) is still reported.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from fuzz.adapter import PLANTED_OWNERSHIP_BUGS, planted_scheduler_bug
from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SpecDraw
from fuzz.runners.scheduler import run_single_shot, triage
from fuzz.targets import target_scheduler
from invariants import ownership as own
from invariants.scheduler import STEP_CHECKS
from tests.invariants.planted_cases import OWNERSHIP_BUDGET, OWNERSHIP_SEED
from tests.invariants.planted_cases import OWNERSHIP_CASES as CASES
from tests.known_bugs.runs import shared_partial_hit_step
from tests.support.harnesses import harness_of
from tests.support.search import planted_failure

SEARCH = settings(
    max_examples=OWNERSHIP_BUDGET,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],  # the first failure is enough; no shrinking
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize(
    ("check", "invariant", "bug", "strategy"),
    CASES,
    ids=[f"{name}<-{bug}" for _, name, bug, _ in CASES],
)
def test_ownership_invariant_catches_planted_bug(
    check: Callable[..., None], invariant: str, bug: str, strategy: Callable[[], object]
) -> None:
    violation, scenario = planted_failure(bug, strategy(), settings=SEARCH, checks=(check,), seed=OWNERSHIP_SEED)
    assert violation.invariant == invariant, str(violation)
    # Only this check: with the bug still planted, the other ownership
    # checks pass the same scenario.
    others = tuple(c for c in own.OWNERSHIP_CHECKS if c is not check)
    with planted_scheduler_bug(bug):
        run_single_shot(scenario, others, record=False)
    # The same scenario on unmodified vLLM satisfies the invariant.
    run_single_shot(scenario, (check,), record=False)


@pytest.mark.parametrize(
    ("bug", "invariant"),
    [("mamba_frees_resume_state", "read-blocks-held"), ("cow_block_not_reserved", "reservation-covers-allocation")],
)
def test_state_machine_checks_ownership_every_step(bug: str, invariant: str) -> None:
    """The state machine's step loop runs the ownership checks too (here
    alone, so the planted bug is not met first by an admission or connector
    check: mamba_frees_resume_state also hands the connector a null state
    block, which load-blocks-cover reports)."""
    machine_search = settings(SEARCH, max_examples=200, stateful_step_count=30)
    with (
        target_scheduler.checks_for_machine(own.OWNERSHIP_CHECKS),
        planted_scheduler_bug(bug),
        pytest.raises(InvariantViolation) as caught,
    ):
        run_state_machine_as_test(target_scheduler.SchedulerMachine, settings=machine_search)
    assert caught.value.invariant == invariant, str(caught.value)


def test_every_ownership_check_has_a_planted_case() -> None:
    assert {c for c, *_ in CASES} == set(own.OWNERSHIP_CHECKS)
    assert {bug for _, _, bug, _ in CASES} == set(PLANTED_OWNERSHIP_BUGS)
    assert set(own.OWNERSHIP_CHECKS) <= set(STEP_CHECKS)  # they run after every step


# --------------------------------------------------------------------------
# Known bugs do not blind the model.
# --------------------------------------------------------------------------
def test_the_known_cow_chain_alone_is_set_aside() -> None:
    """Control: on unmodified vLLM the step shows only the known bug, to the
    old check and to the ownership model alike; vLLM's Mamba guard defers
    the second request on the other root to the next step."""
    step = shared_partial_hit_step(2, second_root=True)
    hazards = list(own.check_no_same_step_hazard.violations(step))
    assert hazards and all(v.group_kind == "FullAttentionSpec" for v in hazards), step.describe()
    assert triage(step) == ([], ["same-step-cow-chain"]), step.describe()


def test_a_different_same_step_hazard_beside_the_known_chain_is_reported() -> None:
    """With the Mamba same-step guard planted away, the second request also
    adopts the Mamba state the first writes in the same step: the known
    chain is still labelled, and the Mamba hazard is reported, beside the
    contents model's view of it (the state is read before it is written)."""
    with planted_scheduler_bug("mamba_adopts_same_step_state"):
        step = shared_partial_hit_step(2, second_root=True)
    unknown, known = triage(step)
    assert "same-step-cow-chain" in known, step.describe()
    assert [(v.invariant, v.group_kind) for v in unknown if v.invariant != "reads-written"] == [
        ("same-step-hazard", "MambaSpec")
    ], [str(v) for v in unknown]
    reads = [str(v) for v in unknown if v.invariant == "reads-written"]
    assert len(reads) == 1 and "a Mamba group reads the state at its start" in reads[0], reads


def test_a_negative_count_that_hides_nothing_is_no_violation() -> None:
    """Control for the summed reservation claim: after a failed sync load on
    a lone Mamba group (the known rollback, tests/known_bugs/), the next
    allocate_slots counts -1 blocks and takes none. The free-block check
    compares the sum with a pool that is never negative, so nothing is hidden;
    the planted ``mamba_count_goes_negative`` case above (a -1 beside a group
    that takes blocks) is what the claim is for."""
    layout = LayoutDraw((SpecDraw("MambaSpec", 4),), hash_block_size=4, num_blocks=32)
    harness = harness_of(layout, batch=32, kv_load_failure_policy="recompute")
    harness.add_request(tuple(range(100, 116)), max_tokens=1, reply=ExternalReply("store", store_len=12))
    harness.fail_next_sync_loads()
    steps = harness.drain()
    allocations = [a for s in steps if s.ownership for a in s.ownership.allocations]
    assert any(a.counted == (-1,) and a.taken == (0,) for a in allocations), allocations
    summed = [
        str(v)
        for s in steps
        for v in own.check_reservation_covers_allocation.violations(s)
        if "in all" in str(v)
    ]
    assert summed == [], summed


def test_a_speculating_mamba_group_is_read_where_vllm_keeps_its_running_state() -> None:
    """Harness misfit found by the campaign (2026-12-02, read-blocks-held on a
    lone Mamba group with 4 speculative state blocks, ngram k=4, every draft
    rejected): vLLM keeps the running state in the first of the table's last
    1 + k blocks (MambaManager.allocate_new_blocks), which is past
    ceil(end/b) - 1 once an earlier step over-allocated for drafts. Here r1
    (4-token prompt) decodes one token per step with rejected drafts: at step
    3 it computes [5, 6) with a 7-block table whose index 1 (the old rule's
    claim) is the null block and index 2 holds the state."""
    layout = LayoutDraw(
        (SpecDraw("MambaSpec", 4, (("num_speculative_blocks", 4),)),), hash_block_size=1, num_blocks=19, max_model_len=44
    )
    harness = harness_of(layout, batch=8, seqs=2, long_prefill_token_threshold=1,
                         speculative_method="ngram", num_speculative_tokens=4, draft_acceptance=(0,))
    harness.add_request([0, 7, 3128, 3129], max_tokens=3)
    steps = [harness.step(), harness.step()]
    harness.add_request([0, 7, 14, 21, 3192, 3193], max_tokens=1)
    steps.append(harness.step())
    for step in steps:
        own.check_read_blocks_held(step)
    assert steps[-1].ownership is not None
    row = steps[-1].ownership.table_of("r0")
    assert row is not None and (row.computed_before, row.num_scheduled) == (5, 1), row
    (table,) = row.tables
    null = steps[-1].ownership.null_block_id
    old_claim = 1  # ceil(end / block_size) - 1, the rule before the table length was read
    assert table[old_claim] == null, table
    assert own.read_indices(("state", 4), 4, 5, 6, 4, len(table)) == [len(table) - 5] != [old_claim]
