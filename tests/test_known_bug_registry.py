"""The known-bug registry: every entry is pinned, and matching is structural."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fuzz.known_bugs import KNOWN_BUGS, Failure, known_bug, match, unbuildable_spec_classes

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("bug", KNOWN_BUGS, ids=lambda b: b.id)
def test_every_known_bug_names_a_pin_that_exists(bug) -> None:
    path, _, test = bug.pinned_by.partition("::")
    source = ROOT / path
    assert source.is_file(), f"{bug.id}: {path} does not exist"
    if test:
        names = {n.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
        assert test in names, f"{bug.id}: no test {test} in {path}"
    assert bug.reach in ("engine", "scheduler-api"), bug.reach
    assert bug.analysis and bug.signatures


def test_bug_ids_are_unique() -> None:
    ids = [b.id for b in KNOWN_BUGS]
    assert len(ids) == len(set(ids))


SCHEDULE = "Scheduler.schedule"
TRUNCATE = "KVCacheManager.truncate_computed_blocks"


def test_a_known_bug_is_matched_by_its_facts_on_the_releases_that_have_it() -> None:
    raised_in_pool = ("vllm/v1/core/block_pool.py:BlockPool.get_new_blocks",)
    undercount = Failure("no-exception", "ValueError", raised_in_pool, SCHEDULE)
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
    attention = Failure("no-unexpected-failure", "AssertionError", (), TRUNCATE, "SlidingWindowSpec")
    assert match(attention, "0.27.1") is None
    assert match(Failure("copy-source-ready", where=SCHEDULE), "0.27.1") is None  # before the oldest release it was seen on


def test_a_fixed_bug_is_not_known_on_the_release_that_fixed_it() -> None:
    pre_fix = Failure("no-unexpected-failure", "AssertionError", (), TRUNCATE, "MambaSpec")
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
    )
    assert match(cow, "0.28.0") is known_bug("second-full-attention-untrimmed")
    assert match(cow, "0.29.0") is None
    assert match(Failure("no-exception", "AssertionError", (), SCHEDULE), "0.28.0") is None


@pytest.mark.parametrize("kind", ["FullAttentionSpec", "MLAAttentionSpec", "HiddenStateCacheSpec", "RSWASpec"])
def test_every_full_attention_subclass_group_left_untrimmed_on_0_28_is_the_known_bug(kind: str) -> None:
    """vLLM 0.28.0's coordinator counts every FullAttentionSpec subclass as full
    attention (the 60 s campaign met hidden-state and RSWA groups so)."""
    failure = Failure("computed-adds-up", None, (), SCHEDULE, kind)
    assert match(failure, "0.28.0") is known_bug("second-full-attention-untrimmed")
    assert match(failure, "0.29.0") is None
    assert match(Failure("computed-adds-up", None, (), SCHEDULE, "SlidingWindowSpec"), "0.28.0") is None
