"""The parts one engine step of :class:`fuzz.adapter.SchedulerHarness` hands
from one to the next: the recorders' marks as the step begins
(:class:`Marks`), what ``schedule()`` did (:class:`Scheduled`), the failure
of a vLLM call (:class:`Failure`), a scheduled step and what the model
runner returns for it (:class:`Pending`), and the engine core's batch queue
that decides whose output a step feeds back (:class:`BatchQueue`)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

__all__ = ["BatchQueue", "Failure", "Marks", "Pending", "Scheduled"]


class Failure(NamedTuple):
    """A vLLM call's exception as a step observes it (what
    :func:`fuzz.adapter._observe.step_failure` returns)."""

    error: str  # "ExcType: message"
    error_type: str
    where: str  # the call: "reset_prefix_cache", "schedule" or "update_from_output"
    frames: tuple[str, ...]
    statement: str

    @staticmethod
    def fields_of(failure: Failure | None) -> dict[str, Any]:
        """The :class:`fuzz.model.StepObservation` fields the log entry
        does not carry (None: the step raised nothing)."""
        if failure is None:
            return {"error_type": None, "error_frames": (), "error_statement": ""}
        return {"error_type": failure.error_type, "error_frames": failure.frames, "error_statement": failure.statement}


@dataclasses.dataclass(frozen=True)
class Marks:
    """Where the connector script's records stood as the step began."""

    queries: int
    allocs: int
    metas: int
    in_flight: frozenset[str]  # async loads not reported done
    rolled_back: frozenset[str]  # see StepObservation.rolled_back


@dataclasses.dataclass(frozen=True)
class Scheduled:
    """What one ``schedule()`` did, as the harness saw it (nothing but its
    preemptions, when it was not called or raised)."""

    queries: list[Any]  # the connector queries it made
    admissions: tuple[Any, ...]
    connector_allocs: tuple[Any, ...]
    newly: tuple[tuple[str, int, int], ...]
    invalid: set[int]  # blocks of its synchronous loads the worker fails (Faults.invalid_blocks)
    dishonest: tuple[str, ...]
    metas: tuple[Any, ...]
    ownership: Any
    preemptions: tuple[Any, ...]

    def fields(self) -> dict[str, Any]:
        """Its :class:`fuzz.model.StepObservation` fields."""
        return {
            "admissions": self.admissions, "dishonest_replies": self.dishonest, "newly_scheduled": self.newly,
            "connector_allocs": self.connector_allocs, "connector_metas": self.metas, "ownership": self.ownership,
            "preemptions": self.preemptions,
        }


@dataclasses.dataclass
class Pending:
    """A scheduled step and what the model runner returns for it, decided
    when it was scheduled (what the GPU computes for that SchedulerOutput)."""

    index: int
    out: Any
    sampled: list[list[int]]
    invalid_block_ids: set[int]
    # The synchronous loads reported failed with it (see Faults.invalid_blocks).
    sync_failures: dict[str, tuple[int, int, tuple[int, ...], int]]


class BatchQueue:
    """Async scheduling: the engine's batch queue (EngineCore
    step_with_batch_queue, size max_concurrent_batches = 2): at most one
    scheduled step whose model output is not fed back yet (:attr:`pending`)."""

    def __init__(self, scheduler: Any, async_scheduling: bool) -> None:
        self.scheduler, self.async_scheduling = scheduler, async_scheduling
        self.pending: Pending | None = None

    def take(self, queued: Pending | None) -> Pending | None:
        """The scheduled step whose output this engine step feeds back (None:
        none), ``queued`` being the one just scheduled.

        Synchronous: ``queued`` itself. Async scheduling, as
        ``EngineCore.step_with_batch_queue`` (vllm/v1/engine/core.py) does it:
        the new output joins the queue (``batch_queue.appendleft``); ``if
        len(batch_queue) < self.batch_queue_size and (model_executed or
        self.scheduler.has_requests())`` it returns without feeding anything;
        otherwise ``batch_queue.pop()`` (the oldest) and
        ``update_from_output`` it. ``model_executed`` is
        ``scheduler_output.total_num_scheduled_tokens > 0``; the queue holds
        ``max_concurrent_batches`` = 2 (V1 runner, no PP; V2: pp_size + 1)."""
        if not self.async_scheduling:
            return queued
        if queued is None:  # nothing scheduled (no requests): the oldest is fed
            oldest, self.pending = self.pending, None
            return oldest
        if self.pending is None:
            executed = queued.out.total_num_scheduled_tokens > 0
            if executed or self.scheduler.has_requests():
                self.pending = queued
                return None
            return queued
        oldest, self.pending = self.pending, queued
        return oldest
