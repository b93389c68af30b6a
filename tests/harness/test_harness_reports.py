"""The scripted worker reports what it was asked to do, not what vLLM still
knows (fuzz/adapter/_reports.py).

Each test plants a vLLM that loses track of one request (drops it from
``Scheduler.requests`` early, or frees its blocks early) on the harness's own
scheduler instance, and shows that the harness still makes the report a real
worker would make (a sampled token, a load landed, a load failed, a send
done) and that the suite reports a failure. A control runs the same
operations on unmodified vLLM and finds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fuzz.adapter import SchedulerHarness
from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SpecDraw, StepObservation
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.ownership import WHERE_SENDING
from invariants.scheduler import step_violations
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

LAYOUT = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=24)


def _harness(**draw: Any) -> SchedulerHarness:
    return harness_of(LAYOUT, batch=16, seqs=2, **draw)


def _forget_after_schedule(harness: SchedulerHarness, when: Callable[[Any], str | None]) -> list[str]:
    """vLLM "forgets" a request: right after the ``schedule()`` for which
    ``when(out)`` names one, it is dropped from ``Scheduler.requests`` (its
    blocks and queue place kept). Returns the ids forgotten."""
    sched = harness.scheduler
    real = sched.schedule
    forgotten: list[str] = []

    def schedule() -> Any:
        out = real()
        rid = None if forgotten else when(out)
        if rid is not None:
            forgotten.append(rid)
            del sched.requests[rid]
        return out

    sched.schedule = schedule
    return forgotten


def _run(harness: SchedulerHarness, steps: int = 12) -> tuple[list[StepObservation], list[InvariantViolation]]:
    """Step ``harness`` (at most ``steps`` times, until idle or broken) and
    collect every violation the suite's checks find."""
    observed, found = [], []
    for _ in range(steps):
        if harness.is_idle() or harness.broken:
            break
        obs = harness.step()
        observed.append(obs)
        found.extend(step_violations(obs))
    return observed, found


def _fed(harness: SchedulerHarness, field: str) -> set[str]:
    return {rid for s in harness.oplog.steps if s.fed for rid in getattr(s.fed, field)}


def _exceptions(found: list[InvariantViolation]) -> list[InvariantViolation]:
    return [v for v in found if v.invariant == "no-exception"]


# -- sampled tokens ----------------------------------------------------------


def _sampling_run(forget: bool) -> tuple[SchedulerHarness, list[str], list[InvariantViolation]]:
    harness = _harness()
    a = harness.add_request(range(10), max_tokens=3)
    forgotten = _forget_after_schedule(harness, lambda out: a if forget and a in out.num_scheduled_tokens else None)
    _, found = _run(harness)
    return harness, forgotten, found


def test_a_token_is_sampled_for_a_request_vllm_forgot() -> None:
    """The prefill of ``a`` reaches its end: the worker samples a token for
    it from its own record although vLLM dropped ``a`` from its requests
    right after scheduling it; the request then left the scheduler without
    the connector being told (finished-once)."""
    harness, forgotten, found = _sampling_run(forget=True)
    (a,) = forgotten
    first = harness.oplog.steps[0].fed
    assert first is not None and first.req_ids == (a,) and len(first.sampled_token_ids[0]) == 1, first
    assert any(v.invariant == "finished-once" for v in found), [str(v) for v in found]


def test_sampling_control_on_unmodified_vllm() -> None:
    harness, forgotten, found = _sampling_run(forget=False)
    assert not forgotten and not found, [str(v) for v in found]
    tokens = [t for s in harness.oplog.steps if s.fed for t in s.fed.sampled_token_ids]
    assert sum(map(len, tokens)) == 3 and harness.is_idle()


# -- async loads landed and failed --------------------------------------------


def _loading_run(forget: bool, fail: bool) -> tuple[SchedulerHarness, list[str], list[InvariantViolation]]:
    harness = _harness()
    a = harness.add_request(range(20), max_tokens=2, reply=ExternalReply("store", store_len=16, load_async=True))
    if fail:
        harness.fail_async_load(a)
    started = harness.script.loads_in_flight
    forgotten = _forget_after_schedule(harness, lambda out: a if forget and a in started else None)
    _, found = _run(harness)
    return harness, forgotten, found


@pytest.mark.parametrize("fail", [False, True], ids=["landed", "failed"])
def test_a_load_is_reported_for_a_request_vllm_forgot(fail: bool) -> None:
    """The connector started an async load for ``a``; vLLM then dropped ``a``
    from its requests. The worker still reports the load (landed, or
    failed: ``failed_recving`` is a subset of the loads landing), and vLLM,
    told about a request it no longer knows, raises in
    ``update_from_output``: a no-exception finding."""
    harness, forgotten, found = _loading_run(forget=True, fail=fail)
    (a,) = forgotten
    assert a in _fed(harness, "finished_recving")
    assert (a in _fed(harness, "failed_recving")) == fail
    raised = _exceptions(found)
    assert raised and raised[0].where is not None, [str(v) for v in found]
    assert harness.broken is not None and "update_from_output" in str(raised[0])


