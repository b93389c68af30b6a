"""The planted cases of the self-tests, as tables: which check catches which
planted bug, and where (a single-shot search, the state machine, a fixed
run, the speculating run, a fixed connector scenario, the truncation
target).

The self-tests parametrize over these tables
(``tests/invariants/test_*_planted.py``, ``test_connector_protocol.py``);
the repro tests (``tests/findings/``), the tooling tests and
``test_table.py`` read the same tables here.
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.adapter import FIXED_RUNS, PLANTED_OWNERSHIP_BUGS
from fuzz.runners.scheduler import Stepper
from fuzz.targets.target_scheduler import any_layout_strategy, single_shot_strategy
from invariants import connector as conn
from invariants import ownership as own
from invariants import scheduler as inv
from invariants.table import INVARIANTS
from strategies.scenarios import truncation_scenarios
from strategies.specs import kv_cache_layouts
from tests.invariants import planted_runs

# --------------------------------------------------------------------------
# The scheduler path (tests/invariants/test_scheduler_planted.py).
# --------------------------------------------------------------------------

# Planted bugs only the state machine can reach: the single-shot scenarios
# never fail a load. (check, invariant, planted bug)
MACHINE_CASES: list[tuple[Callable[..., None], str, str]] = [
    (conn.check_failed_load_recomputed, "failed-load-recomputed", "resumes_past_invalid_block"),
    (conn.check_failed_load_not_cached, "failed-load-not-cached", "evicts_invalid_blocks_on_recompute"),
    (conn.check_failed_load_recomputed, "failed-load-recomputed", "failed_async_load_kept"),
]

# Planted bugs in speculative decoding's bookkeeping, shown on a fixed run
# that speculates (check, invariant, planted bug).
SPEC_DECODE_CASES: list[tuple[Callable[..., None], str, str]] = [
    (inv.check_rejected_drafts_rolled_back, "rejected-drafts-rolled-back", "rejected_drafts_stay_computed"),
    (inv.check_kv_matches_tokens, "kv-matches-tokens", "records_first_sampled_token"),
]

# Planted bugs the single-shot search finds: every one a scheduler row of
# invariants/table.py names that no other case shows (a fixed run of
# fuzz.adapter.FIXED_RUNS, the state machine, the speculating run,
# the block-ownership cases of tests/invariants/test_ownership_planted.py,
# or the triage case drafts_never_cut). Each is shown failing the check of
# every row that names it: a new plant the search finds needs no entry here.
_SHOWN_ELSEWHERE = (
    set(FIXED_RUNS) | {bug for *_, bug in MACHINE_CASES} | {bug for *_, bug in SPEC_DECODE_CASES}
    | set(PLANTED_OWNERSHIP_BUGS) | {"drafts_never_cut"}
)
SEARCHED = tuple(dict.fromkeys(
    bug for row in INVARIANTS if row.tier == "scheduler" for bug in row.planted if bug not in _SHOWN_ELSEWHERE
))
# (check, invariant name, planted bug, search uses the evict shortcut)
CASES: list[tuple[Callable[..., None], str, str, bool]] = [
    (row.check, row.name, bug, False) for bug in SEARCHED for row in INVARIANTS
    if row.tier == "scheduler" and bug in row.planted
]

# (check, invariant name, planted bug, the fixed run called with the checks,
# the label the unmodified run carries or None)
FIXED_CASES: list[tuple[Callable[..., None], str, str, Callable[..., Stepper], str | None]] = [
    (row.check, row.name, bug, run, label) for bug, (run, label, row) in planted_runs.shown_on_runs().items()
]

# Checks shown catching a real vLLM bug instead of a planted one: unmodified
# vLLM already fails them (strict xfails and a passing control in
# tests/known_bugs/test_known_vllm_bugs_scheduler.py).
CAUGHT_REAL_BUG: dict[Callable[..., None], str] = {
    inv.check_copy_sources_ready: "same-step-cow-chain",
    # The failed-load placeholder's second consequence, pinned with a
    # synchronous control in tests/known_bugs/test_failed_load_output_placeholder.py.
    inv.check_kv_matches_tokens: "failed-sync-load-recompute-keeps-output-placeholder",
}

# --------------------------------------------------------------------------
# Block ownership (tests/invariants/test_ownership_planted.py).
# --------------------------------------------------------------------------

# Examples each ownership search may draw, and the seed it draws them from:
# the one it drew from when the search was written out in
# test_ownership_planted.py (Hypothesis's digest of that function), so the
# self-test meets the examples its limits were measured on.
OWNERSHIP_BUDGET = 300
OWNERSHIP_SEED = int("d691f47e6d5ce7b17386cc6aca02f4425398b34c4b7bc4ba07584b6d4e7120a7ac4c5f5418a6fd886e3fe7a32088396f", 16)
# (check, invariant name, planted bug, strategy factory)
OWNERSHIP_CASES: list[tuple[Callable[..., None], str, str, Callable[[], object]]] = [
    (own.check_read_blocks_held, "read-blocks-held", "mamba_frees_resume_state", single_shot_strategy),
    (own.check_no_same_step_hazard, "same-step-hazard", "mamba_adopts_same_step_state", single_shot_strategy),
    (own.check_reservation_covers_allocation, "reservation-covers-allocation", "cow_block_not_reserved", single_shot_strategy),
    # The same claim summed over groups (each group within its own count):
    # a -1 only hides something beside a group that takes a block in the same
    # call, on differing block sizes (the any-layout mix meets it in ~40
    # examples, the hybrid one in ~500).
    (own.check_reservation_covers_allocation, "reservation-covers-allocation", "mamba_count_goes_negative", any_layout_strategy),
    (own.check_lookup_within_limit, "lookup-within-limit", "lookup_rounds_limit_up", single_shot_strategy),
]

# --------------------------------------------------------------------------
# The KV-connector protocol on fixed scenarios (tests/invariants/test_connector_protocol.py).
# --------------------------------------------------------------------------

# (check, invariant, planted bug, scenario)
CONNECTOR_CASES: list[tuple[Callable[..., None], str, str, str]] = [
    (conn.check_external_range_contiguous, "external-contiguous", "asks_connector_unaligned", "sync-load-truncates-tail"),
    (conn.check_told_external_accounted, "told-external-accounted", "tells_connector_total", "sync-load-truncates-tail"),
    (conn.check_load_blocks_cover_range, "load-blocks-cover", "hands_connector_cached_blocks", "sync-load-truncates-tail"),
    (conn.check_dropped_answer_loads_nothing, "dropped-answer-loads-nothing", "keeps_tail_and_loads", "tail-kept-answer-dropped"),
    (conn.check_meta_built_once, "meta-built-once", "skips_meta_on_empty_step", "async-load-partial"),
    (conn.check_meta_names_scheduled, "meta-names-scheduled", "async_load_counted_scheduled", "async-load-partial"),
    (conn.check_sync_load_announced, "sync-load-announced", "no_sync_load_flag", "sync-load-truncates-tail"),
    (conn.check_async_load_lands_first, "async-load-lands-first", "async_load_computes_at_once", "async-load-partial"),
    (conn.check_finished_once, "finished-once", "connector_finished_twice", "sync-load-truncates-tail"),
    (conn.check_hand_off_names_computed_blocks, "hand-off-names-computed-blocks", "hands_off_one_block_short",
     "sync-load-truncates-tail"),
    (conn.check_failed_load_recomputed, "failed-load-recomputed", "resumes_past_invalid_block", "sync-load-fails-recompute"),
    (conn.check_failed_load_recomputed, "failed-load-recomputed", "failed_async_load_kept", "async-load-fails-recompute"),
    (conn.check_failed_load_not_cached, "failed-load-not-cached", "evicts_invalid_blocks_on_recompute", "sync-load-fails-fail"),
    (conn.check_failed_load_not_cached, "failed-load-not-cached", "failed_async_load_kept", "async-load-fails-recompute"),
]

# --------------------------------------------------------------------------
# The truncation target (tests/invariants/test_truncation_planted.py).
# --------------------------------------------------------------------------

HYBRID = truncation_scenarios()
# Scratch groups only appear among the "other" kinds; force one in.
WITH_SCRATCH = truncation_scenarios(
    layouts=kv_cache_layouts(
        min_groups=3, max_groups=4, required=("FullAttentionSpec", "MambaSpec", "CircularBufferSpec")
    )
)

# The EAGLE plant differs from vLLM only when the manager speculates.
SPECULATING = truncation_scenarios(eagle="always")

# (planted bug, invariant, scenarios)
TRUNCATION_CASES = [
    ("pre_fix_assert_all", "no-unexpected-failure", HYBRID),
    ("blanket_min", "must-cover", HYBRID),
    ("mutates_input", "input-unchanged", HYBRID),
    ("touches_refcounts", "refcounts-unchanged", HYBRID),
    ("no_alignment_check", "misaligned-rejected", HYBRID),
    ("mamba_keeps_all", "whole-state-clamped", HYBRID),
    ("shifted_view", "prefix-view", HYBRID),
    ("scratch_gets_null", "scratch-empty", WITH_SCRATCH),
    ("leaks_block", "pool-unchanged", HYBRID),
    # Only scenarios that speculate with an EAGLE-style drafter can find it.
    ("eagle_drops_again", "must-cover", SPECULATING),
]
