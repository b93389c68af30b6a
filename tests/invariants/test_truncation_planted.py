"""Each truncation invariant catches a planted bug; unmodified vLLM passes.

A planted bug swaps ``KVCacheManager.truncate_computed_blocks`` for a wrong
variant (see ``fuzz.adapter.PLANTED_TRUNCATE_BUGS``) for the test's duration.
The property target must then fail with the invariant named here.
"""

from __future__ import annotations

import pytest

from fuzz import adapter
from fuzz.hunting import hunt
import functools

from fuzz.targets.target_truncate import check_truncation_scenario
from invariants.truncation import TRUNCATION_CHECKS
from strategies.scenarios import truncation_scenarios
from tests.invariants.planted_cases import HYBRID
from tests.invariants.planted_cases import TRUNCATION_CASES as PLANTED


def test_the_eagle_plant_needs_the_eagle_draws() -> None:
    """Without EAGLE draws the same search cannot see the EAGLE plant: what
    finds it is the strategy change, not some other path."""
    only_must_cover = functools.partial(check_truncation_scenario, only="must-cover")
    with adapter.planted_truncate_bug("eagle_drops_again"):
        result = hunt(only_must_cover, truncation_scenarios(eagle="never"), max_examples=300, seed=0)
    assert not result.found, str(result.violation)


def test_every_planted_bug_and_every_invariant_has_a_test() -> None:
    assert sorted(b for b, _, _ in PLANTED) == sorted(adapter.PLANTED_TRUNCATE_BUGS)
    assert sorted({i for _, i, _ in PLANTED}) == sorted(TRUNCATION_CHECKS)


@pytest.mark.parametrize(("bug", "invariant", "scenarios"), PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_truncation_bug_is_found(bug: str, invariant: str, scenarios) -> None:
    """The named check alone catches the bug (so no other check is needed for it)."""
    only_this_check = functools.partial(check_truncation_scenario, only=invariant)
    with adapter.planted_truncate_bug(bug):
        result = hunt(only_this_check, scenarios, max_examples=1500, seed=0)
    assert result.found, f"planted bug {bug!r} survived {result.examples} examples"
    assert result.violation.invariant == invariant, str(result.violation)


def test_unplanted_vllm_passes_the_same_budget() -> None:
    result = hunt(check_truncation_scenario, HYBRID, max_examples=1000, seed=0)
    assert not result.found, str(result.violation)


def test_the_pre_fix_crash_shrinks_to_the_seed_shape() -> None:
    """Shrunk, the pre-fix failure is the seed's: FA + Mamba, Mamba short."""
    with adapter.planted_truncate_bug("pre_fix_assert_all"):
        result = hunt(check_truncation_scenario, HYBRID, max_examples=1500, seed=0, shrink=True)
    assert result.found
    message = str(result.violation)
    assert "MambaSpec" in message and "short whole-state groups" in message, message


def test_the_seed_scenario_is_pinned_and_catches_the_pre_fix_crash() -> None:
    """The seed's case, replayed outside Hypothesis: passes on vLLM 0.33.0 and
    fails under the planted pre-fix assert."""
    from fuzz.targets.target_truncate import SEED_PR_51468
    from fuzz.model import InvariantViolation

    check_truncation_scenario(SEED_PR_51468)
    with adapter.planted_truncate_bug("pre_fix_assert_all"):
        with pytest.raises(InvariantViolation, match="no-unexpected-failure"):
            check_truncation_scenario(SEED_PR_51468)


def test_the_failing_run_travels_with_the_violation() -> None:
    """The writer reads the failing run from the violation itself: a later
    run in the same process changes nothing, and a violation that carries
    no run gets no file."""
    import dataclasses

    from fuzz.model import InvariantViolation
    from fuzz.targets.target_truncate import SEED_PR_51468
    from fuzz.upstream import truncation_repro_of_failure

    with adapter.planted_truncate_bug("pre_fix_assert_all"):
        with pytest.raises(InvariantViolation) as caught:
            check_truncation_scenario(SEED_PR_51468)
    failure = caught.value
    check_truncation_scenario(dataclasses.replace(SEED_PR_51468, prefill_chunk=32))  # another run, after it
    assert failure.truncation_run is not None and failure.truncation_run[0] is SEED_PR_51468
    written = truncation_repro_of_failure(failure, failure.invariant)
    assert written is not None and "chunk=16" in written[1], written
    assert written[0] == "v1/core/test_truncate_computed_blocks_no_unexpected_failure.py", written[0]
    assert truncation_repro_of_failure(InvariantViolation(failure.invariant, "no run"), failure.invariant) is None


def _fails_planted_passes_unplanted(source: str, bug: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``source`` fails while ``bug`` is planted and passes on unmodified
    vLLM; it imports vLLM, pytest and torch only."""
    import ast

    roots = {(n.module or "").split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    roots |= {a.name.split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
    assert roots <= {"vllm", "pytest", "torch"}, roots
    repro = tmp_path / f"test_{bug}.py"
    repro.write_text(source)
    args = ["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null", str(repro)]
    with adapter.planted_truncate_bug(bug):
        assert pytest.main(args) == 1, source
    assert pytest.main(args) == 0, source


@pytest.mark.parametrize(("bug", "invariant", "scenarios"), PLANTED, ids=[p[0] for p in PLANTED])
def test_each_planted_bug_s_repro_fails_planted_and_passes_unplanted(bug: str, invariant: str, scenarios,
                                                                       tmp_path) -> None:
    """Shrunk, each plant's finding is written as a short test in vLLM's
    idiom (the manager built with vLLM's classes, the concrete hit, one
    truncate_computed_blocks call): it fails on the plant, passes unplanted."""
    from fuzz.upstream import truncation_repro_of_failure

    only_this_check = functools.partial(check_truncation_scenario, only=invariant)
    with adapter.planted_truncate_bug(bug):
        result = hunt(only_this_check, scenarios, max_examples=1500, seed=0, shrink=True)
    assert result.found
    written = truncation_repro_of_failure(result.violation, invariant)
    assert written is not None
    source = written[1]
    assert "truncate_computed_blocks(hit, " in source and len(source.splitlines()) <= 80, source
    if bug == "eagle_drops_again":  # the manager is built as the scheduler builds it for a drafter
        assert "use_eagle=True" in source, source
    _fails_planted_passes_unplanted(source, bug, tmp_path)


def test_a_repro_without_a_drafter_does_not_mention_eagle() -> None:
    """Scenarios without speculative decoding keep their repro as it was."""
    from fuzz.model import TruncationObservation
    from fuzz.targets.target_truncate import SEED_PR_51468
    from fuzz.upstream import truncation_repro

    obs = TruncationObservation(
        endpoint=0, groups=(), error=None, tuple_obj_id_before=0, tuple_obj_id_after=0,
        free_blocks_before=0, free_blocks_after=0, vllm_version=adapter.VLLM_VERSION,
    )
    source = truncation_repro(SEED_PR_51468, obs, invariant="must-cover")
    assert "eagle" not in source.lower(), source
