"""The checks: plain ``check_*`` functions, one claim each, raising
:class:`fuzz.model.InvariantViolation` (re-exported here). What they judge
against (the spec-kind table, a group's behaviour and name) is vocabulary
and lives in :mod:`fuzz.model`.

* :mod:`invariants.truncation`: ``truncate_computed_blocks``;
* :mod:`invariants.scheduler`: ``Scheduler.schedule()`` with a KV connector;
* :mod:`invariants.connector`: the scheduler's side of the KV-connector
  protocol (what it told the connector against what it accounted for);
* :mod:`invariants.handoff`: the blocks ``request_finished`` hands the
  connector, against the harness's record of the request's blocks;
* :mod:`invariants.ownership`: block ownership after every ``schedule()``
  (held blocks, same-step hazards, reservations, lookup limits);
* :mod:`invariants.table`: every invariant in one table (name, check, planted
  bugs, whether a repro can state it).
"""

from fuzz.model import InvariantViolation

__all__ = ["InvariantViolation"]
