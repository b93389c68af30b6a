"""The KV-connector protocol checks (invariants/connector.py) on fixed,
hand-written scenarios: each rule holds on unmodified vLLM, sees the calls it
judges (a check that saw nothing proves nothing), and fails on its planted
connector-path bug. The searches that find the same bugs from drawn scenarios
are in tests/invariants/test_scheduler_planted.py.

Block arithmetic of the scenarios (full attention + Mamba, both block 4,
hash block 1, so sub-block "partial" hits exist): a 10-token fill caches
blocks [0, 8) and a partial entry at 9; a 16-token replay then hits 9 locally
(``P = 1``), the connector is asked from the aligned 8, and

* ``store(16)`` answers 7 > P: the tail is truncated, the load is [8, 15);
* ``store(9)`` answers 1 <= P: the tail is kept and nothing is loaded.

A 20-token request with ``store(15) async`` loads [0, 15) asynchronously in
an otherwise empty step, lands, and computes from 15 the step after.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import pytest

from fuzz.adapter import SchedulerHarness, planted_scheduler_bug
from fuzz.targets.target_scheduler import UNSUPPORTED
from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SchedulerDraw, SpecDraw, StepObservation
from invariants import connector as conn
from invariants.scheduler import step_violations
from tests.invariants.planted_cases import CONNECTOR_CASES as CASES
from tests.invariants.planted_runs import CONFIG, NONE, SCENARIOS, TOKENS, failed_load_run

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

# The connector scenarios (CONFIG, SCENARIOS): tests/invariants/planted_runs.py.
# Failed loads: tests/invariants/planted_runs.py's failed_load_run.
def _failed_load(async_load: bool, policy: str) -> list[StepObservation]:
    return failed_load_run(async_load, policy)[1]


FAILURE_RUNS: dict[str, Callable[[], list[StepObservation]]] = {
    f"{kind}-load-fails-{policy}": functools.partial(_failed_load, kind == "async", policy)
    for kind in ("sync", "async")
    for policy in ("recompute", "fail")
}


def _run(name: str, bug: str | None = None) -> list[StepObservation]:
    steps: list[StepObservation] = []
    with planted_scheduler_bug(bug) if bug else contextlib.nullcontext():
        if name in FAILURE_RUNS:
            return FAILURE_RUNS[name]()
        harness = SchedulerHarness(CONFIG)
        for tokens, max_tokens, reply in SCENARIOS[name]:
            harness.add_request(tokens, max_tokens=max_tokens, reply=reply)
            steps += harness.drain(context=name)
    return steps


def _violations(steps: list[StepObservation], check: Callable[..., None]) -> list[str]:
    return [v.invariant for s in steps for v in step_violations(s, (check,))]


ALL = conn.CONNECTOR_STEP_CHECKS + conn.CONNECTOR_ADMISSION_CHECKS


@pytest.mark.parametrize("name", sorted(SCENARIOS) + sorted(FAILURE_RUNS))
def test_unmodified_vllm_keeps_the_protocol(name: str) -> None:
    steps = _run(name)
    assert steps and not any(s.error for s in steps), [s.error for s in steps]
    found = [str(v) for s in steps for v in step_violations(s, ALL)]
    assert not found, "\n\n".join(found)
    if name in FAILURE_RUNS:
        return
    # One metadata per step, one finish per request.
    assert all(len(s.connector_metas) == 1 for s in steps)
    assert sorted(f.request_id for s in steps for f in s.connector_finishes) == ["r0", "r1"][: len(SCENARIOS[name])]


def test_the_checks_see_the_calls_they_judge() -> None:
    """The scenarios reach what each rule is about."""
    sync = _run("sync-load-truncates-tail")
    (load,) = [a for s in sync for a in s.connector_allocs if a.num_external_tokens]
    assert (load.asked_with, load.reply, load.alloc_local_tokens, load.num_external_tokens) == (8, 7, 8, 7)
    assert any(m.has_sync_kv_loads for s in sync for m in s.connector_metas)

    kept = _run("tail-kept-answer-dropped")
    (adm,) = [a for s in kept for a in s.admissions if a.reply]
    assert (adm.partial_tail, adm.reply, adm.connector_external_tokens) == (1, 1, 0)

    steps = _run("async-load-partial")
    first, landing = steps[0], steps[1]
    (start,) = first.connector_allocs
    assert start.reply_async and start.num_external_tokens == 15 and not first.num_scheduled
    (again,) = landing.connector_allocs
    assert again.asked_with is None and again.num_external_tokens == 0 and landing.num_scheduled


@pytest.mark.parametrize(
    ("check", "invariant", "bug", "scenario"), CASES, ids=[f"{inv}<-{bug}" for _, inv, bug, _ in CASES]
)
def test_rule_catches_its_planted_bug(check: Callable[..., None], invariant: str, bug: str, scenario: str) -> None:
    assert invariant in _violations(_run(scenario, bug), check)
    assert not _violations(_run(scenario), check)


def test_failed_loads_are_seen() -> None:
    """Each failed-load run reports the failure, and an async one is seen
    again as it leaves WAITING_FOR_REMOTE_KVS; the planted bugs of one rule
    leave the other rule quiet where their paths differ."""
    for name, run in FAILURE_RUNS.items():
        loads = [f for s in run() for f in s.failed_loads]
        stages = [f.stage for f in loads]
        assert stages[0] == "reported", (name, loads)
        if name == "async-load-fails-recompute":
            assert stages == ["reported", "landed"], loads
            assert loads[1].computed_after == 0 and not any(loads[1].cached_after), loads
        if name == "sync-load-fails-fail":
            assert loads[0].status_after == "FINISHED_ERROR" and loads[0].failed_block_ids != ((),), loads
    assert not _violations(_run("sync-load-fails-recompute", "resumes_past_invalid_block"), conn.check_failed_load_not_cached)
    assert not _violations(_run("sync-load-fails-fail", "evicts_invalid_blocks_on_recompute"), conn.check_failed_load_recomputed)


def test_every_connector_check_has_a_case() -> None:
    assert {c for c, *_ in CASES} == set(ALL)


# -- edges no planted bug reaches: the checks on hand-built observations ------


def _step(**fields: object) -> StepObservation:
    base: dict[str, object] = dict(
        step=1,
        admissions=(),
        error=None,
        error_type=None,
        error_where=None,
        dishonest_replies=(),
        num_scheduled={},
        newly_scheduled=(),
        preempted=frozenset(),
        finished=frozenset(),
    )
    base.update(fields)
    return StepObservation(**base)  # type: ignore[arg-type]


def test_finished_once_flags_a_live_request_and_a_silent_exit() -> None:
    from fuzz.model._scheduler import ConnectorFinish

    live = _step(connector_finishes=(ConnectorFinish("r0", "request_finished_all_groups", "RUNNING", 1),))
    with pytest.raises(InvariantViolation, match="while the request was RUNNING"):
        conn.check_finished_once(live)
    with pytest.raises(InvariantViolation, match="left the scheduler without"):
        conn.check_finished_once(_step(left_scheduler=(("r0", 0),)))
    conn.check_finished_once(_step(left_scheduler=(("r0", 1),)))


def test_lands_first_flags_a_load_still_in_flight_from_an_earlier_step() -> None:
    with pytest.raises(InvariantViolation, match="not yet reported finished"):
        conn.check_async_load_lands_first(_step(loads_in_flight=frozenset({"r0"}), num_scheduled={"r0": 3}))
    conn.check_async_load_lands_first(_step(loads_in_flight=frozenset({"r0"}), num_scheduled={"r1": 3}))


def test_meta_names_flags_a_request_already_finished() -> None:
    from fuzz.model._scheduler import ConnectorMeta

    meta = ConnectorMeta((), (("r0", 4),), (("r0", 1),), False, already_finished=("r0",))
    with pytest.raises(InvariantViolation, match="already reported finished"):
        conn.check_meta_names_scheduled(_step(connector_metas=(meta,)))


def test_saved_store_answers_only_what_was_computed() -> None:
    """The connector's own store ("saved" answers) holds what finished
    requests computed, in whole scheduler blocks: after a 14-token request
    finishes (14 tokens computed: 12 in whole blocks of 4)
    and its blocks leave the local cache, a 20-token request on the same
    prefix is answered 12 from 0 and loads [0, 12); a prompt that shares
    nothing is answered 0. Every protocol rule holds on the way."""
    harness = SchedulerHarness(CONFIG)
    steps: list[StepObservation] = []
    harness.add_request(TOKENS[:14], max_tokens=1, reply=NONE)
    steps += harness.drain(context="save")
    assert harness.script.saved == [("", TOKENS[:12])]
    harness.evict_shortcut({b.block_id for b in harness.pool.blocks if b.block_hash is not None})
    harness.add_request(TOKENS[:20], max_tokens=1, reply=ExternalReply("saved"))
    harness.add_request(tuple(range(500, 520)), max_tokens=1, reply=ExternalReply("saved"))
    steps += harness.drain(context="reload")
    answers = [(q.num_computed_tokens, q.reply) for q in harness.script.queries if q.request_id != "r0"]
    assert answers == [(0, 12), (0, 0)], answers
    (load,) = [a for s in steps for a in s.connector_allocs if a.num_external_tokens]
    assert (load.alloc_local_tokens, load.num_external_tokens) == (0, 12), load
    found = [str(v) for s in steps for v in step_violations(s, ALL)]
    assert not found, "\n\n".join(found)


def test_a_whole_prompt_load_is_answered_once_per_request() -> None:
    """An async load may bring a request's whole prompt once (a P/D decode
    side's remote prefill); asked again for the same request, the connector
    answers as a store would, stopping at num_tokens - 1. A 1-token prompt is
    asked again after its load lands (vLLM resets num_computed_tokens to 0):
    it must be told 0, not handed a second load into the block its first
    load already cached. Answering the whole prompt twice made a failed
    second load look like vLLM caching a failed block (failed-load-not-cached)."""
    draw = SchedulerDraw(LayoutDraw((SpecDraw("FullAttentionSpec", 1),), hash_block_size=1, num_blocks=13),
                         max_num_batched_tokens=4, max_num_seqs=1, long_prefill_token_threshold=1,
                         kv_load_failure_policy="fail")
    harness = SchedulerHarness(draw)
    harness.add_request([0], reply=ExternalReply("store", store_len=1, load_async=True))
    steps = [harness.step()]
    harness.fail_next_async_loads()  # would fail a second load, had there been one
    steps += harness.drain(context="after the load")
    answers = [(q.num_computed_tokens, q.reply, q.load_async) for q in harness.script.queries]
    assert answers == [(0, 1, True), (0, 0, False)], answers
    assert not [f for s in steps for f in s.failed_loads], "a second whole-prompt load was handed out and failed"
    found = [str(v) for s in steps for v in step_violations(s, ALL)]
    assert not found, "\n\n".join(found)
    assert ExternalReply("store", store_len=5, load_async=True).answer(5, 0, 0) == 5
    assert ExternalReply("store", store_len=5, load_async=True).answer(5, 0, 1, whole_prompt_sent=True) == 4
