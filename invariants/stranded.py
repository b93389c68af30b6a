"""What a stranded request waits for: the liveness claim's states
(``running-request-progresses``, :func:`invariants.scheduler.check_running_requests_progress`),
one per request, matched by known-bug signatures."""

from __future__ import annotations

from collections.abc import Sequence

from fuzz.model import StrandedRequest

__all__ = [
    "STRANDED",
    "STRANDED_BEHIND_ENCODER_AFTER_FAILED_LOAD",
    "STRANDED_BEHIND_PLACEHOLDERS",
    "STRANDED_BEHIND_PLACEHOLDERS_AFTER_FAILED_LOAD",
    "STRANDED_ENCODER_AFTER_FAILED_LOAD",
    "STRANDED_PLACEHOLDERS",
    "STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD",
    "stranded_states",
    "stranded_where",
    "stranded_why",
]

STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD = "output placeholders after a failed-load recompute"
STRANDED_PLACEHOLDERS = "output placeholders"
STRANDED = "nothing in flight"
# ... rolled back by a failed load, holding a later image's encoder output.
STRANDED_ENCODER_AFTER_FAILED_LOAD = "an encoder output past a failed-load rollback holding the cache"
# Nothing of its own, in a step where another request holds output
# placeholders: stranded behind what that one holds (a sequence slot, an
# encoder output), as a 600 s campaign met on unmodified vLLM.
STRANDED_BEHIND_PLACEHOLDERS_AFTER_FAILED_LOAD = "behind a request's output placeholders after a failed-load recompute"
STRANDED_BEHIND_PLACEHOLDERS = "behind a request's output placeholders"
# Nothing of its own but an image whose encoder output it waits for, in a
# step where a request rolled back by a failed load holds a later image's
# output: the cache's room is held by a request that never runs again
# (met by the model-cost bench's machine hunt on unmodified vLLM 0.33.0:
# a cache of 9 embeddings held whole by the stuck request's later image).
STRANDED_BEHIND_ENCODER_AFTER_FAILED_LOAD = "waiting for room an encoder output past a failed-load rollback holds"

_BEHIND = {
    STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD: STRANDED_BEHIND_PLACEHOLDERS_AFTER_FAILED_LOAD,
    STRANDED_PLACEHOLDERS: STRANDED_BEHIND_PLACEHOLDERS,
}
# The vLLM call each state blames: the async scheduler reserves the
# placeholders; the failed-load rollback keeps the encoder output.
_PLACEHOLDERS = "AsyncScheduler._update_after_schedule"
_WHERE = {
    **{s: _PLACEHOLDERS for pair in _BEHIND.items() for s in pair},
    STRANDED_ENCODER_AFTER_FAILED_LOAD: "Scheduler._update_requests_with_invalid_blocks",
    STRANDED_BEHIND_ENCODER_AFTER_FAILED_LOAD: "Scheduler._update_requests_with_invalid_blocks",
}


def _own_state(r: StrandedRequest) -> str:
    if r.num_output_placeholders > 0:
        return STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD if r.recomputed_failed_load else STRANDED_PLACEHOLDERS
    if r.recomputed_failed_load and r.holds_later_encoder_output:
        return STRANDED_ENCODER_AFTER_FAILED_LOAD
    return STRANDED


def stranded_states(stranded: Sequence[StrandedRequest]) -> list[str]:
    """Each stranded request's state, in order: its own, or, with nothing of
    its own, behind the first request of the step holding placeholders, or
    else, waiting for an encoder output, behind a request that holds the
    encoder cache past a failed-load rollback."""
    states = [_own_state(r) for r in stranded]
    head = next((s for s in states if s in _BEHIND), None)
    encoder_held = STRANDED_ENCODER_AFTER_FAILED_LOAD in states

    def behind(r: StrandedRequest, s: str) -> str:
        if s != STRANDED:
            return s
        if head is not None:
            return _BEHIND[head]
        return STRANDED_BEHIND_ENCODER_AFTER_FAILED_LOAD if encoder_held and r.needs_encoder_output else s

    return [behind(r, s) for r, s in zip(stranded, states)]


def stranded_where(state: str, default: str) -> str:
    """The vLLM call a stranded state blames (``default``: the scheduler's)."""
    return _WHERE.get(state, default)


def stranded_why(r: StrandedRequest) -> str:
    """Why the first quiet step's ``schedule()`` had to schedule ``r``: it saw
    all that any later one sees."""
    return (f"it is RUNNING with {r.num_computed_tokens} of its {r.num_tokens} tokens computed, nothing in flight "
            "and nothing arriving: no later schedule() sees anything new")
