"""A failing run's operation log survives JSON (fuzz/model/_oplog_json.py).

The campaign's sidecar keeps the log for ``python -m fuzz replay``: every
fixed run (fuzz.adapter.FIXED_RUNS), planted, yields a log that decodes to
an equal one, and replaying the decoded log breaks the same claim in the
same crash state as the run did; unplanted, the same replay ends clean.
"""

from __future__ import annotations

import json

import pytest

from fuzz.adapter import planted_scheduler_bug
from fuzz.campaign.findings import crash_state
from fuzz.model import (
    Abort,
    Behaviour,
    InvariantViolation,
    OpLog,
    ResetPrefixCache,
    SpecDraw,
    Step,
    decode_oplog,
    encode_oplog,
)
from fuzz.repro.shrink import first_violation
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.invariants.planted_cases import FIXED_CASES

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


def _through_json(log: OpLog) -> OpLog:
    return decode_oplog(json.loads(json.dumps(encode_oplog(log))))


def _planted_run(bug: str):  # type: ignore[no-untyped-def]
    """The fixed run tests/invariants/test_scheduler_planted.py shows ``bug``
    caught on, planted: its check and the violation it raised."""
    check, run = next((c, r) for c, _, b, r, _ in FIXED_CASES if b == bug)
    with planted_scheduler_bug(bug), pytest.raises(InvariantViolation) as caught:
        run((check,))
    return check, caught.value


@pytest.mark.parametrize("bug", [b for _, _, b, _, _ in FIXED_CASES])
def test_every_fixed_runs_log_survives_json(bug: str) -> None:
    _, violation = _planted_run(bug)
    log = violation.oplog
    assert isinstance(log, OpLog) and log.steps
    back = _through_json(log)
    assert back == log
    # Declared types come back, not JSON's: tuples stay tuples, the ops a list.
    assert isinstance(back.ops, list) and isinstance(back.config.draw.layout.groups, tuple)
    assert all(isinstance(s.answers, tuple) for s in back.steps)


# One of each kind of claim: a stale output, a hash, an event, a reset, a
# Mamba state, a preemption, a missed hit, a leak through a full pool.
REPLAYED = ["delivers_stale_output", "cache_salt_not_hashed", "eviction_announces_nothing", "reset_keeps_index",
            "mamba_adopts_same_step_state", "preempt_keeps_computed_tokens", "hit_stops_a_block_early",
            "lost_when_pool_full"]


@pytest.mark.parametrize("bug", REPLAYED)
def test_a_decoded_log_replays_to_the_same_violation(bug: str) -> None:
    check, violation = _planted_run(bug)
    back = _through_json(violation.oplog)
    with planted_scheduler_bug(bug):
        again = first_violation(back, (check,))
    assert again is not None, f"{bug}: the decoded log no longer fails"
    assert (again.invariant, crash_state(again), again.state) == (
        violation.invariant, crash_state(violation), violation.state)
    # Without the plant the same replay ends clean: the failure is the bug's.
    assert first_violation(back, (check,)) is None


def test_every_operation_kind_and_enum_round_trips() -> None:
    """Kinds no fixed run may hold (an abort in flight, a reset of running
    requests), and an enum value, come back as their declared types."""
    _, violation = _planted_run("cache_salt_not_hashed")
    log = violation.oplog
    extra = OpLog(log.config, [*log.ops, Abort("r9", 3, during_step=True), ResetPrefixCache(4, reset_running=True)])
    assert _through_json(extra) == extra
    from fuzz.model._oplog_json import _decode, _encode

    assert _decode(_encode(Behaviour.MAY_BE_SHORT), Behaviour, "b") is Behaviour.MAY_BE_SHORT
    spec = SpecDraw("SlidingWindowSpec", 16, params=(("sliding_window", 4),),
                    inner=(SpecDraw("FullAttentionSpec", 16),))
    assert _decode(_encode(spec), SpecDraw, "s") == spec


def test_a_log_that_does_not_fit_is_refused_by_name() -> None:
    _, violation = _planted_run("cache_salt_not_hashed")
    data = encode_oplog(violation.oplog)
    step = next(i for i, op in enumerate(data["log"]["ops"]) if op["@type"] == "Step")
    bad = json.loads(json.dumps(data))
    bad["log"]["ops"][step]["@type"] = "Jump"
    with pytest.raises(ValueError, match=r"log\.ops\[\d+\]: 'Jump' is none of"):
        decode_oplog(bad)
    bad = json.loads(json.dumps(data))
    bad["log"]["ops"][step]["index"] = "one"
    with pytest.raises(ValueError, match=r"\.index: expected int, got 'one'"):
        decode_oplog(bad)
    bad = json.loads(json.dumps(data))
    bad["log"]["ops"][step]["colour"] = 1
    with pytest.raises(ValueError, match="Step has no field 'colour'"):
        decode_oplog(bad)
    with pytest.raises(ValueError, match="not an operation log"):
        decode_oplog({"format": 0, "log": data["log"]})
    # A field written before it existed keeps its default.
    old = json.loads(json.dumps(data))
    del old["log"]["ops"][step]["fed_step"]
    assert isinstance(decode_oplog(old).ops[step], Step)
