"""Running scheduler scenarios on a real vLLM ``Scheduler`` (no Hypothesis
decorators here; the targets and benchmarks wrap these).

:func:`run_single_shot` fills the prefix cache through real requests, lets
blocks leave through real paths (LRU pressure on a small pool, request churn,
preemption), optionally evicts by hand (the labelled shortcut), replays one
request with a drawn external answer, checks every invariant after every step
and the pool once everything has finished.

:data:`REACH` counts, per example, which branches were reached;
:func:`reach_labels` is the single definition of those labels.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import event, target
from hypothesis import note as _hypothesis_note
from hypothesis.control import currently_in_test_context

from fuzz import adapter
from fuzz.adapter import AdmissionObservation, SchedulerHarness, StepObservation
from invariants.classification import Behaviour, behaviour_of
from invariants.scheduler import (
    ADMISSION_CHECKS,
    STEP_CHECKS,
    check_no_leaked_blocks,
    check_step,
    known_vllm_bug,
)
from strategies.scheduler import SingleShotScenario

__all__ = [
    "ALL_CHECKS",
    "REACH",
    "REJECTIONS",
    "bench_scheduler",
    "build_harness",
    "reach_labels",
    "run_single_shot",
    "time_to_find",
]

ALL_CHECKS: tuple[Callable[..., None], ...] = (
    *STEP_CHECKS,
    *ADMISSION_CHECKS,
    check_no_leaked_blocks,
)

# Per example: how many examples reached each label ("examples" = total).
REACH: Counter[str] = Counter()
# Configurations vLLM refused, by reason.
REJECTIONS: Counter[str] = Counter()

def note(text: str) -> None:
    """``hypothesis.note`` inside a test; nothing outside (a plain replay)."""
    if currently_in_test_context():
        _hypothesis_note(text)


TRUNCATION = "truncation branch"
FALLBACK = "divergent-hit fallback"
MAX_STEPS_PER_PHASE = 160


def _group_index(adm: AdmissionObservation, behaviour: Behaviour, kind: str | None = None) -> int | None:
    for g in adm.groups:
        if not g.prefix_cacheable:
            continue
        if kind is not None and not g.spec_class.endswith("." + kind):
            continue
        if behaviour_of(g.spec_class) is behaviour:
            return g.index
    return None


def fa_mamba_gap(adm: AdmissionObservation) -> int | None:
    """Full-attention hit minus Mamba hit, from the side per-group lookup."""
    fa = _group_index(adm, Behaviour.MUST_COVER, "FullAttentionSpec")
    mamba = _group_index(adm, Behaviour.MAY_BE_SHORT)
    if fa is None or mamba is None:
        return None
    return adm.per_group_hits[fa] - adm.per_group_hits[mamba]


def reach_labels(step: StepObservation) -> set[str]:
    """The branch labels one step reached."""
    labels: set[str] = set()
    if step.preempted:
        labels.add("preemption")
    if step.error:
        labels.add("loud failure on over-report" if step.dishonest_replies else "exception")
    for adm in step.admissions:
        if adm.truncated_at is not None:
            labels.add(TRUNCATION)
        if adm.fell_back:
            labels.add(FALLBACK)
        if adm.resumed:
            labels.add("resumed after preemption" + (" with a local hit" if adm.local_hit else ""))
        if adm.partial_tail:
            labels.add("sub-block local hit")
            if adm.reply is not None and 0 < adm.reply <= adm.partial_tail:
                labels.add("partial tail kept")
        if adm.reply == 0:
            labels.add("no connector hit")
        elif adm.reply is None:
            labels.add("connector undecided")
        if not adm.reply_honest:
            labels.add("over-report")
        if adm.reply_async:
            labels.add("async load")
        if adm.alloc_local_tokens is not None and not adm.alloc_ok:
            labels.add("admission refused (pool full)")
        gap = fa_mamba_gap(adm)
        if gap is not None and gap > 0:
            labels.add("hits diverge: FA deeper than Mamba")
        elif gap is not None and gap < 0:
            labels.add("hits diverge: Mamba deeper than FA")
        if len(set(adm.per_group_hits)) > 1 and adm.per_group_hits and min(adm.per_group_hits) > 0:
            labels.add("hits diverge: a group lags, none empty")
    return labels


def build_harness(config: adapter.SchedulerDraw, *, record: bool = True) -> SchedulerHarness | None:
    """The harness, or None (with an event) when vLLM refuses the config."""
    try:
        return SchedulerHarness(config)
    except adapter.InvalidLayout as exc:
        reason = str(exc).split(";")[0][:80]
        if record:
            REJECTIONS[reason] += 1
            event(f"config rejected by vLLM: {reason}")
        return None


class _Run:
    """Steps a harness, checking and labelling every step."""

    def __init__(self, harness: SchedulerHarness, checks: tuple[Callable[..., None], ...], context: str) -> None:
        self.harness = harness
        self.checks = checks
        self.context = context
        self.labels: set[str] = set()
        self.max_gap = 0
        self.known_bug: str | None = None

    def step(self) -> StepObservation:
        obs = self.harness.step(self.context)
        self.labels |= reach_labels(obs)
        known = known_vllm_bug(obs)
        if known is not None:
            # Pinned by a strict xfail; the scheduler is unusable after it.
            self.labels.add(f"known vLLM bug: {known}")
            self.known_bug = known
            return obs
        for adm in obs.admissions:
            gap = fa_mamba_gap(adm)
            if gap is not None:
                self.max_gap = max(self.max_gap, gap)
        check_step(obs, self.checks)
        return obs

    def drain(self, max_steps: int = MAX_STEPS_PER_PHASE) -> None:
        steps = 0
        while self.harness.live_request_ids and not self.harness.broken and steps < max_steps:
            self.step()
            steps += 1
        if self.harness.live_request_ids and not self.harness.broken:
            # A request the pool can never hold, or one still waiting: end it.
            self.labels.add("stalled; aborted")
            for rid in self.harness.live_request_ids:
                self.harness.abort(rid)
            while self.harness.live_request_ids and not self.harness.broken and steps < 2 * max_steps:
                self.step()
                steps += 1


def run_single_shot(
    scenario: SingleShotScenario,
    checks: Iterable[Callable[..., None]] = ALL_CHECKS,
    *,
    record: bool = True,
) -> set[str] | None:
    """Run one single-shot scenario, checking ``checks`` after every step.

    Returns the branch labels reached (None when vLLM refused the config).
    With ``record`` the labels are emitted as Hypothesis events and counted
    in :data:`REACH`.
    """
    checks = tuple(checks)
    context = repr(scenario)
    note(f"scenario: {context}")
    harness = build_harness(scenario.config, record=record)
    if harness is None:
        if record:
            REACH["examples"] += 1
            REACH["config rejected"] += 1
        return None
    run = _Run(harness, checks, context)
    for i, fill in enumerate(scenario.fills):
        harness.add_request(scenario.fill_tokens(i), max_tokens=fill.max_tokens, reply=fill.reply)
        if not scenario.concurrent:
            run.drain()
    run.drain()
    if scenario.probe is not None and not harness.broken:
        harness.add_request(scenario.probe_tokens(), max_tokens=scenario.probe.max_tokens, reply=scenario.probe.reply)
        run.drain()
    if scenario.uses_shortcut and not harness.broken:
        assert scenario.evict_from is not None
        cached = harness.per_group_cached_block_ids(scenario.replay_tokens())
        victims: set[int] = set()
        for group, cut in enumerate(scenario.evict_from):
            if cut is not None and cached[group]:
                victims.update(cached[group][cut % (len(cached[group]) + 1) :])
        if victims:
            run.labels.add("evict shortcut")
            note(f"evict shortcut: evict_blocks({sorted(victims)})")
            harness.evict_shortcut(victims)
    if not harness.broken:
        for _ in range(scenario.replay_copies):
            harness.add_request(
                scenario.replay_tokens(), max_tokens=scenario.replay.max_tokens, reply=scenario.replay.reply
            )
        run.drain()
    if check_no_leaked_blocks in checks and not harness.broken:
        check_no_leaked_blocks(harness.pool_observation(context))
    if harness.partial_hits_enabled:
        run.labels.add("partial hits enabled")
    if record:
        REACH["examples"] += 1
        for label in sorted(run.labels):
            REACH[label] += 1
            event(label)
        target(float(run.max_gap), label="FA-Mamba hit gap")
    return run.labels


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------


def _drive(
    seconds: float | None,
    max_examples: int,
    body: Callable[[SingleShotScenario], None],
    *,
    seed: int | None,
    shortcut: bool = False,
) -> tuple[int, BaseException | None]:
    """Feed generated single-shot scenarios (the CI target's: real paths,
    honest answers, unless ``shortcut``) to ``body`` (no shrinking) until
    ``seconds`` pass, ``max_examples`` ran, or ``body`` raises."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from strategies.scheduler import single_shot_scenarios

    class _TimeUp(Exception):
        pass

    count = 0
    start = time.perf_counter()

    @settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(scenario=single_shot_scenarios(shortcut=shortcut, allow_over=False))
    def drive(scenario: SingleShotScenario) -> None:
        nonlocal count
        if seconds is not None and time.perf_counter() - start > seconds:
            raise _TimeUp
        count += 1
        body(scenario)

    if seed is not None:
        drive = hseed(seed)(drive)
    try:
        drive()
    except _TimeUp:
        return count, None
    except Exception as exc:  # noqa: BLE001 - the caller decides what it means
        return count, exc
    return count, None


