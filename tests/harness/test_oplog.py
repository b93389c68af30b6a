"""The operation log (fuzz/model/_oplog.py) is complete: replaying it on a
fresh scheduler gives the same SchedulerOutputs, step for step.

The log records everything the harness did to vLLM (configuration, requests,
connector answers, each step's fed-back ModelRunnerOutput, aborts, KV-load
failures); a log missing any of it would replay into different outputs.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz.adapter import SchedulerHarness, replay_oplog
from fuzz.model import Abort, AddRequest, ExternalReply, LayoutDraw, SpecDraw, Step
from fuzz.runners.scheduler import run_single_shot
from fuzz.targets.target_scheduler import UNSUPPORTED
from fuzz.model import SingleShotScenario
from strategies.single_shot import single_shot_scenarios
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def _assert_replays(log) -> None:  # type: ignore[no-untyped-def]
    # An async-scheduling step that only fed the queued output called no schedule().
    recorded = [s.output for s in log.steps if s.output is not None or s.error is not None]
    assert recorded, "nothing was scheduled"
    assert replay_oplog(log) == recorded


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenario=single_shot_scenarios(shortcut=True, allow_over=False))
def test_a_single_shot_run_replays_into_the_same_outputs(scenario: SingleShotScenario) -> None:
    built: list[SchedulerHarness] = []
    if run_single_shot(scenario, (), record=False, on_harness=built.append) is None:
        return  # vLLM refused the configuration
    log = built[0].oplog
    assert log.config.draw == scenario.config
    _assert_replays(log)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenario=single_shot_scenarios(shortcut=False, allow_over=False))
def test_an_async_scheduling_run_replays_into_the_same_outputs(scenario: SingleShotScenario) -> None:
    """With async scheduling the log says which step's output each step fed
    (one step late, as the engine's batch queue feeds it)."""
    scenario = dataclasses.replace(scenario, config=dataclasses.replace(scenario.config, async_scheduling=True))
    built: list[SchedulerHarness] = []
    if run_single_shot(scenario, (), record=False, on_harness=built.append) is None:
        return  # vLLM refused the configuration
    log = built[0].oplog
    assert log.config.draw.async_scheduling
    assert any(s.fed_step is not None for s in log.steps), log.steps
    _assert_replays(log)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_aborts_async_loads_and_their_failures_replay(async_scheduling: bool) -> None:
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1,
                        num_blocks=40)
    harness = harness_of(layout, batch=8, seqs=3, async_scheduling=async_scheduling)
    a = harness.add_request(range(20), max_tokens=3, reply=ExternalReply("store", store_len=16, load_async=True))
    b = harness.add_request(range(100, 120), max_tokens=3,
                            reply=ExternalReply("undecided", store_len=12, undecided=1))
    harness.fail_async_load(a)  # reported failed when its load is reported back
    harness.step()
    harness.step()
    c = harness.add_request(range(20), max_tokens=2, reply=ExternalReply("store", store_len=8, load_async=True))
    harness.step()
    harness.abort(b)
    harness.drain()
    log = harness.oplog
    assert [type(op) for op in log.ops[:3]] == [AddRequest, AddRequest, Step]
    assert Abort(b, 3) in log.ops and {r.request_id for r in log.requests} == {a, b, c}
    assert any(s.fed and s.fed.failed_recving == (a,) for s in log.steps), log.steps
    assert log.answers_for(b)[0].answer is None  # asked first: undecided
    _assert_replays(log)


def test_a_missing_operation_replays_differently() -> None:
    """The comparison has teeth: drop one request and the outputs differ."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1,
                        num_blocks=40)
    harness = harness_of(layout, batch=8)
    harness.add_request(range(10), max_tokens=1)
    harness.add_request(range(10), max_tokens=1)
    harness.drain()
    log = harness.oplog
    second = log.requests[1]
    log.ops.remove(second)
    assert replay_oplog(log) != [s.output for s in log.steps]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_an_abort_during_a_step_replays(async_scheduling: bool) -> None:
    """An abort that arrives while the model runs a step is applied right
    before that step's update_from_output (EngineCore._process_aborts_queue);
    the log says so, and replay applies it there too."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=1, num_blocks=40)
    harness = harness_of(layout, batch=8, seqs=2, async_scheduling=async_scheduling)
    a = harness.add_request(range(12), max_tokens=4)
    harness.add_request(range(100, 112), max_tokens=4)
    harness.step()
    harness.step()
    harness.abort(a, during_step=True)
    assert a in harness.live_request_ids  # not before the step runs
    harness.step()
    assert a not in harness.live_request_ids
    harness.drain()
    log = harness.oplog
    assert Abort(a, 2, during_step=True) in log.ops
    _assert_replays(log)
    # The same log with the abort between steps schedules differently.
    log.ops[log.ops.index(Abort(a, 2, during_step=True))] = Abort(a, 2)
    assert replay_oplog(log) != [s.output for s in log.steps if s.output is not None]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_producers_held_blocks_replay(async_scheduling: bool) -> None:
    """A producer (``kv_role="kv_producer"``) holds a request that finished
    normally until its send is reported done (``finished_sending``, in the
    output of a step scheduled after ``request_finished``), an aborted one not
    at all; the log carries the reports and replay frees at the same steps."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=20)
    harness = harness_of(layout, batch=16, seqs=2, async_scheduling=async_scheduling, kv_role="kv_producer")
    a = harness.add_request(range(10), max_tokens=2)
    b = harness.add_request(range(100, 110), max_tokens=8)
    for _ in range(10):
        harness.step()
        if harness.status_of(a) is not None and harness.status_of(a) != "RUNNING":
            break
    assert harness.status_of(a) == "FINISHED_LENGTH_CAPPED"  # finished, its blocks held
    held = harness.step_index
    harness.abort(b)
    assert b not in harness.live_request_ids  # aborted: freed at once
    harness.drain()
    log = harness.oplog
    (sent,) = [s for s in log.steps if s.fed and s.fed.finished_sending]
    assert sent.fed.finished_sending == (a,) and sent.index > held
    assert not harness.live_request_ids
    _assert_replays(log)
