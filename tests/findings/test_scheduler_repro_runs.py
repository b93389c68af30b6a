"""Every planted bug shown on a fixed run becomes a standalone repro file.

The fixed runs are fuzz.adapter.FIXED_RUNS: each one, planted,
is shrunk with its claim's check alone and written; the file fails in the
kit's own check with the plant and passes without it (the helpers are
tests/findings/repro_checks.py's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.adapter import planted_scheduler_bug
from fuzz.repro.scheduler import _check_of, scheduler_repro, shrink_oplog
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.findings.repro_checks import check_repro, fixed_case_log, fixed_run_cases

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


# Every planted bug shown on a fixed run (fuzz.adapter.FIXED_RUNS)
# whose claim a file can state: its run, planted, shrunk with the claim's
# check alone and written; with the plant the file fails in the check that
# states the claim (the kit's, or the suite's own the kit carries). Beside some, a line the file must hold: what it builds for the claim.
BUILT = {
    # Two tenants' requests for one prompt: the second's Request carries its salt.
    "cache_salt_not_hashed": "cache_salt='tenant-b'",
    # Requests under a LoRA adapter: the file turns LoRA on and names the adapter.
    "lora_not_hashed": "lora='adapter-b'",
    # Requests sending prompt embeddings: the file builds them from their tag.
    "embeds_not_hashed": "embeds='embeds-b'",
    # Requests carrying images: the file builds their features and the encoder budget.
    "mm_not_hashed": "mm=(('image-b', 2, 6),)",
    # KV events on: the scheduler's block pool queues them.
    "eviction_announces_nothing": "KVEventsConfig(enable_kv_cache_events=True, publisher=\"null\")",
    # KV events on, decoding past the prompt: the file replays each batch and keeps its orphans.
    "stored_event_names_itself_parent": "watch.event_orphans = event_orphans_of(watch.events.take_orphans()",
    # ... and one that announces nothing: the file replays the events against the index.
    "reset_announces_nothing": "_reset_prefix_cache(scheduler, watch, reset_running_requests=True)",
    # A reset while a request decodes: the file resets between steps and notes the step it preceded.
    "reset_keeps_index": "_reset_prefix_cache(scheduler, watch, reset_running_requests=True)",
    # Async EAGLE: the drafter writes ahead of every step it drafts from.
    "lookahead_not_allocated": "SPECULATIVE_METHOD = 'eagle'",
    # A preemption: the file watches each preempted request right after schedule().
    "preempt_keeps_computed_tokens": "watch.preemptions = _preempted_states(scheduler, ids, watch.step)",
    # ... of a speculating request: the file speculates (ngram) and watches its drafts.
    "preempt_keeps_drafts": "SPECULATIVE_METHOD = 'ngram'",
    # Async decoding past a sliding window: the file keeps the tables of the step in flight.
    "window_frees_in_flight": "watch.ownership = _ownership(scheduler, watch, in_flight)",
    # An eviction: the file learns what each key stands for from the requests' hashes.
    "evicted_key_stays_indexed": "keys.learn(rid, request.block_hashes",
    # A repeated prompt: the file reads the index as each lookup begins.
    "hit_stops_a_block_early": "held = _index_at_lookup(mgr, request, max_cache_hit_length)",
    # ... beside a sliding window: the file passes each group's window to the rule.
    "window_hit_needs_a_block_more": "SlidingWindowSpec(",
    # ... beside a chunked-local group: the file passes each group's chunk to the rule.
    "chunk_hit_stops_a_block_early": "ChunkedLocalAttentionSpec(",
    # ... under an EAGLE drafter: the file speculates with it and passes each group's drop to the rule.
    "eagle_drop_forgotten": "SPECULATIVE_METHOD = 'eagle'",
    # ... on three specs, where the coordinator's fixed point takes a second pass.
    "eagle_drop_reapplied": "MambaSpec(",
    # A Mamba state adopted in the step that writes it: the file reads each state before the step writes.
    "mamba_adopts_same_step_state": "watch.unread_states = [(rid, *m)",
    # ... and one whose cached partial-tail state stays under its key as the request writes on.
    "mamba_tail_state_overwritten": "MambaSpec(",
    # Evictions: the file watches how every free block came back to the pool.
    "free_evicts_head_first": "self.eviction_watch = _watch_frees(scheduler, self)",
}


@pytest.mark.parametrize("bug", sorted(fixed_run_cases()))
def test_a_planted_bug_shown_on_a_fixed_run_becomes_a_standalone_repro(bug: str, tmp_path: Path) -> None:
    check, expected = fixed_run_cases()[bug]
    log, invariant = fixed_case_log(bug)
    assert log is not None and invariant == expected
    with planted_scheduler_bug(bug):
        log = shrink_oplog(log, invariant, checks=(check,))
    source = scheduler_repro(log, invariant=invariant, target="scheduler-machine", seed=0, violation="")
    kit_check = _check_of(invariant)
    assert source is not None and f"    {kit_check}(" in source, source
    assert BUILT.get(bug, "") in source, source
    check_repro(source, bug, tmp_path, check=kit_check)
