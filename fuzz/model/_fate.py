"""Where each request the harness added is, by the harness's own record.

:class:`RequestPlaces`: the places one request was found in after a step
(vLLM's running list and waiting queues, read as an observation of what it
did) beside the fates the harness itself recorded (finished as the outputs
it was fed back said, aborted by its own call). :class:`WaitingRequest`: a
waiting request every blocker of which the harness saw gone before a
``schedule()`` that admitted nothing, with how many such steps in a row.
The claims on them are ``invariants/fate.py``'s.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ABORTED", "FINISHED", "RequestPlaces", "WaitingRequest"]

# The two fates the harness records itself, beside vLLM's queue names.
FINISHED = "finished"  # an output fed back named it with a finish reason
ABORTED = "aborted"  # the harness aborted it while it had no fate yet


@dataclasses.dataclass(frozen=True)
class RequestPlaces:
    """One request after a step: every place it was found in (``running``,
    a waiting queue by its attribute name, :data:`FINISHED`,
    :data:`ABORTED`; a queue holding it twice is named twice) and how many
    outputs fed back so far reported it finished."""

    request_id: str
    places: tuple[str, ...]
    finish_reports: int
    status: str | None  # vLLM's status of the request object, for the message

    def describe(self) -> str:
        where = ", ".join(self.places) if self.places else "nowhere"
        return (f"request {self.request_id} (status {self.status}): in {where}; "
                f"reported finished {self.finish_reports} time(s)")


@dataclasses.dataclass(frozen=True)
class WaitingRequest:
    """A request still waiting after ``steps`` ``schedule()`` calls in a row
    that admitted nothing (no tokens scheduled, no load started) although,
    before each, every blocker of it was gone: nothing RUNNING, no step in
    flight with work, no KV load or hand-off in flight, the connector's
    answer decided, and ``free_blocks`` (the harness's own model of the
    free pool) at least ``blocks_needed``, an upper bound on what every
    waiting request could take at once."""

    request_id: str
    status: str
    steps: int
    free_blocks: int
    blocks_needed: int
    queue: str  # the waiting queue it sits in
    # The harness fed back an output reporting an async load of it failed,
    # and no step has scheduled it since.
    after_failed_async_load: bool = False

    def describe(self) -> str:
        return (f"request {self.request_id} {self.status} in {self.queue}, not admitted by {self.steps} "
                f"schedule() calls in a row with nothing running or in flight, its connector answer "
                f"decided and {self.free_blocks} free blocks for at most {self.blocks_needed} needed"
                + (", not scheduled since an async load of it was reported failed" if self.after_failed_async_load else ""))