def bench_scheduler(seconds: float = 10.0, *, seed: int | None = 0, seeds: int | None = None) -> dict[str, Any]:
    """Run the CI single-shot target's scenarios (real paths only) on
    unmodified vLLM for ``seconds``.

    Returns ``examples``, ``examples_per_s``, ``wall_s``, ``vllm_s`` (time
    inside ``schedule()`` and ``update_from_output()``), ``vllm_share``, the
    shares of examples reaching the truncation branch and the divergent-hit
    fallback, and the reach counts of the run. With ``seeds``, also the
    median seconds and examples to find the planted pre-PR-51468 assert
    (:func:`time_to_find`) over that many seeds.
    """
    vllm_s = 0.0
    before = Counter(REACH)
    original_step = SchedulerHarness.step

    def timed_step(self: SchedulerHarness, context: str = "") -> StepObservation:
        nonlocal vllm_s
        t0 = self.vllm_seconds
        result = original_step(self, context)
        vllm_s += self.vllm_seconds - t0
        return result

    SchedulerHarness.step = timed_step  # type: ignore[method-assign]
    start = time.perf_counter()
    try:
        count, error = _drive(seconds, 10**9, lambda s: run_single_shot(s), seed=seed)
    finally:
        SchedulerHarness.step = original_step  # type: ignore[method-assign]
    wall = time.perf_counter() - start
    reach = REACH - before
    n = reach["examples"] or 1
    result: dict[str, Any] = {
        "examples": count,
        "wall_s": round(wall, 3),
        "examples_per_s": round(count / wall, 2) if wall else 0.0,
        "vllm_s": round(vllm_s, 3),
        "vllm_share": round(vllm_s / wall, 3) if wall else 0.0,
        "truncation_share": round(reach[TRUNCATION] / n, 3),
        "fallback_share": round(reach[FALLBACK] / n, 3),
        "error": None if error is None else f"{type(error).__name__}: {error}"[:500],
        "reach": {k: v for k, v in sorted(reach.items())},
    }
    if seeds:
        found = [time_to_find("pre_fix_assert_all", seed=k) for k in range(seeds)]
        hits = [f for f in found if f["found"]]
        result["pre_fix_assert_found"] = f"{len(hits)}/{seeds} seeds"
        if hits:
            result["pre_fix_assert_median_s"] = statistics.median(f["seconds"] for f in hits)
            result["pre_fix_assert_median_examples"] = statistics.median(f["examples"] for f in hits)
    return result


def time_to_find(
    bug: str = "pre_fix_assert_all",
    *,
    max_examples: int = 2_000,
    seed: int | None = 0,
    seconds: float | None = 120.0,
) -> dict[str, Any]:
    """Time the single-shot fuzzer (the CI target's strategy: real paths
    only) takes to find a planted scheduler bug, e.g. the pre-PR-51468
    all-groups assert (``"pre_fix_assert_all"``); names in
    :data:`fuzz.adapter.PLANTED_SCHEDULER_BUGS`.

    Returns ``found``, ``examples`` (until the first violation), ``seconds``
    and the ``invariant`` that caught it.
    """
    from invariants.truncation import InvariantViolation

    start = time.perf_counter()
    with adapter.planted_scheduler_bug(bug):
        count, error = _drive(seconds, max_examples, lambda s: run_single_shot(s, record=False), seed=seed)
    elapsed = time.perf_counter() - start
    found = isinstance(error, InvariantViolation)
    return {
        "bug": bug,
        "found": found,
        "examples": count,
        "seconds": round(elapsed, 3),
        "invariant": error.invariant if found else None,
        "error": None if error is None or found else f"{type(error).__name__}: {error}"[:500],
    }
