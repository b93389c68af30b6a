"""The KV-connector protocol checks (invariants/connector.py) on fixed,
hand-written scenarios: each rule holds on unmodified vLLM, sees the calls it
judges (a check that saw nothing proves nothing), and fails on its planted
connector-path bug. The searches that find the same bugs from drawn scenarios
are in tests/test_scheduler_planted.py.

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
from collections.abc import Callable

import pytest

from fuzz.adapter import SchedulerHarness, planted_scheduler_bug
from fuzz.targets.target_scheduler import UNSUPPORTED
from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SchedulerDraw, SpecDraw, StepObservation
from invariants import connector as conn
from invariants.scheduler import step_violations

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

CONFIG = SchedulerDraw(
    layout=LayoutDraw(
        (SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1, num_blocks=32
    ),
    max_num_batched_tokens=32,
)
TOKENS = tuple(range(100, 130))
NONE = ExternalReply("zero")

# name: requests run one after another (tokens, max_tokens, reply).
SCENARIOS: dict[str, tuple[tuple[tuple[int, ...], int, ExternalReply], ...]] = {
    "sync-load-truncates-tail": (
        (TOKENS[:10], 1, NONE),
        (TOKENS[:16], 1, ExternalReply("store", store_len=16)),
    ),
    "tail-kept-answer-dropped": (
        (TOKENS[:10], 1, NONE),
        (TOKENS[:16], 1, ExternalReply("store", store_len=9)),
    ),
    "async-load-partial": ((TOKENS[:20], 2, ExternalReply("store", store_len=15, load_async=True)),),
}


def _run(name: str, bug: str | None = None) -> list[StepObservation]:
    steps: list[StepObservation] = []
    with planted_scheduler_bug(bug) if bug else contextlib.nullcontext():
        harness = SchedulerHarness(CONFIG)
        for tokens, max_tokens, reply in SCENARIOS[name]:
            harness.add_request(tokens, max_tokens=max_tokens, reply=reply)
            steps += harness.drain(context=name)
    return steps


def _violations(steps: list[StepObservation], check: Callable[..., None]) -> list[str]:
    return [v.invariant for s in steps for v in step_violations(s, (check,))]


ALL = conn.CONNECTOR_STEP_CHECKS + conn.CONNECTOR_ADMISSION_CHECKS


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_unmodified_vllm_keeps_the_protocol(name: str) -> None:
    steps = _run(name)
    assert steps and not any(s.error for s in steps), [s.error for s in steps]
    found = [str(v) for s in steps for v in step_violations(s, ALL)]
    assert not found, "\n\n".join(found)
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


# (check, invariant, planted bug, scenario)
CASES: list[tuple[Callable[..., None], str, str, str]] = [
    (conn.check_external_range_contiguous, "external-contiguous", "asks_connector_unaligned", "sync-load-truncates-tail"),
    (conn.check_told_external_accounted, "told-external-accounted", "tells_connector_total", "sync-load-truncates-tail"),
    (conn.check_load_blocks_cover_range, "load-blocks-cover", "hands_connector_cached_blocks", "sync-load-truncates-tail"),
    (conn.check_dropped_answer_loads_nothing, "dropped-answer-loads-nothing", "keeps_tail_and_loads", "tail-kept-answer-dropped"),
    (conn.check_meta_built_once, "meta-built-once", "skips_meta_on_empty_step", "async-load-partial"),
    (conn.check_meta_names_scheduled, "meta-names-scheduled", "async_load_counted_scheduled", "async-load-partial"),
    (conn.check_sync_load_announced, "sync-load-announced", "no_sync_load_flag", "sync-load-truncates-tail"),
    (conn.check_async_load_lands_first, "async-load-lands-first", "async_load_computes_at_once", "async-load-partial"),
    (conn.check_finished_once, "finished-once", "connector_finished_twice", "sync-load-truncates-tail"),
]


@pytest.mark.parametrize(
    ("check", "invariant", "bug", "scenario"), CASES, ids=[f"{inv}<-{bug}" for _, inv, bug, _ in CASES]
)
def test_rule_catches_its_planted_bug(check: Callable[..., None], invariant: str, bug: str, scenario: str) -> None:
    assert invariant in _violations(_run(scenario, bug), check)
    assert not _violations(_run(scenario), check)


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
