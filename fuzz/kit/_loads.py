"""What a standalone repro keeps of the KV loads a step reports failed, for
the step-loop claims of :mod:`invariants.scheduler` that leave such
requests out (a file carries those checks as they are): each load as a
:class:`FailedLoad`, with the fields of the suite's record those checks
read, under the same names (tests/findings/test_repro_kit.py holds it to
it)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class FailedLoad:
    """A load the step's output reported failed."""

    request_id: str
    how: str  # "failed_recving" (a whole async load) or "invalid_block_ids" (a sync load, block by block)


def _failed_loads(failed):
    """The loads a step reported failed (_failed_facts's), as FailedLoads."""
    return [FailedLoad(request_id=rid, how=facts["how"]) for rid, facts in failed.items()]
