"""The known bugs written as vLLM tests (``upstream/``, laid out as vLLM's
``tests/`` tree), run inside vLLM's own tests tree: each bug test fails on
its assertion on a release that has the bug, and each control passes.

Each file is what an upstream report carries: vLLM's own helpers, a few
concrete steps, an assertion of the correct behaviour naming the requests,
blocks and counts. All files run in one pytest subprocess
(:func:`fuzz.upstream.run_in_tree`); without the tree the run skips with
the command that fetches it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fuzz.adapter import VLLM_VERSION
from fuzz.known_bugs import KNOWN_BUGS, known_bug
from fuzz.upstream import SKIP_REASON, TreeOutcome, run_in_tree, tests_tree

UPSTREAM = Path(__file__).resolve().parent / "upstream"
MAX_LINES = 150

# Bug id -> (file under upstream/, its bug test, its control test).
WRITTEN: dict[str, tuple[str, str, str]] = {
    "reset-running-fails-on-deferred-frees": (
        "v1/core/test_reset_running_fails_on_deferred_frees.py",
        "test_reset_running_requests_with_deferred_frees",
        "test_reset_running_requests_without_deferred_frees",
    ),
    "spec-decode-padding-cut-by-long-prefill-threshold": (
        "v1/core/test_spec_decode_padding_cut_by_long_prefill_threshold.py",
        "test_threshold_below_padded_spec_decode_size",
        "test_threshold_holds_padded_spec_decode_size",
    ),
    "abort-during-failed-sync-load-keeps-invalid-blocks-cached": (
        "v1/kv_connector/unit/test_abort_during_failed_sync_load_keeps_invalid_blocks_cached.py",
        "test_abort_during_failed_sync_load_evicts_invalid_blocks",
        "test_failed_sync_load_evicts_invalid_blocks",
    ),
    "failed-sync-load-recompute-keeps-output-placeholder": (
        "v1/core/test_failed_sync_load_recompute_keeps_output_placeholder.py",
        "test_async_recompute_after_failed_sync_load_finishes",
        "test_sync_recompute_after_failed_sync_load_finishes",
    ),
    "failed-async-load-keeps-own-reservation": (
        "v1/core/test_failed_async_load_keeps_own_reservation.py",
        "test_failed_async_load_readmitted_on_a_pool_that_holds_it",
        "test_failed_async_load_readmitted_on_a_roomy_pool",
    ),
    "encoder-output-held-past-failed-load-rollback": (
        "v1/core/test_encoder_output_held_past_failed_load_rollback.py",
        "test_rollback_below_two_images_finishes",
        "test_rollback_below_one_image_finishes",
    ),
    "mamba-failed-load-rollback": (
        "v1/kv_connector/unit/test_mamba_failed_load_rollback.py",
        "test_failed_sync_load_on_mamba_resumes_where_a_state_exists",
        "test_failed_sync_load_on_full_attention_resumes_at_its_first_failed_block",
    ),
    "mamba-rollback-over-in-flight-step": (
        "v1/kv_connector/unit/test_mamba_rollback_over_in_flight_step.py",
        "test_async_rollback_over_a_step_in_flight_keeps_a_state_block",
        "test_sync_rollback_lays_the_recompute_out_afresh",
    ),
    "partial-event-names-unannounced-parent": (
        "v1/core/test_partial_event_names_unannounced_parent.py",
        "test_partial_entry_past_a_hash_unit_names_an_announced_parent",
        "test_partial_entry_one_hash_unit_past_a_block_is_chained",
    ),
    "full-prompt-async-load-replays-outside-window": (
        "v1/core/test_full_prompt_async_load_replays_outside_window.py",
        "test_recompute_after_a_full_prompt_async_load_reads_held_blocks",
        "test_first_token_after_a_partial_async_load_reads_held_blocks",
    ),
    "second-attention-group-lags-divergent-connector-hit": (
        "v1/kv_connector/unit/test_second_attention_group_lags_divergent_connector_hit.py",
        "test_lagging_second_attention_group_with_divergent_hits",
        "test_lagging_second_attention_group_reconciled_without_divergent_hits",
    ),
    "eagle-window-aligns-before-drop": (
        "v1/core/test_eagle_window_aligns_before_drop.py",
        "test_window_longer_than_the_prefix_serves_the_hit",
        "test_window_whose_search_finds_its_run_serves_the_hit",
    ),
    "eagle-resend-drops-proven-block": (
        "v1/core/test_eagle_resend_drops_proven_block.py",
        "test_single_group_keeps_the_block_the_next_one_proves",
        "test_hybrid_coordinator_keeps_the_block_the_next_one_proves",
    ),
    "same-step-cow-chain": (
        "v1/core/test_same_step_cow_chain.py",
        "test_two_requests_sharing_a_partial_hit_copy_from_written_blocks",
        "test_one_request_on_a_partial_hit_copies_from_a_cached_block",
    ),
    "full-block-past-hybrid-hit-unused": (
        "v1/core/test_full_block_past_hybrid_hit_unused.py",
        "test_cached_full_block_serves_a_hit_inside_it",
        "test_second_group_whose_blocks_end_at_the_hit_serves_it",
    ),
    "mamba-checkpoint-chunk-skips-boundary-state": (
        "v1/core/test_mamba_checkpoint_chunk_skips_boundary_state.py",
        "test_chunk_resuming_mid_block_with_checkpoints_writes_the_boundary_state",
        "test_chunk_resuming_mid_block_without_checkpoints_stops_at_the_boundary",
    ),
    "same-step-partial-hit-reads-unwritten-block": (
        "v1/kv_connector/unit/test_same_step_partial_hit_reads_unwritten_block.py",
        "test_partial_hit_admitted_with_a_sync_load_copies_written_tokens",
        "test_partial_hit_admitted_after_the_load_copies_written_tokens",
    ),
    "eagle-verification-survives-shrink": (
        "v1/core/test_eagle_verification_survives_shrink.py",
        "test_window_group_keeps_only_a_block_the_next_entry_proves",
        "test_flagged_draft_groups_keep_only_proven_blocks",
    ),
    "sink-full-attention-manager-init": (
        "v1/core/test_sink_full_attention_manager_init.py",
        "test_sink_full_attention_group_builds_a_manager",
        "test_plain_full_attention_group_builds_a_manager",
    ),
    "mamba-external-block-undercount": (
        "v1/kv_connector/unit/test_mamba_external_block_undercount.py",
        "test_sync_external_load_into_a_pool_one_block_short_waits",
        "test_sync_external_load_into_a_pool_that_fits_takes_seven_blocks",
    ),
}

# Open bugs with no file here, and why.
NOT_WRITTEN: dict[str, str] = {}


def _source(rel: str) -> str:
    return (UPSTREAM / rel).read_text()


@pytest.fixture(scope="module")
def outcomes() -> dict[str, TreeOutcome]:
    if tests_tree() is None:
        pytest.skip(SKIP_REASON)
    return run_in_tree({rel: _source(rel) for rel, _, _ in WRITTEN.values()})


def test_every_open_bug_is_written_or_excused() -> None:
    open_ids = {b.id for b in KNOWN_BUGS if b.fixed_in is None}
    assert not set(WRITTEN) & set(NOT_WRITTEN)
    assert open_ids == set(WRITTEN) | set(NOT_WRITTEN), open_ids ^ (set(WRITTEN) | set(NOT_WRITTEN))


def test_every_file_is_in_the_table() -> None:
    files = {str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("test_*.py")}
    assert files == {rel for rel, _, _ in WRITTEN.values()}


def test_the_readme_shows_one_file_in_full() -> None:
    """The README quotes one of these files; the quote is the file as it is."""
    readme = (UPSTREAM.parents[2] / "README.md").read_text()
    quoted = [block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "pytest.mark.cpu_test" in block]
    assert len(quoted) == 1, "the README quotes no upstream-form file (or several)"
    assert quoted[0] in {_source(rel) for rel, _, _ in WRITTEN.values()}, "the README's quote differs from every file"


@pytest.mark.parametrize("bug_id", sorted(WRITTEN))
def test_a_file_names_its_bug_and_stays_short(bug_id: str) -> None:
    rel, bug_test, control = WRITTEN[bug_id]
    source = _source(rel)
    tree = ast.parse(source)
    docstring = ast.get_docstring(tree) or ""
    assert f"bug id {bug_id}" in " ".join(docstring.lower().split()), f"{rel}: its docstring does not name {bug_id}"
    assert "Upstream" in docstring, f"{rel}: its docstring says nothing of upstream reports"
    assert "pytestmark = pytest.mark.cpu_test" in source
    tests = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    assert tests == {bug_test, control}, tests
    assert len(source.splitlines()) <= MAX_LINES, f"{rel}: {len(source.splitlines())} lines"


@pytest.mark.slow
@pytest.mark.parametrize("bug_id", sorted(WRITTEN))
def test_in_vllms_tree_the_bug_fails_on_its_assertion_and_the_control_passes(
    outcomes: dict[str, TreeOutcome], bug_id: str
) -> None:
    rel, bug_test, control = WRITTEN[bug_id]
    bug, ok = outcomes[f"tests/{rel}::{bug_test}"], outcomes[f"tests/{rel}::{control}"]
    assert ok == TreeOutcome("passed"), f"control {control}: {ok}"
    if known_bug(bug_id).affects(VLLM_VERSION):
        assert bug.outcome == "failed" and bug.message.startswith("AssertionError: "), f"{bug_test}: {bug}"
    else:  # fixed in this release: the claim holds
        assert bug == TreeOutcome("passed"), f"{bug_test}: {bug}"
