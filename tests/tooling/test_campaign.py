"""The campaign's worker loop: fair slices, replay of what the database gained,
known failures not shrunk again (:mod:`fuzz.campaign.schedule`,
:mod:`fuzz.campaign.fuzzer`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from fuzz import adapter
from fuzz.campaign.findings import Findings
from fuzz.campaign.fuzzer import TargetFuzzer
from fuzz.campaign.progress import Progress
from fuzz.campaign.schedule import FIRST_SLICE_EXAMPLES, FairSchedule, Turn

target_names = st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=7, unique=True)


@st.composite
def runs(draw: st.DrawFn) -> tuple[FairSchedule, list[float]]:
    """A schedule and the seconds each of its slices will take (slow and fast targets)."""
    targets = draw(target_names, label="targets")
    budget = draw(st.floats(1.0, 600.0), label="budget")
    speed = {t: draw(st.floats(0.5, 2.0), label=f"slowness of {t}") for t in targets}
    return FairSchedule(targets, budget), [speed[t] for t in targets]


def _drive(schedule: FairSchedule, slowness: list[float]) -> list[tuple[Turn, float]]:
    """Run the schedule on a fake clock: a slice takes its planned time times
    the target's slowness (at most twice the plan: the worker stops it there)."""
    clock, done = 0.0, []
    while (turn := schedule.next_turn(clock)) is not None:
        secs = turn.seconds * slowness[schedule.targets.index(turn.target)]
        clock += secs
        schedule.record(turn, seconds=secs, examples=max(1, int(secs * 50)))
        done.append((turn, clock))
        assert len(done) < 100_000
    return done


@given(runs())
def test_every_target_runs_first_and_gets_a_fair_share(run: tuple[FairSchedule, list[float]]) -> None:
    schedule, slowness = run
    turns = _drive(schedule, slowness)
    k = len(schedule.targets)
    # The first k turns are each target's first, short slice, even when the
    # budget is spent before the last of them.
    assert [t.target for t, _ in turns[:k]] == schedule.targets
    assert all(t.examples == FIRST_SLICE_EXAMPLES and t.index == 0 and t.seconds <= 0.5 for t, _ in turns[:k])
    # Time used differs between targets by at most one slice (of the slowest target).
    slice_max = max(slowness) * schedule.slice_seconds
    assert max(schedule.used.values()) - min(schedule.used.values()) <= slice_max + 1e-9, schedule.used
    # The budget is used up (but for a tenth of a slice), and no slice is planned past it.
    assert turns[-1][1] >= schedule.budget - 0.1 * schedule.slice_seconds
    assert all(t.seconds <= max(schedule.budget, 0.5) for t, _ in turns)


def test_a_budget_spent_before_every_first_slice_still_runs_each_target_once() -> None:
    """Start-up slower than the budget (a loaded machine): each target still
    gets its first slice, and nothing more."""
    schedule = FairSchedule(["a", "b", "c"], 1.0)
    seen = []
    clock = 0.0
    while (turn := schedule.next_turn(clock)) is not None:
        clock += 5.0  # every slice far slower than the whole budget
        schedule.record(turn, seconds=5.0, examples=1)
        seen.append((turn.target, turn.index))
    assert seen == [("a", 0), ("b", 0), ("c", 0)]


def test_slices_follow_each_targets_speed() -> None:
    schedule = FairSchedule(["fast", "slow"], 60.0)
    for target, rate in (("fast", 100.0), ("slow", 10.0)):
        turn = schedule.next_turn(0.0)
        assert turn is not None and turn.target == target
        schedule.record(turn, seconds=FIRST_SLICE_EXAMPLES / rate, examples=FIRST_SLICE_EXAMPLES)
    assert schedule.slice_seconds == 60.0 / 2 / 8
    nxt = schedule.next_turn(1.0)
    assert nxt is not None and nxt.target == "fast" and nxt.examples == round(100 * schedule.slice_seconds)
    schedule.finish("fast")
    nxt = schedule.next_turn(1.0)
    assert nxt is not None and nxt.target == "slow" and nxt.examples == round(10 * schedule.slice_seconds)
    assert schedule.next_turn(60.0) is None


