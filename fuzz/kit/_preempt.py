"""What a standalone repro watches of a preemption.

Right after a ``schedule()`` (WATCH_PREEMPTED): each request it preempted
and did not schedule again, as it left it (the suite's PreemptedRequest,
which its check judges).
"""

from __future__ import annotations

from fuzz.model._contents import PreemptedRequest


def _preempted_states(scheduler, ids, step):
    """Each of ``ids`` as vLLM holds it now: right after the schedule() of
    step ``step`` that preempted it (for those it did not schedule again), or
    right after a prefix-cache reset that did (the next schedule() may admit
    it again at once)."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [
        PreemptedRequest(rid, step, r.status.name, r.num_computed_tokens, getattr(r, "num_output_placeholders", 0),
                         len(r.spec_token_ids or ()), tuple(len(m.req_to_blocks.get(rid, ())) for m in managers))
        for rid in ids
        if (r := scheduler.requests.get(rid)) is not None
    ]
