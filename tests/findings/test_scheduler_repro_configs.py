"""Planted scheduler bugs found on other scheduler configurations become
standalone vLLM tests too: async scheduling (the file builds the
AsyncScheduler and feeds each output one step late), a prefill cadence, a
KV producer, speculative decoding (ngram and EAGLE). The helpers are
tests/findings/repro_checks.py's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fuzz.adapter import planted_scheduler_bug
from fuzz.model import PromptDraw
from fuzz.repro.scheduler import scheduler_repro, scheduler_repro_of_failure, shrink_oplog, shrunk_log_of_failure
from fuzz.runners.scheduler import ALL_CHECKS
from invariants.handoff import check_hand_off_names_computed_blocks
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.findings.repro_checks import SEARCH, check_repro, planted_search_strategy
from tests.support.search import planted_failure

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

# Planted bugs found on async-scheduling configurations (AsyncScheduler, the
# engine's batch queue feeding each output one step late): the file builds
# the AsyncScheduler and replays the same schedule/update order.
ASYNC_BUGS = {"skip_truncation": "computed-adds-up", "connector_finished_twice": "finished-once"}


@pytest.mark.parametrize("bug", sorted(ASYNC_BUGS))
def test_a_planted_bug_on_async_scheduling_becomes_a_standalone_repro(bug: str, tmp_path: Path) -> None:
    # Every configuration with async scheduling.
    violation, _ = planted_failure(bug, planted_search_strategy().map(
        lambda s: dataclasses.replace(s, config=dataclasses.replace(s.config, async_scheduling=True))),
        settings=SEARCH, module_constants=False)
    assert violation.invariant == ASYNC_BUGS[bug], str(violation)
    with planted_scheduler_bug(bug):
        log = shrunk_log_of_failure(violation, violation.invariant)
        source = None if log is None else scheduler_repro(log, invariant=violation.invariant, target="scheduler-engine-reachable", seed=0,
                                                           violation=str(violation))
    assert log is not None and log.config.draw.async_scheduling
    assert any(s.fed_step is not None for s in log.steps), "no output was fed one step late"
    assert source is not None and "ASYNC_SCHEDULING = True" in source and "get_scheduler_cls()" in source
    check_repro(source, bug, tmp_path)


def test_a_planted_bug_under_a_prefill_cadence_becomes_a_standalone_repro(tmp_path: Path) -> None:
    """Every configuration with ``prefill_schedule_interval=3`` (prefills held
    back on two executed steps in three while requests decode): the written
    file builds its scheduler with the same cadence."""
    bug = "skip_truncation"

    violation, _ = planted_failure(bug, planted_search_strategy().map(
        lambda s: dataclasses.replace(s, config=dataclasses.replace(s.config, prefill_schedule_interval=3))),
        settings=SEARCH)
    with planted_scheduler_bug(bug):
        log = shrunk_log_of_failure(violation, violation.invariant)
        source = None if log is None else scheduler_repro(log, invariant=violation.invariant, target="scheduler-single-shot", seed=0,
                                                           violation=str(violation))
    assert log is not None and log.config.draw.prefill_schedule_interval == 3
    assert source is not None and "prefill_schedule_interval=PREFILL_SCHEDULE_INTERVAL" in source
    assert "PREFILL_SCHEDULE_INTERVAL = 3" in source
    check_repro(source, bug, tmp_path)


def _as_producer(scenario):  # type: ignore[no-untyped-def]
    """``scenario`` on a P/D prefill instance: async scheduling, a
    ``kv_producer`` connector (it holds finished requests' blocks until their
    send is reported done) and no external hit for any request."""
    from fuzz.model import ExternalReply

    def no_hit(prompt):  # type: ignore[no-untyped-def]
        return None if prompt is None else dataclasses.replace(prompt, reply=ExternalReply())

    return dataclasses.replace(
        scenario,
        config=dataclasses.replace(scenario.config, async_scheduling=True, kv_role="kv_producer"),
        fills=tuple(no_hit(f) for f in scenario.fills),
        replay=no_hit(scenario.replay),
        probe=no_hit(scenario.probe),
    )


def test_a_planted_bug_on_a_producer_becomes_a_standalone_repro(tmp_path: Path) -> None:
    """Every configuration as a P/D prefill instance (``kv_role="kv_producer"``,
    async scheduling, no external hit): the written file builds the same
    connector role, whose sends hold blocks until finished_sending."""
    bug = "connector_finished_twice"

    violation, _ = planted_failure(bug, planted_search_strategy().map(_as_producer), settings=SEARCH, module_constants=False)
    assert violation.invariant == "finished-once", str(violation)
    with planted_scheduler_bug(bug):
        log = shrunk_log_of_failure(violation, violation.invariant)
        source = None if log is None else scheduler_repro(log, invariant=violation.invariant, target="scheduler-machine", seed=0,
                                                           violation=str(violation))
    assert log is not None and log.config.draw.kv_role == "kv_producer"
    # The file's closing drain reports the held sends done (finished_sending):
    # without them its requests never leave and its leak check cannot pass.
    assert source is not None and "kv_role=KV_ROLE," in source and "KV_ROLE = 'kv_producer'" in source
    check_repro(source, bug, tmp_path)


def _speculating(config, method: str, k: int = 2):  # type: ignore[no-untyped-def]
    """``config`` with ``method`` speculative decoding of k tokens (Mamba
    groups holding k speculative state blocks, as vLLM builds them); EAGLE
    needs a budget above k, ngram synchronous scheduling."""
    groups = tuple(
        dataclasses.replace(g, params=g.params + (("num_speculative_blocks", k),)) if g.kind == "MambaSpec" else g
        for g in config.layout.groups
    )
    return dataclasses.replace(
        config,
        layout=dataclasses.replace(config.layout, groups=groups),
        max_num_batched_tokens=max(config.max_num_batched_tokens, k + 1),
        async_scheduling=method == "eagle" and config.async_scheduling,
        speculative_method=method,
        num_speculative_tokens=k,
        draft_acceptance=(1, 0, 2),
    )


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_a_planted_bug_on_a_speculative_config_becomes_a_standalone_repro(method: str, tmp_path: Path) -> None:
    """Every configuration speculates (k=2, drafts accepted 1, 0, 2, ...):
    the written file builds the same SpeculativeConfig, samples the accepted
    drafts and hands the drafter's proposals over as the harness did."""
    bug = "skip_truncation"

    violation, _ = planted_failure(bug, planted_search_strategy().map(
        lambda s: dataclasses.replace(s, config=_speculating(s.config, method))), settings=SEARCH, module_constants=False)
    with planted_scheduler_bug(bug):
        log = shrunk_log_of_failure(violation, violation.invariant)
        source = None if log is None else scheduler_repro(log, invariant=violation.invariant, target="scheduler-single-shot", seed=0,
                                                           violation=str(violation))
    assert log is not None and log.config.draw.speculative_method == method
    assert source is not None and f"SPECULATIVE_METHOD = {method!r}" in source
    assert "SpeculativeConfig(" in source and "**speculation" in source  # its helper may be inlined in _make_scheduler
    check_repro(source, bug, tmp_path)


