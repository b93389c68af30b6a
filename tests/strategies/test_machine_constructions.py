"""The state machine builds rare states by construction, measured here.

* Failing-load runs (``SchedulerMachine.build`` with ``failing_load``): one
  KV-cache group, a first request whose synchronous load is armed to fail,
  and under "fail" mostly an abort while the model runs that step.
* Conversations (``SchedulerMachine.next_turn``): a turn ending inside a
  block, run to completion, then a longer turn the store holds: the
  truncation branch on layouts with a hash unit finer than the block.
* Pressed turns (``next_turn`` under async scheduling): the first turn
  aborted while its last prompt step runs, then pool pressure evicting part
  of it, later groups first (the lagging second attention group).
* Drafts pressing the pool (``press_with_drafts`` on speculating
  configurations): requests decoding with drafts outgrow the pool, and
  vLLM preempts one holding its drafts.

Each is measured over derandomized programs of a subclass that always
builds the state (per run, as ``tests/strategies/test_scheduler_reach.py`` measures the
whole machine). The known bugs these states show
(``mamba-failed-load-rollback``,
``abort-during-failed-sync-load-keeps-invalid-blocks-cached``, ...) are set
aside by the default known-bug handling, so the runs go on.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from fuzz.hunting import without_module_constants
from fuzz.runners import scheduler as runner
from fuzz.targets import target_scheduler
from fuzz.targets.target_scheduler import UNSUPPORTED, SchedulerMachine
from strategies.machine import drafting_configs, machine_configs
from strategies.scheduler import scheduler_draws, scheduler_layouts

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

RUNS = 60
# Floors well under what the flavour reaches (measured at 60 runs: see the
# printed shares with -s): a failed sync load reported in most runs, an
# abort during that step under "fail" in some, a failed sync load on a
# whole-state or windowed group under "recompute" in some.
MIN_SYNC_LOAD_FAILED = 0.50
MIN_ABORTED_UNDER_FAIL = 0.15
MIN_RECOMPUTED = 0.15
# The machine's general mix reaches it by luck in about 4% of runs.
MIN_TRUNCATION = 0.20
# Pressed turns: the general mix is async in about half the runs, and half
# of those turns are pressed; about half the pressures left part of the
# turn cached (measured: 13 of 26 pressed, 34% of 76 runs pressed). Since
# one request in four decodes up to two blocks (generation_lengths), the
# requests around a turn hold more of the pool and fewer pressures end in
# a partial eviction (measured: 8 of 31 pressed runs).
MIN_PRESSED = 0.10
MIN_PARTLY_EVICTED = 0.20
# Drafting configurations: nearly all runs press the pool (a run whose first request
# never finishes, stalled, does not), and most presses end in a preemption
# of a request holding drafts (measured: see -s); a layout of windowed
# groups alone holds too few blocks to run out. The general mix preempted
# none such in 150 runs before the rule.
MIN_DRAFTS_PRESSED = 0.80
MIN_DRAFTS_PREEMPTED = 0.50


class FailingLoadMachine(SchedulerMachine):
    """The machine with every run a failing-load run."""

    @initialize(target=SchedulerMachine.prefixes, data=st.data())
    def build(self, data: st.DataObject) -> tuple[int, ...]:  # type: ignore[override]
        return SchedulerMachine.build(self, True, data)


class ConversationMachine(SchedulerMachine):
    """The machine (its general configurations), every run starting with two
    turns of a conversation (``next_turn``) after its first request."""

    @initialize(target=SchedulerMachine.prefixes, data=st.data())
    def build(self, data: st.DataObject) -> tuple[int, ...]:  # type: ignore[override]
        prefix = SchedulerMachine.build(self, False, data)
        if self._live():
            self.next_turn(prefix, data)
        return prefix


def _reach(machine: type[SchedulerMachine], title: str) -> tuple[int, Counter[str]]:
    """Run ``RUNS`` derandomized programs of ``machine`` (10 steps each);
    per-run label counts, printed (``-s``)."""
    before = target_scheduler.MACHINE_REACH.copy()
    test = machine.TestCase
    test.settings = settings(target_scheduler.TestSchedulerMachine.settings, max_examples=RUNS, stateful_step_count=10)
    with without_module_constants():
        test("runTest").runTest()
    reach = target_scheduler.MACHINE_REACH - before
    n = reach["runs"]
    assert n >= RUNS // 2, f"only {n} {title} ran"
    print(f"\n{title}: reach over {n} runs:")
    for label, count in sorted(reach.items(), key=lambda kv: -kv[1]):
        if label != "runs":
            print(f"  {count / n:6.1%}  {label}")
    return n, reach


def test_conversations_reach_the_truncation_branch() -> None:
    n, reach = _reach(ConversationMachine, "conversation runs")
    truncation = reach[runner.TRUNCATION] / n
    assert truncation >= MIN_TRUNCATION, f"the truncation branch in {truncation:.1%} of {n} conversation runs"


class PressedTurnMachine(SchedulerMachine):
    """The machine on async configurations (the general mix's layouts, every
    draw asynchronous by construction: the general mix's derandomized sample
    drew 9 async runs of 64 once the speculating ones pressed the pool),
    every run starting with two turns of a conversation whose first turn is
    aborted in flight before pool pressure (``next_turn``'s pressed variant:
    it draws whether to press, so runs that draw "no" are not counted)."""

    def _preemptible_with_drafts(self) -> bool:
        return False  # no drafts press before the turns: this measures next_turn alone

    # No images either: the draw they add to add_request moved the
    # derandomized sample the same way (8 of 41 pressed runs).
    draws_images = False

    def reset_prefix_cache(self, data: st.DataObject) -> None:  # type: ignore[override]
        """Not a rule here: this measures next_turn alone (a rule the sample
        did not have moved its derandomized draws: 8 of 41 pressed runs)."""

    def share_image(self, data: st.DataObject) -> None:  # type: ignore[override]
        """Not a rule here either (no images: see draws_images)."""

    def config_draws(self, failing_load: bool):  # type: ignore[no-untyped-def]
        return machine_configs(configs=scheduler_draws(
            layouts=scheduler_layouts(weights=(6, 2, 2, 1, 2, 0)), asynchronous=True, producers=True, speculative=True,
            asynchronous_only=True))

    @initialize(target=SchedulerMachine.prefixes, data=st.data())
    def build(self, data: st.DataObject) -> tuple[int, ...]:  # type: ignore[override]
        prefix = SchedulerMachine.build(self, False, data)
        if self._live() and self.harness.draw.async_scheduling:
            self.next_turn(prefix, data)
        return prefix


def test_pressed_turns_are_partly_evicted() -> None:
    n, reach = _reach(PressedTurnMachine, "pressed-turn runs")
    pressed = reach[target_scheduler.PRESSED]
    partly = reach[target_scheduler.PARTLY_EVICTED]
    assert pressed >= MIN_PRESSED * n, f"a turn pressed in {pressed} of {n} runs"
    assert partly >= MIN_PARTLY_EVICTED * pressed, f"part of the turn evicted in {partly} of {pressed} pressed runs"


class DraftingMachine(SchedulerMachine):
    """The machine on speculating configurations where vLLM may preempt a
    decoding request (``drafting_configs``): every run presses the pool
    (``press_with_drafts``) after its first request."""

    def config_draws(self, failing_load: bool):  # type: ignore[no-untyped-def]
        return drafting_configs()

    @initialize(target=SchedulerMachine.prefixes, data=st.data())
    def build(self, data: st.DataObject) -> tuple[int, ...]:  # type: ignore[override]
        return SchedulerMachine.build(self, False, data)


def test_drafts_pressing_the_pool_preempt_a_request_holding_drafts() -> None:
    n, reach = _reach(DraftingMachine, "drafting runs")
    pressed = reach[target_scheduler.DRAFTS_PRESSED]
    preempted = reach[target_scheduler.DRAFTS_PREEMPTED]
    assert pressed >= MIN_DRAFTS_PRESSED * n, f"drafts pressed the pool in {pressed} of {n} drafting runs"
    assert preempted >= MIN_DRAFTS_PREEMPTED * pressed, (
        f"a request holding drafts preempted in {preempted} of {pressed} pressed runs"
    )


def test_failing_load_runs_reach_the_failed_load_states() -> None:
    n, reach = _reach(FailingLoadMachine, "failing-load runs")
    failed = (reach["connector: sync load failed, policy fail"] + reach["connector: sync load failed, policy recompute"]) / n
    aborted = reach[f"{runner.ABORTED_DURING_FAILED_LOAD}, policy fail"] / n
    recomputed = reach["connector: sync load failed, policy recompute"] / n
    assert failed >= MIN_SYNC_LOAD_FAILED, f"a sync load failed block by block in {failed:.1%} of {n} failing-load runs"
    assert aborted >= MIN_ABORTED_UNDER_FAIL, (
        f"an abort during a failing sync load's step under 'fail' in {aborted:.1%} of {n} failing-load runs"
    )
    assert recomputed >= MIN_RECOMPUTED, f"a failed sync load under 'recompute' in {recomputed:.1%} of {n} runs"
