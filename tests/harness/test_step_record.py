"""One record per step, and one place that tells operation kinds apart.

Each ``SchedulerHarness.step()`` appends exactly one entry to the operation
log, and the :class:`StepObservation` it returns carries that very entry:
the step's index, error and the requests that left are read from it, so the
log a repro replays and the observation the checks judge cannot disagree.
:class:`OpVisitor` dispatches the log's operations for every reader of the
log (replay, shrinking, both repro writers, the fate record), refusing what
is no operation.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from fuzz.adapter import SchedulerHarness, replay_oplog
from fuzz.model import (
    Abort,
    AddRequest,
    Evict,
    ExternalReply,
    LayoutDraw,
    OpLog,
    OpVisitor,
    ResetPrefixCache,
    SpecDraw,
    Step,
    StepObservation,
)
from fuzz.model._oplog import Op
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

LAYOUT = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1, num_blocks=40)


def _stepped(harness: SchedulerHarness) -> StepObservation:
    """One step, with the claim: it logged one entry, the one it carries."""
    before = len(harness.oplog.ops)
    observation = harness.step()
    op = observation.op
    assert isinstance(op, Step) and harness.oplog.ops[before:] == [op] and harness.oplog.ops[-1] is op
    assert (observation.step, observation.error, observation.error_where) == (op.index, op.error, op.error_where)
    assert observation.finished == frozenset(op.left)
    return observation


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_every_step_logs_one_entry_the_observation_carries(async_scheduling: bool) -> None:
    harness = harness_of(LAYOUT, batch=8, seqs=3, async_scheduling=async_scheduling)
    a = harness.add_request(range(20), max_tokens=3, reply=ExternalReply("store", store_len=16, load_async=True))
    b = harness.add_request(range(100, 120), max_tokens=3, reply=ExternalReply("undecided", store_len=12, undecided=1))
    harness.fail_async_load(a)
    steps = [_stepped(harness), _stepped(harness)]
    harness.add_request(range(20), max_tokens=2)
    harness.abort(b, during_step=True)
    harness.reset_prefix_cache()
    steps.append(_stepped(harness))
    while harness.live_request_ids or harness.has_pending_output or harness.reports_due:
        steps.append(_stepped(harness))
        assert len(steps) < 64, "the run did not end"
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))
    assert [s.op for s in steps] == harness.oplog.steps
    assert any(s.finished for s in steps) and any(s.op is not None and s.op.fed for s in steps)
    assert not async_scheduling or any(s.fed_late for s in steps)


def test_an_observation_that_disagrees_with_its_entry_is_refused() -> None:
    op = Step(index=3, output=None, answers=(), fed=None, left=("r1",))
    fields = dict(admissions=(), error_type=None, dishonest_replies=(), num_scheduled={}, newly_scheduled=(),
                  preempted=frozenset())
    observation = StepObservation.recorded(op, **fields)
    assert (observation.step, observation.finished, observation.op) == (3, frozenset({"r1"}), op)
    with pytest.raises(ValueError, match="disagrees with the log entry of step 3"):
        dataclasses.replace(observation, finished=frozenset())
    with pytest.raises(ValueError, match="disagrees"):
        StepObservation(step=4, error=None, error_where=None, finished=frozenset({"r1"}), op=op, **fields)


def test_every_operation_kind_has_a_rule_and_nothing_else_passes() -> None:
    assert set(OpVisitor._METHODS) == set(typing.get_args(Op))

    class Named(OpVisitor[str]):
        def other(self, op: object) -> str:
            return type(op).__name__

    ops = [AddRequest("r0", (1, 2), 1, None, 0), Abort("r0", 1), Evict((3,), 1), ResetPrefixCache(1),
           Step(2, None, (), None)]
    assert [Named().visit(op) for op in ops] == ["AddRequest", "Abort", "Evict", "ResetPrefixCache", "Step"]
    with pytest.raises(TypeError, match="dict .* is not an operation of the log"):
        Named().visit({"step": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="OpVisitor has no rule for a Step operation"):
        OpVisitor().visit(ops[-1])


def test_replay_refuses_what_is_no_operation() -> None:
    harness = harness_of(LAYOUT, batch=8)
    harness.add_request(range(10), max_tokens=1)
    harness.drain()
    log = harness.oplog
    assert replay_oplog(log) == [s.output for s in log.steps]
    with pytest.raises(TypeError, match="is not an operation of the log"):
        replay_oplog(OpLog(log.config, [log.ops[0], "step", *log.ops[1:]]))  # type: ignore[list-item]
