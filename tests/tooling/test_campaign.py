"""The campaign's worker loop: slices that follow discovery, replay of what the database gained,
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
from fuzz.campaign.schedule import FIRST_SLICE_EXAMPLES, FLOOR, DiscoverySchedule, Turn

target_names = st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=7, unique=True)


@st.composite
def runs(draw: st.DrawFn) -> tuple[DiscoverySchedule, list[float], dict[str, int]]:
    """A schedule, the slowness of each target's slices (slow and fast
    targets), and how many new behaviours each target finds per slice until
    it saturates (0: never anything)."""
    targets = draw(target_names, label="targets")
    budget = draw(st.floats(1.0, 600.0), label="budget")
    speed = {t: draw(st.floats(0.5, 2.0), label=f"slowness of {t}") for t in targets}
    finds = {t: draw(st.integers(0, 30), label=f"slices of {t} finding something") for t in targets}
    return DiscoverySchedule(targets, budget), [speed[t] for t in targets], finds


def _drive(schedule: DiscoverySchedule, slowness: list[float],
           finds: dict[str, int] | None = None) -> list[tuple[Turn, float]]:
    """Run the schedule on a fake clock: a slice takes its planned time times
    the target's slowness (at most twice the plan: the worker stops it
    there), and finds one new behaviour in each of the target's first
    ``finds[target]`` slices."""
    clock, done = 0.0, []
    while (turn := schedule.next_turn(clock)) is not None:
        secs = turn.seconds * slowness[schedule.targets.index(turn.target)]
        clock += secs
        found = 1 if finds is not None and turn.index < finds[turn.target] else 0
        schedule.record(turn, seconds=secs, examples=max(1, int(secs * 50)), novelty=found)
        done.append((turn, clock))
        assert len(done) < 100_000
    return done


@given(runs())
def test_every_target_runs_first_and_keeps_its_floor(run: tuple[DiscoverySchedule, list[float], dict[str, int]]) -> None:
    schedule, slowness, finds = run
    turns = _drive(schedule, slowness, finds)
    k = len(schedule.targets)
    # The first k turns are each target's first, short slice, even when the
    # budget is spent before the last of them.
    assert [t.target for t, _ in turns[:k]] == schedule.targets
    assert all(t.examples == FIRST_SLICE_EXAMPLES and t.index == 0 and t.seconds <= 0.5 for t, _ in turns[:k])
    # No target falls more than a slice (of the slowest target) below its
    # floor: FLOOR of an even share of all the time used.
    slice_max = max(slowness) * schedule.slice_seconds
    floor = FLOOR * sum(schedule.used.values()) / k
    assert min(schedule.used.values()) >= floor - slice_max - 1e-9, (schedule.used, floor)
    # The budget is used up (but for a tenth of a slice), and no slice is planned past it.
    assert turns[-1][1] >= schedule.budget - 0.1 * schedule.slice_seconds
    assert all(t.seconds <= max(schedule.budget, 0.5) for t, _ in turns)
    # Every turn says why it was given.
    assert all(t.why for t, _ in turns)


def test_time_goes_to_the_target_still_finding_things() -> None:
    """One target finds something in every slice, the others nothing after
    their first: the finder gets everything above the others' floors."""
    schedule = DiscoverySchedule(["saturated", "deep", "also saturated"], 600.0)
    _drive(schedule, [1.0, 1.0, 1.0], {"saturated": 1, "deep": 10**6, "also saturated": 1})
    share = {t: schedule.share(t) for t in schedule.targets}
    assert share["deep"] > 0.6, share
    for t in ("saturated", "also saturated"):
        assert share[t] >= FLOOR / 3 - 0.02, share  # kept running at its floor
        assert share[t] < 0.25, share
    # Once its early luck has decayed, a saturated target runs at its floor only.
    later = schedule.history[len(schedule.history) // 4:]
    whys = {t.why.split()[0] for t, _, _, _ in later if t.target != "deep"}
    assert whys == {"floor"}, whys


def test_a_target_that_stops_finding_things_falls_to_its_floor() -> None:
    """The deep target finds things for its first 10 slices, the other for
    its first 60: after the deep one saturates, the time follows the other."""
    schedule = DiscoverySchedule(["early", "late"], 600.0)
    turns = _drive(schedule, [1.0, 1.0], {"early": 10, "late": 60})
    early_best = [i for i, (t, _) in enumerate(turns) if t.target == "early" and t.why.startswith("best")]
    late_best = [i for i, (t, _) in enumerate(turns) if t.target == "late" and t.why.startswith("best")]
    assert early_best and late_best
    assert max(early_best) < len(turns) // 2, "the saturated target kept winning turns"
    assert schedule.used["late"] > 1.5 * schedule.used["early"], schedule.used


def test_a_budget_spent_before_every_first_slice_still_runs_each_target_once() -> None:
    """Start-up slower than the budget (a loaded machine): each target still
    gets its first slice, and nothing more."""
    schedule = DiscoverySchedule(["a", "b", "c"], 1.0)
    seen = []
    clock = 0.0
    while (turn := schedule.next_turn(clock)) is not None:
        clock += 5.0  # every slice far slower than the whole budget
        schedule.record(turn, seconds=5.0, examples=1)
        seen.append((turn.target, turn.index))
    assert seen == [("a", 0), ("b", 0), ("c", 0)]


def test_slices_follow_each_targets_average_speed() -> None:
    schedule = DiscoverySchedule(["fast", "slow"], 60.0)
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
    # One slow slice (a state machine's long example) moves the average, not
    # the whole estimate: 10 examples in 1 s then 1 in 1 s is 5.5 a second.
    schedule.record(nxt, seconds=1.0, examples=10)
    schedule.record(Turn("slow", 2, 10, 1.0), seconds=1.0, examples=1)
    assert schedule.rate("slow") == 5.5
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


def test_new_behaviour_counts_labels_and_pairs_of_one_example() -> None:
    """What the schedule counts (fuzz.campaign.novelty): a label reached for
    the first time, and two known labels reached together for the first time."""
    from fuzz import telemetry
    from fuzz.campaign.novelty import features

    a, b = "test-novelty: a", "test-novelty: b"
    before = features()
    for label in (a, b):  # each alone: two new labels, no pair
        telemetry.begin_example()
        telemetry.reach(label)
        telemetry.end_example()
    alone = features()
    assert {f for f in alone - before if "test-novelty" in f} == {f"branches: {a}", f"branches: {b}"}
    telemetry.begin_example()
    telemetry.example_labels({a, b})  # both in one example: one new pair, nothing else
    telemetry.end_example()
    assert features() - alone == {f"pair: {a} & {b}"}


def test_settling_the_heap_freezes_what_start_up_left() -> None:
    import gc

    from fuzz.hunting import settle_heap

    try:
        start_up = [object() for _ in range(10)]  # noqa: F841 - live objects start-up leaves
        settle_heap()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
