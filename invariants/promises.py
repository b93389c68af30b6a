"""What the prefix cache promises beyond what each block holds.

Isolation: a prefix-cache hit stays within the namespace vLLM folds into a
block's hash besides the tokens (the request's cache salt). This is the
suite's security claim: a tenant that salts its requests must never be
served, or time, another tenant's cached KV.

Announcements: a KV-aware router (llm-d's KV-cache indexer, Dynamo's router
and the like) never reads the block pool; it learns what a replica has
cached only from the KV events the engine core publishes. They are held to
what the index really holds.

Preemption: a request vLLM preempts is restarted, not paused; it must be
left in a state it can resume from, reading nothing of what it held.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from fuzz.model import InvariantViolation, PreemptedRequest, StepObservation

__all__ = [
    "PROMISE_CHECKS",
    "check_events_replay_index",
    "check_hits_within_namespace",
    "check_lookahead_allocated",
    "check_preempted_resumable",
]

# The vLLM code that builds the events (matched by known-bug signatures).
EVENTS_WHERE = "BlockPool"
EVENTS_DISAGREE = "replayed KV events disagree with the prefix-cache index"
CROSS_NAMESPACE_HIT = "a prefix-cache hit across cache salts"
LOOKAHEAD_UNALLOCATED = "a drafter's lookahead past the blocks allocated"
PREEMPTED_NOT_RESET = "a preempted request keeps what it computed"


def _report(invariant: str, found: Sequence[Any], step: StepObservation, *, where: str, state: str) -> None:
    """Raise ``invariant``'s violation for what the step ``found`` (each
    describing itself), if it found anything."""
    if not found:
        return
    raise InvariantViolation(
        invariant,
        "\n".join(f.describe() for f in found)
        + f"\n{step.describe()}"
        + (f"\n  scenario: {step.context}" if step.context else ""),
        where=where,
        state=state,
    )


def check_lookahead_allocated(step: StepObservation) -> None:
    """A drafter with its own forward pass (EAGLE, a draft model) writes KV
    ``num_lookahead_tokens`` positions past each step it drafts from: every
    attention group's table the runner gets for that step already covers
    them (up to max_model_len), or the drafter writes into blocks the
    request does not own."""
    _report("lookahead-allocated", step.missing_lookahead, step, where="KVCacheManager.allocate_slots", state=LOOKAHEAD_UNALLOCATED)


def check_hits_within_namespace(step: StepObservation) -> None:
    """Every block a request adopts from the prefix cache as computed was
    written for a request with the same cache salt (none counts as its own
    namespace): vLLM folds the salt into the first block's hash, and every
    later hash chains on it, so no lookup may cross salts."""
    _report("hits-within-namespace", step.foreign_hits, step, where="KVCacheManager.get_computed_blocks", state=CROSS_NAMESPACE_HIT)


def check_events_replay_index(step: StepObservation) -> None:
    """After every ``update_from_output()`` that published (KV events on),
    replaying every ``BlockStored``, ``BlockRemoved`` and
    ``AllBlocksCleared`` event so far counts, under each (group, key), as
    many blocks as the prefix-cache index files there: no entry a router
    is told of that a lookup cannot hit (it routes requests to a replica
    that recomputes), none a lookup hits that the router never heard of (a
    hit it never routes to), and none withdrawn twice."""
    _report("events-replay-index", step.event_gaps, step, where=EVENTS_WHERE, state=EVENTS_DISAGREE)


@dataclasses.dataclass(frozen=True)
class _NotReset:
    """A preempted request whose state is not the one vLLM restarts it from."""

    request: PreemptedRequest
    wrong: tuple[str, ...]  # "what: found (expected ...)"

    def describe(self) -> str:
        return f"{self.request.describe()}; not reset: " + ", ".join(self.wrong)


def _not_reset(p: PreemptedRequest) -> tuple[str, ...]:
    expected = {
        "status": (p.status, "PREEMPTED"),
        "num_computed_tokens": (p.num_computed_tokens, 0),
        "num_output_placeholders": (p.num_output_placeholders, 0),
        "spec_token_ids": (p.num_spec_tokens, 0),
        "blocks held": (sum(p.blocks_held), 0),
    }
    return tuple(f"{what} {found} (expected {want})" for what, (found, want) in expected.items() if found != want)


def check_preempted_resumable(step: StepObservation) -> None:
    """Right after the ``schedule()`` that preempts a request (vLLM frees
    every block it holds and restarts it: ``Scheduler._preempt_request``),
    the request waits with status PREEMPTED, ``num_computed_tokens == 0``, no
    output placeholders (async scheduling's in-flight share is counted
    stale instead), no drafts (``spec_token_ids`` empty) and no block filed
    under it in any group: admitted again, it reads only what its own
    lookup and connector give it (a request the same ``schedule()``
    admitted again is judged by the admission checks)."""
    found = [_NotReset(p, w) for p in step.preemptions if not p.rescheduled and (w := _not_reset(p))]
    _report("preempted-resumable", found, step, where="Scheduler._preempt_request", state=PREEMPTED_NOT_RESET)


PROMISE_CHECKS: tuple[Callable[[StepObservation], None], ...] = (
    check_lookahead_allocated,
    check_hits_within_namespace,
    check_events_replay_index,
    check_preempted_resumable,
)
