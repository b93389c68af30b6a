"""A check reports every instance it finds: one per offending request,
block or entry, with its state and group kind, so that a known bug sets
aside only its own (:func:`fuzz.known_bugs.sort_out`). Shown for the claims
whose checks describe several findings in one violation: on two findings
of a step, and on each claim's planted fixed run (where the step's
ownership record gives the group kinds)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fuzz.adapter import FIXED_RUNS, planted_scheduler_bug
from fuzz.model import (
    EventGap,
    EventPayload,
    ForgottenEntry,
    InvariantViolation,
    KeyCollision,
    RequestPlaces,
    ShortHit,
    StepObservation,
    WaitingRequest,
)
from fuzz.model._encoder import MissingEncoderOutput
from fuzz.runners.scheduler import run_fixed
from invariants import cache, contents, encoder, fate, promises
from invariants.table import invariant


def _step(**fields: object) -> StepObservation:
    return StepObservation(
        step=5, admissions=(), error=None, error_type=None, error_where=None, dishonest_replies=(),
        num_scheduled={}, newly_scheduled=(), preempted=frozenset(), finished=frozenset(), **fields,
    )


def _found(check: Callable[[StepObservation], None], step: StepObservation) -> list[InvariantViolation]:
    """Every violation ``check`` finds in ``step`` (its own list where it has one)."""
    listed = getattr(check, "violations", None)
    if listed is not None:
        return list(listed(step))
    try:
        check(step)
    except InvariantViolation as v:
        return [v]
    return []


def _payload(rid: str, field: str) -> EventPayload:
    return EventPayload(0, b"k-" + rid.encode(), 0, rid, 8, field, (1,), (2,))


# (check, the step's field, two findings, the state, the requests and blocks of each instance)
TWO_FINDINGS = [
    (cache.check_cache_keeps_entries, "forgotten_entries",
     (ForgottenEntry("r1", 0, 3, 4, "aa", 1), ForgottenEntry("r2", 0, 7, 8, "bb", 2)),
     cache.ENTRY_FORGOTTEN, [(("r1",), (3,)), (("r2",), (7,))]),
    (cache.check_hit_reaches_model, "short_hits",
     (ShortHit("r1", 0, 4, (4,), ((3,),)), ShortHit("r2", 4, 8, (8,), ((3, 7),))),
     cache.HIT_BELOW_MODEL, [(("r1",), (3,)), (("r2",), (3, 7))]),
    (encoder.check_encoder_outputs_held, "missing_encoder_outputs",
     (MissingEncoderOutput("r1", 0, "img-a", (2, 4), (0, 8), 3), MissingEncoderOutput("r2", 1, "img-b", (4, 4), (4, 8), None)),
     encoder.ENCODER_OUTPUT_MISSING, [(("r1",), ()), (("r2",), ())]),
    (contents.check_keys_name_one_prefix, "key_collisions",
     (KeyCollision("aa", 4, "r1", "", "r2", 4, "salt", -1), KeyCollision("bb", 8, "r1", "", "r3", 8, "", 6)),
     contents.KEY_NAMES_TWO_PREFIXES, [(("r1", "r2"), ()), (("r1", "r3"), ())]),
    (promises.check_events_carry_tokens, "event_payloads", (_payload("r1", "token_ids"), _payload("r2", "token_ids")),
     promises.EVENTS_WRONG_TOKENS, [(("r1",), ()), (("r2",), ())]),
    (promises.check_events_carry_namespace, "event_payloads", (_payload("r1", "lora_name"), _payload("r2", "lora_name")),
     promises.EVENTS_WRONG_NAMESPACE, [(("r1",), ()), (("r2",), ())]),
    (promises.check_events_replay_index, "event_gaps", (EventGap(0, b"k1", 1, ()), EventGap(0, b"k2", 0, (5,))),
     promises.EVENTS_DISAGREE, [((), ()), ((), (5,))]),
    (fate.check_request_in_one_place, "places",
     (RequestPlaces("r1", (), 0, "RUNNING"), RequestPlaces("r2", ("running", "waiting"), 0, "RUNNING")),
     None, [(("r1",), ()), (("r2",), ())]),
    (fate.check_unblocked_request_admitted, "waiting_unblocked",
     (WaitingRequest("r1", "WAITING", 2, 8, 4, "waiting"), WaitingRequest("r2", "PREEMPTED", 3, 8, 4, "waiting")),
     fate.UNBLOCKED_NOT_ADMITTED, [(("r1",), ()), (("r2",), ())]),
]


@pytest.mark.parametrize(("check", "field", "found", "state", "named"), TWO_FINDINGS,
                         ids=[c.__name__ for c, *_ in TWO_FINDINGS])
def test_two_findings_are_two_instances(check, field, found, state, named) -> None:  # type: ignore[no-untyped-def]
    assert _found(check, _step()) == [], "a step with no finding raised"
    violations = _found(check, _step(**{field: found}))
    instances = [i for v in violations for i in v.instances]
    assert [(i.requests, i.blocks) for i in instances] == named, instances
    assert all(i.state == v.state for v in violations for i in v.instances), violations
    if state is not None:
        assert {i.state for i in instances} == {state}, instances


# (planted bug, the claim its fixed run shows, whether its instances name a group)
PLANTED = [
    ("free_forgets_keys", "cache-keeps-entries", True),
    ("free_forgets_keys", "hit-reaches-model", False),
    ("stored_event_tokens_shifted", "events-carry-tokens", True),
    ("stored_event_drops_lora", "events-carry-namespace", True),
    ("hands_off_one_block_short", "hand-off-names-computed-blocks", True),
    ("encoder_entry_stays_freeable", "encoder-outputs-held", False),
    ("hash_ignores_parent", "keys-name-one-prefix", False),
    ("lost_when_pool_full", "request-in-one-place", False),
    ("deferred_requests_take_slots", "unblocked-request-admitted", False),
]


@pytest.mark.parametrize(("bug", "claim", "grouped"), PLANTED, ids=[f"{c}<-{b}" for b, c, _ in PLANTED])
def test_a_planted_run_names_each_instance(bug: str, claim: str, grouped: bool) -> None:
    with planted_scheduler_bug(bug), pytest.raises(InvariantViolation) as caught:
        run_fixed(FIXED_RUNS[bug], (invariant(claim).check,))
    v = caught.value
    assert v.invariant == claim, str(v)
    assert v.instances and all(i.state == v.state and i.requests for i in v.instances), v.instances
    if grouped:
        assert all(i.group is not None and i.group_kind for i in v.instances), v.instances
    else:
        assert all(i.group is None and i.group_kind is None for i in v.instances), v.instances
