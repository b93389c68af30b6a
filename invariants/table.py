"""Every invariant in one table: its name, its check, the planted bugs that
show it failing.

The check tuples the runners use (:data:`invariants.scheduler.STEP_CHECKS`,
:data:`~invariants.scheduler.ADMISSION_CHECKS`,
:data:`invariants.truncation.TRUNCATION_CHECKS`) keep their order, which
decides what a step reports first; this table is what a contributor reads
and extends: a new invariant is one ``check_*`` function, one row here and
one planted case (``tests/invariants/test_table.py`` holds the table to the
check tuples, the planted bugs and the repro writer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from invariants import cache
from invariants import connector as conn
from invariants import contents
from invariants import encoder
from invariants import fate
from invariants import handoff
from invariants import hits
from invariants import ownership as own
from invariants import promises as prom
from invariants import scheduler as sched
from invariants import truncation as trunc

__all__ = ["INVARIANTS", "Invariant", "invariant"]


@dataclass(frozen=True)
class Invariant:
    """One claim.

    * ``name``: what :attr:`fuzz.model.InvariantViolation.invariant` says;
    * ``tier``: ``"truncation"`` (one ``truncate_computed_blocks`` call) or
      ``"scheduler"`` (``schedule()`` with a KV connector);
    * ``check``: the ``check_*`` function that makes it;
    * ``planted``: the planted bugs (:data:`fuzz.adapter.PLANTED_TRUNCATE_BUGS`
      or :data:`fuzz.adapter.PLANTED_SCHEDULER_BUGS`) its self-tests show it
      catching;
    * ``real_bug``: for a claim unmodified vLLM already fails, the open entry
      of :data:`fuzz.known_bugs.KNOWN_BUGS` that shows it failing instead;
    * ``repro``: the standalone repro that retired with issue 48 could state
      it; a scheduler replay without checks of its own
      (:func:`fuzz.repro.shrink.replay_violation`) still checks these rows;
    """

    name: str
    tier: str
    check: Callable[..., None]
    planted: tuple[str, ...]
    repro: bool
    real_bug: str | None = None


def _t(name: str, check: Callable[..., None], *planted: str, repro: bool) -> Invariant:
    return Invariant(name, "truncation", check, planted, repro)


def _s(name: str, check: Callable[..., None], *planted: str, real_bug: str | None = None, repro: bool = True) -> Invariant:
    return Invariant(name, "scheduler", check, planted, repro, real_bug)


INVARIANTS: tuple[Invariant, ...] = (
    # truncate_computed_blocks (invariants/truncation.py).
    _t("must-cover", trunc.check_must_cover_groups_cover_endpoint, "blanket_min", "eagle_drops_again", repro=True),
    _t("whole-state-clamped", trunc.check_whole_state_groups_clamped, "mamba_keeps_all", repro=True),
    _t("no-unexpected-failure", trunc.check_no_unexpected_failure, "pre_fix_assert_all", repro=True),
    _t("prefix-view", trunc.check_output_is_prefix_of_input, "shifted_view", repro=True),
    _t("input-unchanged", trunc.check_input_lists_unchanged, "mutates_input", repro=False),
    _t("refcounts-unchanged", trunc.check_refcounts_and_hashes_unchanged, "touches_refcounts", repro=False),
    _t("pool-unchanged", trunc.check_pool_free_count_unchanged, "leaks_block", repro=False),
    _t("scratch-empty", trunc.check_scratch_groups_stay_empty, "scratch_gets_null", repro=True),
    _t("misaligned-rejected", trunc.check_misaligned_endpoint_rejected, "no_alignment_check", repro=True),
    # One scheduler step (invariants/scheduler.py).
    _s("no-exception", sched.check_no_exception_escapes, "pre_fix_assert_all"),
    _s("no-leaked-blocks", sched.check_no_leaked_blocks, "truncate_touches_refcounts"),
    _s("computed-below-num-tokens", sched.check_computed_below_num_tokens, "reports_external_twice"),
    _s("copy-source-ready", sched.check_copy_sources_ready, real_bug="same-step-cow-chain"),
    _s("stale-output-dropped", sched.check_stale_output_dropped, "delivers_stale_output"),
    _s("rejected-drafts-rolled-back", sched.check_rejected_drafts_rolled_back, "rejected_drafts_stay_computed"),
    _s("running-request-progresses", sched.check_running_requests_progress, "max_tokens_skip_unguarded"),
    # Every request's fate (invariants/fate.py).
    _s("request-in-one-place", fate.check_request_in_one_place, "lost_when_pool_full", repro=False),
    _s("unblocked-request-admitted", fate.check_unblocked_request_admitted, "deferred_requests_take_slots",
       repro=False),
    _s(
        "kv-matches-tokens",
        sched.check_kv_matches_tokens,
        "records_first_sampled_token",
        real_bug="failed-sync-load-recompute-keeps-output-placeholder",
    ),
    # One admission (invariants/scheduler.py).
    _s("computed-adds-up", sched.check_computed_tokens_add_up, "skip_truncation"),
    _s("local-part-covered", sched.check_local_part_covered, "truncation_one_block_short"),
    _s("truncated-view", sched.check_truncated_view, "skip_truncation"),
    _s("mamba-state-at-boundary", sched.check_mamba_state_at_resume_boundary, "no_divergent_fallback"),
    _s("diverged-falls-back", sched.check_diverged_hit_falls_back, "fallback_discards_hit"),
    _s(
        "skip-reads-no-cache",
        sched.check_skipping_request_reads_no_cache,
        "skipping_request_loads_external",
        "skipping_request_reads_local_cache",
    ),
    # The KV-connector protocol (invariants/connector.py).
    _s("external-contiguous", conn.check_external_range_contiguous, "asks_connector_unaligned"),
    _s("load-blocks-cover", conn.check_load_blocks_cover_range, "hands_connector_cached_blocks"),
    _s("dropped-answer-loads-nothing", conn.check_dropped_answer_loads_nothing, "keeps_tail_and_loads"),
    _s("told-external-accounted", conn.check_told_external_accounted, "tells_connector_total"),
    _s("meta-built-once", conn.check_meta_built_once, "skips_meta_on_empty_step"),
    _s("meta-names-scheduled", conn.check_meta_names_scheduled, "async_load_counted_scheduled"),
    _s("sync-load-announced", conn.check_sync_load_announced, "no_sync_load_flag"),
    _s("async-load-lands-first", conn.check_async_load_lands_first, "async_load_computes_at_once"),
    _s("finished-once", conn.check_finished_once, "connector_finished_twice"),
    _s("hand-off-names-computed-blocks", handoff.check_hand_off_names_computed_blocks, "hands_off_one_block_short",
       repro=False),
    _s(
        "failed-load-recomputed",
        conn.check_failed_load_recomputed,
        "resumes_past_invalid_block",
        "failed_async_load_kept",
    ),
    _s(
        "failed-load-not-cached",
        conn.check_failed_load_not_cached,
        "evicts_invalid_blocks_on_recompute",
        "failed_async_load_kept",
    ),
    # Block ownership (invariants/ownership.py).
    _s("read-blocks-held", own.check_read_blocks_held, "mamba_frees_resume_state"),
    _s("same-step-hazard", own.check_no_same_step_hazard, "mamba_adopts_same_step_state"),
    _s(
        "reservation-covers-allocation",
        own.check_reservation_covers_allocation,
        "cow_block_not_reserved",
        "mamba_count_goes_negative",
    ),
    _s("lookup-within-limit", own.check_lookup_within_limit, "lookup_rounds_limit_up"),
    # What the blocks hold (fuzz/adapter/_contents.py).
    _s("reads-written", sched.check_reads_written, "partial_hit_shares_its_block", "mamba_adopts_same_step_state",
       "hash_ignores_parent"),
    _s("index-written", sched.check_index_written, "caches_async_load_early", "mamba_tail_state_overwritten"),
    _s("index-names-its-prefix", contents.check_index_names_its_prefix, "evicted_key_stays_indexed"),
    _s("encoder-outputs-held", encoder.check_encoder_outputs_held, "encoder_entry_stays_freeable", repro=False),
    _s("keys-name-one-prefix", contents.check_keys_name_one_prefix, "hash_ignores_parent"),
    # What the cache promises (invariants/promises.py).
    _s("lookahead-allocated", prom.check_lookahead_allocated, "lookahead_not_allocated"),
    _s("in-flight-reads-held", prom.check_in_flight_reads_held, "window_frees_in_flight"),
    _s("hits-within-namespace", prom.check_hits_within_namespace, "cache_salt_not_hashed", "lora_not_hashed",
       "embeds_not_hashed", "mm_not_hashed"),
    _s("hits-after-reset", prom.check_hits_after_reset, "reset_keeps_index"),
    _s("events-replay-index", prom.check_events_replay_index, "eviction_announces_nothing", "reset_announces_nothing"),
    _s(
        "events-chain",
        prom.check_events_chain,
        "stored_event_names_itself_parent",
        real_bug="partial-event-names-unannounced-parent",
    ),
    _s("events-carry-tokens", prom.check_events_carry_tokens, "stored_event_tokens_shifted", repro=False),
    _s("events-carry-namespace", prom.check_events_carry_namespace, "stored_event_drops_lora", repro=False),
    _s(
        "preempted-resumable",
        prom.check_preempted_resumable,
        "preempt_keeps_computed_tokens",
        "preempt_keeps_drafts",
    ),
    # How long a hit each lookup serves, which cached blocks survive (invariants/hits.py).
    _s("hit-matches-index", hits.check_hit_matches_index, "hit_stops_a_block_early",
       "window_hit_needs_a_block_more", "chunk_hit_stops_a_block_early", "eagle_drop_forgotten",
       "eagle_drop_reapplied"),
    _s("eviction-order", hits.check_eviction_order, "free_evicts_head_first"),
    # What the prefix cache must still serve, by the harness's own model (invariants/cache.py).
    _s("cache-keeps-entries", cache.check_cache_keeps_entries, "free_forgets_keys", repro=False),
    _s("hit-reaches-model", cache.check_hit_reaches_model, "free_forgets_keys", repro=False),
    _s("caching-off-caches-nothing", cache.check_caching_off_caches_nothing, "caches_with_caching_off", repro=False),
)


def invariant(name: str, *, tier: str = "scheduler") -> Invariant:
    """The row named ``name`` in ``tier``."""
    for row in INVARIANTS:
        if row.name == name and row.tier == tier:
            return row
    raise KeyError(f"no {tier} invariant named {name!r}")
