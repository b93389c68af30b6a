"""What the prefix cache promises to the world outside the engine core.

A KV-aware router (llm-d's KV-cache indexer, Dynamo's router and the like)
never reads the block pool: it learns what a replica has cached only from
the KV events the engine core publishes. These checks hold those
announcements to what the index really holds.
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.model import InvariantViolation, StepObservation

__all__ = ["PROMISE_CHECKS", "check_events_replay_index"]

# The vLLM code that builds the events (matched by known-bug signatures).
EVENTS_WHERE = "BlockPool"
EVENTS_DISAGREE = "replayed KV events disagree with the prefix-cache index"


def check_events_replay_index(step: StepObservation) -> None:
    """After every ``update_from_output()`` that published (KV events on),
    replaying every ``BlockStored``, ``BlockRemoved`` and
    ``AllBlocksCleared`` event so far counts, under each (group, key), as
    many blocks as the prefix-cache index files there: no entry a router
    is told of that a lookup cannot hit (it routes requests to a replica
    that recomputes), none a lookup hits that the router never heard of (a
    hit it never routes to), and none withdrawn twice."""
    if not step.event_gaps:
        return
    raise InvariantViolation(
        "events-replay-index",
        "\n".join(g.describe() for g in step.event_gaps)
        + f"\n{step.describe()}"
        + (f"\n  scenario: {step.context}" if step.context else ""),
        where=EVENTS_WHERE,
        state=EVENTS_DISAGREE,
    )


PROMISE_CHECKS: tuple[Callable[[StepObservation], None], ...] = (check_events_replay_index,)
