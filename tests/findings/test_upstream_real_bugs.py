"""The writer on real vLLM bugs: the upstream form of three real vLLM 0.33.0
bugs the block-ownership model found (their pins:
``tests/known_bugs/test_ownership_findings.py``), written from the pinned
runs on unmodified vLLM, fails in vLLM's tests tree on its own assertion.
A strict xfail, as the pins are: it turns red the day vLLM fixes the bug
(or the day the writer's file stops showing it)."""

from __future__ import annotations

import pytest

from fuzz import known_bugs
from fuzz.adapter import VLLM_VERSION
from fuzz.model import InvariantViolation, OpLog
from fuzz.runners.scheduler import run_single_shot
from fuzz.targets.target_scheduler import UNSUPPORTED
from fuzz.upstream import SKIP_REASON, run_in_tree, tests_tree, upstream_form
from invariants import ownership as own
from tests.known_bugs import runs as pins
from tests.known_bugs._pin import known_vllm_bug

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


class _FileStillFails(Exception):
    """The written file fails on the installed vLLM: the bug is still there."""


def _run(bug_id: str) -> tuple[OpLog, str]:
    """The pinned run of ``bug_id`` on unmodified vLLM (its operation log)
    and the claim it breaks there."""
    if bug_id == "mamba-failed-load-rollback":
        # Its pin states failed-load-recomputed; the ownership model sees the
        # rolled-back request read the null block where its state should be.
        return pins.failed_sync_load_run("MambaSpec")[0].oplog, "read-blocks-held"
    scenario, check = {
        "same-step-partial-hit-reads-unwritten-block": (pins.SYNC_LOAD_THEN_SAME_STEP_PARTIAL_HIT,
                                                        own.check_no_same_step_hazard),
        "full-prompt-async-load-replays-outside-window": (pins.FULL_PROMPT_ASYNC_LOAD, own.check_read_blocks_held),
    }[bug_id]
    with pytest.raises(InvariantViolation) as caught:
        run_single_shot(scenario, (check,), record=False)
    return caught.value.oplog, caught.value.invariant  # type: ignore[return-value]


@known_vllm_bug("vLLM 0.33.0 has the bug: the written file fails on its assertion", raises=_FileStillFails)
@pytest.mark.parametrize(
    "bug_id",
    ["same-step-partial-hit-reads-unwritten-block", "full-prompt-async-load-replays-outside-window",
     "mamba-failed-load-rollback"],
)
def test_a_real_bug_is_written_as_a_file_that_fails_on_it(bug_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if tests_tree() is None:
        pytest.skip(SKIP_REASON)
    if not known_bugs.known_bug(bug_id).affects(VLLM_VERSION):
        pytest.skip(f"{bug_id} does not affect vLLM {VLLM_VERSION}")
    monkeypatch.setattr(known_bugs, "match", lambda failure, version: None)  # the run must see its own bug
    log, claim = _run(bug_id)
    form = upstream_form(log, claim)
    assert form is not None, f"{bug_id}: no upstream file for {claim}"
    rel, source, _ = form
    (outcome,) = run_in_tree({rel: source}).values()
    if outcome.outcome == "failed" and outcome.message.startswith("AssertionError: step "):
        raise _FileStillFails(outcome.message.splitlines()[0])
    assert outcome.outcome == "passed", (outcome, source)