def _short(replay: PromptDraw) -> PromptDraw:
    """``replay`` generating at most 3 tokens: decoding further, the plant's
    consequence (a block keyed as full over a rejected draft's position)
    meets index-written before the step that verifies the drafts ends."""
    return dataclasses.replace(replay, max_tokens=min(replay.max_tokens, 3))


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_a_planted_spec_decode_bug_becomes_a_standalone_repro(method: str, tmp_path: Path) -> None:
    """The rejected drafts left counted as computed: the file replays the
    accepted and rejected drafts of the run (and, sync, the drafts handed
    over) and states the claim after the step that verified them."""
    bug = "rejected_drafts_stay_computed"

    # Without the hand-off claim: a short request that finishes in the step
    # that verifies its drafts hands the connector blocks it never wrote (the
    # same plant, seen at its finish) before this claim can read it; the
    # file under test states this claim.
    violation, _ = planted_failure(bug, planted_search_strategy().map(
        lambda s: dataclasses.replace(s, config=_speculating(s.config, method), replay=_short(s.replay))),
        settings=SEARCH, checks=(c for c in ALL_CHECKS if c is not check_hand_off_names_computed_blocks),
        module_constants=False)
    assert violation.invariant == "rejected-drafts-rolled-back", str(violation)
    with planted_scheduler_bug(bug):
        source = scheduler_repro_of_failure(target="scheduler-single-shot", seed=0,
                                            invariant=violation.invariant, violation=str(violation),
                                            failure=violation)
    assert source is not None and "check_rejected_drafts_rolled_back(watch)" in source
    check_repro(source, bug, tmp_path)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["ngram-sync", "eagle-async"])
def test_accepted_drafts_recorded_as_other_tokens_become_a_standalone_repro(
    async_scheduling: bool, tmp_path: Path
) -> None:
    """vLLM recording the step's first sampled token for every accepted
    draft: from the fixed speculating run of tests/invariants/test_scheduler_planted.py
    (requests decoding 8 tokens: the short single-shot generations finish
    before a position past an accepted draft is settled), the file carries
    the worker's own record and states kv-matches-tokens at the step vLLM's
    tokens and the runner's part."""
    from invariants.scheduler import check_kv_matches_tokens
    from tests.invariants.planted_runs import speculating_harness

    bug = "records_first_sampled_token"
    with planted_scheduler_bug(bug):
        harness = speculating_harness(async_scheduling)
        harness.drain(context="speculating")
        log = shrink_oplog(harness.oplog, "kv-matches-tokens", checks=(check_kv_matches_tokens,))
    source = scheduler_repro(log, invariant="kv-matches-tokens", target="scheduler-machine", seed=0, violation="")
    assert source is not None and "    check_kv_matches_tokens(watch)" in source  # the suite's check itself
    assert "class WorkerRecord" in source  # the suite's own record, copied
    check_repro(source, bug, tmp_path)
