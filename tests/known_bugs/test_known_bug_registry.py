"""The known-bug registry: every entry is pinned, and matching is structural."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from fuzz.known_bugs import (
    KNOWN_BUGS, NO_GROUP, ONLY_STATE, REACHES, Failure, Signature, known_bug, match, signature_gaps,
    unbuildable_spec_classes,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("bug", KNOWN_BUGS, ids=lambda b: b.id)
def test_every_known_bug_names_a_pin_that_exists(bug) -> None:
    path, _, test = bug.pinned_by.partition("::")
    source = ROOT / path
    assert source.is_file(), f"{bug.id}: {path} does not exist"
    if test:
        names = {n.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
        assert test in names, f"{bug.id}: no test {test} in {path}"
    assert bug.reach in REACHES, bug.reach
    assert bug.analysis and bug.signatures


def test_every_named_sibling_is_a_planted_bug() -> None:
    """A sibling (tests/findings/test_known_bug_siblings.py) is a planted bug
    the campaign can plant (python -m fuzz run --plant NAME)."""
    from fuzz.adapter import PLANTED_SCHEDULER_BUGS

    siblings = {b.id: b.sibling for b in KNOWN_BUGS if b.sibling}
    assert siblings and all(p in PLANTED_SCHEDULER_BUGS for p in siblings.values()), siblings


def test_bug_ids_are_unique() -> None:
    ids = [b.id for b in KNOWN_BUGS]
    assert len(ids) == len(set(ids))


SCHEDULE = "Scheduler.schedule"
TRUNCATE = "KVCacheManager.truncate_computed_blocks"
POOL_DRY = 'raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")'
SHORT_GROUP = "assert num_blocks <= len(group_blocks)"
IN_TRUNCATE = ("vllm/v1/core/kv_cache_manager.py:KVCacheManager.truncate_computed_blocks",)


def test_a_known_bug_is_matched_by_its_facts_on_the_releases_that_have_it() -> None:
    raised_in_pool = ("vllm/v1/core/block_pool.py:BlockPool.get_new_blocks",)
    undercount = Failure("no-exception", "ValueError", raised_in_pool, SCHEDULE, statement=POOL_DRY)
    assert match(undercount, "0.33.0") is known_bug("mamba-external-block-undercount")
    assert match(undercount, "0.28.0") is known_bug("mamba-external-block-undercount")
    assert match(undercount, "0.26.0") is None  # before the oldest release it was seen on (0.27.1)
    # A source checkout has every open bug.
    assert match(undercount, "dev abc123 (source checkout /src)") is known_bug("mamba-external-block-undercount")


def test_an_unrelated_failure_is_never_taken_for_a_known_bug() -> None:
    # Same invariant and exception, raised elsewhere in vLLM: not the bug.
    elsewhere = Failure("no-exception", "ValueError", ("vllm/v1/core/sched/scheduler.py:Scheduler.schedule",), SCHEDULE)
    assert match(elsewhere, "0.33.0") is None
    # The pre-fix crash's invariant on a group that is not Mamba: not the bug.
    attention = Failure("no-unexpected-failure", "AssertionError", IN_TRUNCATE, TRUNCATE, "SlidingWindowSpec", statement=SHORT_GROUP)
    assert match(attention, "0.27.1") is None
    assert match(Failure("copy-source-ready", where=SCHEDULE), "0.27.1") is None  # before the oldest release it was seen on
    # The claim alone, with no group and no state, is no known bug's.
    assert match(Failure("copy-source-ready", where=SCHEDULE), "0.33.0") is None


def test_a_fixed_bug_is_not_known_on_the_release_that_fixed_it() -> None:
    pre_fix = Failure("no-unexpected-failure", "AssertionError", IN_TRUNCATE, TRUNCATE, "MambaSpec", statement=SHORT_GROUP)
    assert match(pre_fix, "0.27.1") is known_bug("pre-fix-truncate-assert")
    assert match(pre_fix, "0.28.0") is None


def test_unbuildable_spec_classes_come_from_open_bugs() -> None:
    assert "vllm.v1.kv_cache_interface.SinkFullAttentionSpec" in unbuildable_spec_classes("0.33.0")
    assert not unbuildable_spec_classes("0.27.0")  # older than any release seen with it


def test_the_0_28_untrimmed_group_is_known_through_its_cow_assert_too() -> None:
    """Seen on 0.28.0 by the state machine: the same root cause, met as an
    assertion in the copy-on-write of the untrimmed group's partial block."""
    cow = Failure(
        "no-exception",
        "AssertionError",
        ("vllm/v1/core/single_type_kv_cache_manager.py:SingleTypeKVCacheManager._apply_cow",),
        SCHEDULE,
        statement="assert req_blocks[block_idx] is source_block",
    )
    assert match(cow, "0.28.0") is known_bug("second-full-attention-untrimmed")
    # 0.27.1 (its _apply_cow and coordinator are 0.28.0's): the same bug.
    assert match(cow, "0.27.1") is known_bug("second-full-attention-untrimmed")
    assert match(cow, "0.29.0") is None
    # Another assert of the same function is not this bug.
    other = dataclasses.replace(cow, statement="assert block_idx < len(req_blocks)")
    assert match(other, "0.28.0") is None
    assert match(Failure("no-exception", "AssertionError", (), SCHEDULE), "0.28.0") is None


