"""The scheduler harness observes requests resumed after a preemption right.

A preempted request re-enters ``schedule()`` through the waiting queue and
takes the prefix-cache branch again, so it is an admission like any other.
With the V1 model runner vLLM reports it among the *cached* requests of the
``SchedulerOutput``; with V2, among the new ones. The harness once read the
cached case from the live request, after ``schedule()`` had already added
the step's tokens, and ``computed-adds-up`` reported a false alarm on every
release whose lean CPU install picks V1 (0.28-0.32; the matrix of
2026-11-29). The shrunk scenario is pinned in the target and run here
under both runners.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from fuzz.adapter import SchedulerHarness
from fuzz.runners.scheduler import run_single_shot
from strategies.single_shot import PREEMPTED_THEN_RESUMED

RESUMED = "resumed after preemption with a local hit"


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_resumed_request_is_checked_with_what_it_resumed_from(runner: str) -> None:
    scenario = dataclasses.replace(
        PREEMPTED_THEN_RESUMED, config=dataclasses.replace(PREEMPTED_THEN_RESUMED.config, model_runner=runner)
    )
    labels = run_single_shot(scenario, record=False)  # raises on a violated invariant
    assert RESUMED in labels, f"the scenario no longer resumes a preempted request with a hit: {sorted(labels)}"


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_harness_serves_the_model_runner_drawn(runner: str) -> None:
    draw = PREEMPTED_THEN_RESUMED.config
    harness = SchedulerHarness(dataclasses.replace(draw, model_runner=runner))
    assert harness.scheduler.use_v2_model_runner is (runner == "v2")


def test_model_runner_choice_does_not_leak_into_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    SchedulerHarness(dataclasses.replace(PREEMPTED_THEN_RESUMED.config, model_runner="v1"))
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
