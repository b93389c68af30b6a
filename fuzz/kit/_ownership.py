"""What a standalone repro records of block ownership, as the suite's checks
read it.

Right after each ``schedule()`` (WATCH_IN_FLIGHT): every request's block
tables, the pool state of every block and the blocks the pool handed out,
as a :class:`StepOwnership`; under async scheduling, the same record of the
step still in flight beside it. The suite's claim on reads in flight
(``invariants.promises.check_in_flight_reads_held``) reads it where it
reads an OwnershipObservation.
"""

from __future__ import annotations

import dataclasses

from fuzz.kit._hits import _groups
from fuzz.kit._params import CONNECTOR, NULL_BLOCK, READ_RULES
from fuzz.model._ownership import HeldTable


@dataclasses.dataclass(frozen=True)
class StepOwnership:
    """Block ownership after one schedule(): the OwnershipObservation fields
    the carried checks read, under the same names (tests/findings/
    test_repro_kit.py holds them to it)."""

    step: int
    groups: tuple  # GroupInfo per group
    read_rules: tuple
    null_block_id: int
    tables: tuple  # HeldTable per request holding blocks
    ref_cnt: dict
    in_free_queue: frozenset
    cached: frozenset
    fresh: tuple  # (block id, request id, group) popped from the free pool in this schedule()
    defers_frees: bool = False
    in_flight: object = None  # the StepOwnership of the step still in flight (async scheduling)

    def table_of(self, request_id):
        return next((t for t in self.tables if t.request_id == request_id), None)


def _ownership(scheduler, watch, in_flight):
    """The watch's records of this schedule() (_Watch.hold, the fresh
    blocks) as a StepOwnership; ``in_flight``: the step still in flight's."""
    tables = []
    for rid, row in watch.held.items():
        request = scheduler.requests.get(rid)
        tables.append(HeldTable(
            rid, "FINISHED" if request is None else request.status.name, 0 if request is None else request.num_tokens,
            row["num_prompt_tokens"], row["computed_before"], row["scheduled"], tuple(map(tuple, row["tables"])),
        ))
    defers = False
    if CONNECTOR:  # Scheduler.defer_block_free's condition: overlapping batches and a connector that loads
        config = scheduler.vllm_config
        defers = config.max_concurrent_batches > 1 and config.kv_transfer_config.is_kv_consumer
    blocks = watch.blocks  # block id -> (ref_cnt, in the free queue, cached)
    return StepOwnership(
        watch.step, _groups(), tuple(READ_RULES), NULL_BLOCK, tuple(tables),
        {b: ref for b, (ref, _, _) in blocks.items()},
        frozenset(b for b, (_, free, _) in blocks.items() if free),
        frozenset(b for b, (_, _, cached) in blocks.items() if cached),
        tuple(watch.fresh), defers, in_flight,
    )
