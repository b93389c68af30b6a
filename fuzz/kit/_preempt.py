"""What a standalone repro watches of a preemption, and its claim.

Right after a ``schedule()`` (WATCH_PREEMPTED): each request it preempted
and did not schedule again, as it left it; after the step, the claim that
each was left where vLLM restarts a request from.
"""

from __future__ import annotations

from fuzz.kit._build import _describe_groups


def _preempted_states(scheduler, ids):
    """(request, status, num_computed_tokens, output placeholders, drafts,
    blocks filed under it per group) of each of ``ids`` as vLLM holds it
    now: right after the schedule() that preempted it (for those it did not
    schedule again), or right after a prefix-cache reset that did (the next
    schedule() may admit it again at once)."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [
        (rid, r.status.name, r.num_computed_tokens, getattr(r, "num_output_placeholders", 0), len(r.spec_token_ids or ()),
         [len(m.req_to_blocks.get(rid, ())) for m in managers])
        for rid in ids
        if (r := scheduler.requests.get(rid)) is not None
    ]


def _check_preempted_resumable(scheduler, out, watch, step):
    """A request the step's schedule() preempted is restarted, not paused:
    right after it, the request waits with status PREEMPTED,
    num_computed_tokens == 0, no output placeholders, no spec_token_ids and
    no block filed under it in any group."""
    wrong = []
    for rid, status, computed, placeholders, drafts, held in watch.preempted:
        found = {"status": (status, "PREEMPTED"), "num_computed_tokens": (computed, 0),
                 "num_output_placeholders": (placeholders, 0), "spec_token_ids": (drafts, 0),
                 "blocks held": (sum(held), 0)}
        bad = [f"{what} {got} (expected {want})" for what, (got, want) in found.items() if got != want]
        if bad:
            wrong.append(f"request {rid} (blocks held per group {held}): " + ", ".join(bad))
    assert not wrong, (
        f"step {step}: a preempted request keeps what it computed: " + "; ".join(wrong)
        + f"; admitted again, it resumes from state its freed blocks no longer back; groups: {_describe_groups()}"
    )
