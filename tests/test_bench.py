"""The benchmark's unit of work: scheduler targets are compared by
``schedule()`` steps per second, truncation targets by examples per second."""

from __future__ import annotations

from fuzz import bench
from fuzz.registry import get_target


def test_a_scheduler_campaign_counts_the_steps_of_its_steady_slices() -> None:
    rate, examples, seconds, steps = bench._campaign_run("scheduler-single-shot", 3.0, seed=7)
    assert examples > 0 and seconds > 0, (rate, examples, seconds)
    # Every single-shot example admits its requests in at least one step.
    assert steps >= examples, f"{steps} steps counted for {examples} steady examples"
    assert bench._work_rate([rate, examples, seconds, steps]) == steps / seconds


def test_a_raw_truncation_run_counts_no_steps_and_its_work_is_its_examples() -> None:
    run = bench._raw_run(get_target("truncate-hybrid"), 20, seed=3)
    assert run[3] == 0, f"a truncation run stepped a scheduler {run[3]} times"
    assert bench._work_rate(list(run)) == run[1] / run[2]


def test_the_step_counter_is_removed_after_a_run() -> None:
    from fuzz.runners.scheduler import Stepper

    step = Stepper.step
    bench._raw_run(get_target("scheduler-single-shot"), 5, seed=3)
    assert Stepper.step is step
    before = bench._Work.steps
    bench._raw_run(get_target("truncate-any-layout"), 5, seed=3)
    assert bench._Work.steps == before