# -- the worker loop on a real target, with a planted bug ------------------------


def _fuzzer(tmp_path: Path, worker: str, db: DirectoryBasedExampleDatabase) -> tuple[TargetFuzzer, Progress]:
    progress = Progress(tmp_path, worker, start=time.time(), vllm_version=adapter.VLLM_VERSION)
    findings = Findings(repro_dir=tmp_path / worker, start=time.time(), campaign_seed=3, worker=worker,
                        vllm_version=adapter.VLLM_VERSION)
    return TargetFuzzer("truncate-hybrid", slot=0, database=db, progress=progress, findings=findings,
                        campaign_seed=3), progress


def _slice(fuzzer: TargetFuzzer, index: int, examples: int = 300) -> int:
    return fuzzer.generate(Turn("truncate-hybrid", index, examples, 1.0), stop_at=time.monotonic() + 60)


def test_a_failure_is_saved_replayed_once_by_another_worker_and_dropped_once_fixed(tmp_path: Path) -> None:
    db = DirectoryBasedExampleDatabase(tmp_path / "db")
    a, a_progress = _fuzzer(tmp_path, "a", db)
    b, b_progress = _fuzzer(tmp_path, "b", db)
    with adapter.planted_truncate_bug("pre_fix_assert_all"):
        for index in range(3):
            if not a.failures:
                _slice(a, index)
        assert [f["invariant"] for f in a_progress.totals.failures] == ["no-unexpected-failure"]
        entries = list(db.fetch(a.key))
        assert len(entries) == 1 and not a.has_new_entries()  # saved, and a knows its own
        # Found again: counted, not recorded or shrunk again; generation goes on.
        ran = _slice(a, 3, examples=150)
        assert ran >= 150 and len(a_progress.totals.failures) == 1 and list(db.fetch(a.key)) == entries
        # Another worker replays it, once.
        assert b.has_new_entries()
        assert b.replay() <= 3
        assert [f["key"] for f in b_progress.totals.failures] == [f["key"] for f in a_progress.totals.failures]
        assert not b.has_new_entries()
    # The bug is gone: a fresh worker's replay drops the entry.
    c, c_progress = _fuzzer(tmp_path, "c", db)
    c.replay()
    assert c_progress.totals.failures == [] and list(db.fetch(a.key)) == []


def test_a_slice_stops_at_its_time(tmp_path: Path) -> None:
    """A slice whose time is up stops after the example running then: one
    example of the million asked for (a count, not a clock reading)."""
    fuzzer, _ = _fuzzer(tmp_path, "a", DirectoryBasedExampleDatabase(tmp_path / "db"))
    ran = fuzzer.generate(Turn("truncate-hybrid", 0, 10**6, 0.5), stop_at=time.monotonic() - 1.0)
    assert ran == 1


@pytest.mark.parametrize("name", ["scheduler-machine"])
def test_a_state_machine_slice_stops_cleanly(tmp_path: Path, name: str) -> None:
    """A state machine draws as it runs: a slice must end between runs, never
    inside one (Hypothesis would take the cut run for flaky data)."""
    progress = Progress(tmp_path, "m", start=time.time(), vllm_version=adapter.VLLM_VERSION)
    findings = Findings(repro_dir=tmp_path / "r", start=time.time(), campaign_seed=None, worker="m",
                        vllm_version=adapter.VLLM_VERSION)
    fuzzer = TargetFuzzer(name, slot=0, database=None, progress=progress, findings=findings)
    for index in range(3):
        assert fuzzer.generate(Turn(name, index, 10**6, 0.3), stop_at=time.monotonic() + 0.3) > 0
    assert progress.totals.failures == []