@pytest.mark.parametrize("kind", ["FullAttentionSpec", "MLAAttentionSpec", "HiddenStateCacheSpec", "RSWASpec"])
def test_every_full_attention_subclass_group_left_untrimmed_on_0_28_is_the_known_bug(kind: str) -> None:
    """vLLM 0.28.0's coordinator counts every FullAttentionSpec subclass as full
    attention (the 60 s campaign met hidden-state and RSWA groups so)."""
    failure = Failure("computed-adds-up", None, (), SCHEDULE, kind)
    assert match(failure, "0.28.0") is known_bug("second-full-attention-untrimmed")
    assert match(failure, "0.29.0") is None
    assert match(Failure("computed-adds-up", None, (), SCHEDULE, "SlidingWindowSpec"), "0.28.0") is None


# ---------------------------------------------------------------------------
# Signatures name the failing condition itself
# ---------------------------------------------------------------------------

SIGNATURES = [(bug, sig) for bug in KNOWN_BUGS for sig in bug.signatures]
_SIG_IDS = [f"{bug.id}-{i}" for bug in KNOWN_BUGS for i, _ in enumerate(bug.signatures)]


def _failure_showing(bug, sig) -> Failure:
    """The failure a signature describes, every field it names filled in."""
    frame = sig.innermost or sig.frame
    frames = (f"vllm/somewhere.py:{frame}",) if frame else ()
    return Failure(
        sig.invariant,
        sig.exception,
        frames,
        sig.where or "",
        None if sig.group_kind == NO_GROUP else sig.group_kind,
        sig.spec_class,
        statement=sig.statement or "",
        state="" if sig.state == ONLY_STATE else sig.state or "",
    )


def _affected(bug) -> str:
    return bug.since


# Claims whose checks name several states: a signature on one of them names
# its state, never the single-state sentinel.
_NAMED_STATES = {s.invariant for _, s in SIGNATURES if s.state not in (None, ONLY_STATE)}


@pytest.mark.parametrize(("bug", "sig"), SIGNATURES, ids=_SIG_IDS)
def test_a_signature_names_claim_group_kind_and_state(bug, sig) -> None:
    """A known bug sets aside only its own instances: every signature names
    the claim, the group kind (NO_GROUP where the claim's instances name no
    group) and the state (ONLY_STATE only where the claim has a single one)."""
    assert not signature_gaps(sig), f"{bug.id}: {sig.invariant} signature leaves {signature_gaps(sig)} unnamed"
    if sig.state == ONLY_STATE:
        assert sig.invariant not in _NAMED_STATES, f"{bug.id}: {sig.invariant} has states; name the one it is"


def test_a_signature_without_group_kind_or_state_is_rejected() -> None:
    assert signature_gaps(Signature("copy-source-ready", where=SCHEDULE)) == ["group_kind", "state"]
    assert signature_gaps(Signature("read-blocks-held", group_kind="MambaSpec")) == ["state"]
    assert signature_gaps(Signature("", group_kind=NO_GROUP, state=ONLY_STATE)) == ["invariant"]
    bare = Signature("no-exception", exception="ValueError", group_kind=NO_GROUP, state=ONLY_STATE)
    assert signature_gaps(bare) == ["statement", "innermost"]


@pytest.mark.parametrize(("bug", "sig"), SIGNATURES, ids=_SIG_IDS)
def test_a_signature_names_the_failing_statement_or_state(bug, sig) -> None:
    """A signature on a raised exception names the statement that raised it
    (a function holds many asserts); one on the liveness claim names the
    stranded state (a stall has many causes). Construction failures are
    named by their spec class instead."""
    if sig.exception is not None and sig.spec_class is None:
        assert sig.statement, f"{bug.id}: a signature on {sig.exception} must name the raising statement"
        assert sig.innermost, f"{bug.id}: a signature on {sig.exception} must name the raising function"
    if sig.invariant == "running-request-progresses":
        assert sig.state, f"{bug.id}: a stall signature must name the stranded state"


@pytest.mark.parametrize(("bug", "sig"), SIGNATURES, ids=_SIG_IDS)
def test_a_different_failure_in_the_same_function_is_new(bug, sig) -> None:
    """The failure each signature describes is its bug; the same failure
    with another statement (another assert in the same function) or another
    stranded state is not any known bug."""
    failure = _failure_showing(bug, sig)
    assert match(failure, _affected(bug)) is bug, failure
    if sig.statement:
        other = dataclasses.replace(failure, statement="assert some_other_condition")
        assert match(other, _affected(bug)) is None, other
    if sig.state:
        for state in ("output placeholders", "nothing in flight"):
            other = dataclasses.replace(failure, state=state)
            assert match(other, _affected(bug)) is None, other
    # Another group kind (or a group where the claim names none) is not it.
    other = dataclasses.replace(failure, group_kind="NoSuchSpec")
    assert match(other, _affected(bug)) is None, other