@pytest.mark.parametrize("fail", [False, True], ids=["landed", "failed"])
def test_load_control_on_unmodified_vllm(fail: bool) -> None:
    harness, forgotten, found = _loading_run(forget=False, fail=fail)
    assert not forgotten and not found, [str(v) for v in found]
    (a,) = harness.oplog.config and [r.request_id for r in harness.oplog.requests]
    assert a in _fed(harness, "finished_recving")
    assert (a in _fed(harness, "failed_recving")) == fail
    assert harness.is_idle()


def _sync_failure_run(forget: bool) -> tuple[SchedulerHarness, list[str], list[InvariantViolation]]:
    harness = _harness(kv_load_failure_policy="recompute")
    a = harness.add_request(range(20), max_tokens=2, reply=ExternalReply("store", store_len=16))
    harness.fail_next_sync_loads()
    forgotten = _forget_after_schedule(harness, lambda out: a if forget and a in out.num_scheduled_tokens else None)
    _, found = _run(harness)
    return harness, forgotten, found


def test_a_sync_load_failure_names_the_blocks_the_connector_was_told() -> None:
    """``a``'s synchronous load fails; vLLM dropped ``a`` from its requests
    right after scheduling it. The worker reports the blocks it was told to
    load into at update_state_after_alloc (not the live block table, which
    no longer lists ``a``), and the suite reports the lost request."""
    harness, forgotten, found = _sync_failure_run(forget=True)
    (a,) = forgotten
    told = next(x.block_ids for x in harness.script.allocs if x.request_id == a)
    reported = set(harness.oplog.steps[0].fed.invalid_block_ids)
    assert reported and reported <= set(told[0]), (reported, told)
    assert found, "the lost request went unnoticed"


def test_sync_failure_control_on_unmodified_vllm() -> None:
    harness, forgotten, found = _sync_failure_run(forget=False)
    assert not forgotten and not found, [str(v) for v in found]
    assert harness.oplog.steps[0].fed.invalid_block_ids and harness.is_idle()


# -- a producer's sends -------------------------------------------------------


def _sending_run(plant: str | None) -> tuple[SchedulerHarness, str, list[InvariantViolation]]:
    """``a`` finishes on a producer, whose connector holds its blocks for a
    send. ``plant``: "forget" drops ``a`` from ``Scheduler.requests`` once
    request_finished held it (blocks kept); "free" frees its blocks at once
    (request kept)."""
    harness = _harness(kv_role="kv_producer")
    a = harness.add_request(range(10), max_tokens=2)
    harness.add_request(range(100, 110), max_tokens=6)
    sched = harness.scheduler
    real = sched._free_request

    def free_request(request: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(request, *args, **kwargs)
        rid = request.request_id
        if rid in harness.script.sends_in_flight and rid in sched.requests:
            if plant == "forget":
                del sched.requests[rid]
            elif plant == "free":
                sched.kv_cache_manager.free(request)
        return result

    if plant is not None:
        sched._free_request = free_request
    _, found = _run(harness, steps=16)
    return harness, a, found


def test_a_send_is_reported_done_for_a_request_vllm_forgot() -> None:
    """vLLM held ``a``'s blocks for its send and then dropped ``a``: the
    worker still reports the send done (the step after request_finished), and
    vLLM raises on a send it no longer knows: a no-exception finding."""
    harness, a, found = _sending_run("forget")
    assert a in _fed(harness, "finished_sending")
    raised = _exceptions(found)
    assert raised and "update_from_output" in str(raised[0]), [str(v) for v in found]


def test_blocks_freed_while_sending_are_caught() -> None:
    """vLLM freed ``a``'s blocks while its send was in flight: the worker
    still reads them, and read-blocks-held says they are not held."""
    harness, a, found = _sending_run("free")
    held = [v for v in found if v.invariant == "read-blocks-held" and v.where == WHERE_SENDING]
    assert held and a in str(held[0]), [str(v) for v in found]


def test_sending_control_on_unmodified_vllm() -> None:
    harness, a, found = _sending_run(None)
    assert not found, [str(v) for v in found]
    assert a in _fed(harness, "finished_sending")
    assert harness.is_idle() and not harness.reports_due


# -- pinned: what the worker learns from the output -----------------------------


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_the_token_of_a_step_whose_sync_load_failed_is_dropped(runner: str) -> None:
    """Found by a 60-second campaign (V2 runner): a 2-token prompt whose
    1-token sync load is reported failed (recompute). vLLM discards the token
    sampled in that step and recomputes the prompt; the worker, told the
    request has no output token (``num_output_tokens``), drops its own and
    samples again when the recompute reaches the prompt's end. Counting the
    discarded token, it sampled nothing there and the request was stranded."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 1),), hash_block_size=1, num_blocks=13)
    harness = harness_of(layout, batch=4, seqs=1, kv_load_failure_policy="recompute", model_runner=runner)
    harness.add_request([0, 3064], max_tokens=1, reply=ExternalReply("store", store_len=2))
    harness.fail_next_sync_loads()
    _, found = _run(harness)
    assert not found, [str(v) for v in found]
    first, second = [s.fed for s in harness.oplog.steps if s.fed]
    assert first.invalid_block_ids and len(first.sampled_token_ids[0]) == 1, first
    assert len(second.sampled_token_ids[0]) == 1, second
    assert harness.is_idle()
