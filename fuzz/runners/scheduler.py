"""Running scheduler scenarios on a real vLLM ``Scheduler`` (no Hypothesis
decorators here; the targets and benchmarks wrap these).

:class:`Stepper` is the one step loop of every scheduler run, single-shot or
stateful: it steps the harness, labels the branches reached, runs the checks
and reports every violation except those that are known vLLM bugs of the
installed release (:mod:`fuzz.known_bugs`), which it labels instead.

:func:`run_fixed` plays a :class:`fuzz.model.FixedRun`, the hand-written
run beside a planted bug the search rarely meets.

:func:`run_single_shot` fills the prefix cache through real requests, lets
blocks leave through real paths (LRU pressure on a small pool, request churn,
preemption), optionally evicts by hand (the labelled shortcut), replays one
request with a drawn external answer, checks every invariant after every step
and the pool once everything has finished.

:data:`REACH` counts, per example, which branches were reached;
:func:`reach_labels` is the single definition of those labels.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from hypothesis import event, target
from hypothesis import note as _hypothesis_note
from hypothesis.control import currently_in_test_context

from fuzz import adapter, known_bugs, telemetry
from fuzz.adapter import SchedulerHarness
from fuzz.model import (
    AdmissionObservation,
    Behaviour,
    FixedPrompt,
    FixedRun,
    InvariantViolation,
    SchedulerDraw,
    SingleShotScenario,
    StepObservation,
    group_behaviour,
)
from invariants.scheduler import (
    ADMISSION_CHECKS,
    STEP_CHECKS,
    check_no_leaked_blocks,
    step_violations,
)

__all__ = [
    "ALL_CHECKS",
    "CACHED_BLOCK_EVICTED",
    "NO_PROGRESS",
    "REACH",
    "Stepper",
    "carrying_oplog",
    "build_harness",
    "checks_for",
    "note",
    "reach_labels",
    "run_fixed",
    "run_single_shot",
    "triage",
]

ALL_CHECKS: tuple[Callable[..., None], ...] = (
    *STEP_CHECKS,
    *ADMISSION_CHECKS,
    check_no_leaked_blocks,
)


def checks_for(draw: SchedulerDraw, checks: tuple[Callable[..., None], ...]) -> tuple[Callable[..., None], ...]:
    """``checks`` as a run of ``draw`` can be judged by them: the
    connector's claims judge its records, so a run without a KV connector
    leaves them out."""
    return checks if draw.connector else tuple(c for c in checks if c.__module__ != "invariants.connector")


# Per example: how many examples reached each label ("examples" = total).
REACH: Counter[str] = Counter()


def note(text: str) -> None:
    """``hypothesis.note`` inside a test; nothing outside (a plain replay)."""
    if currently_in_test_context():
        _hypothesis_note(text)


TRUNCATION = "truncation branch"
FALLBACK = "divergent-hit fallback"
SKIPPED = "request skipped the prefix cache"
ASYNC_SCHEDULER = "async scheduler"
FED_LATE = "step fed back one step late"
PREFILL_HELD = "prefill held back (prefill_schedule_interval)"
STALE_OUTPUT = "stale output of a request preempted during its step"
# An allocation evicted a cached block (the eviction-order claim judges it).
CACHED_BLOCK_EVICTED = "cached block evicted"
# A request finished (aborted) while the model ran the step that reports its load failed.
ABORTED_DURING_FAILED_LOAD = "connector: load failed, its request aborted during the step"
# Steps kept scheduling work that got no request further, longer than any
# recovery takes (SchedulerHarness.going_nowhere): the run is ended there.
NO_PROGRESS = "no progress; aborted"
MAX_STEPS_PER_PHASE = 160


def _group_index(adm: AdmissionObservation, behaviour: Behaviour, kind: str | None = None) -> int | None:
    for g in adm.groups:
        if kind is not None and not g.spec_class.endswith("." + kind):
            continue
        if g.prefix_cacheable and group_behaviour(g) is behaviour:
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
    if step.async_scheduling:
        labels.add(ASYNC_SCHEDULER)
    if step.fed_late:
        labels.add(FED_LATE)
    if step.prefill_held:
        labels.add(PREFILL_HELD)
    if step.preempted:
        labels.add("preemption")
    if step.evictions:
        labels.add(CACHED_BLOCK_EVICTED)
    if step.stale_outputs:
        labels.add(STALE_OUTPUT)
    if step.error:
        labels.add("loud failure on over-report" if step.dishonest_replies else "exception")
    # The connector protocol's branches (invariants/connector.py).
    for alloc in step.connector_allocs:
        if alloc.asked_with is None:
            labels.add("connector: async load landed, allocated again")
        elif alloc.num_external_tokens:
            labels.add("connector: async load started" if alloc.reply_async else "connector: sync load")
    if any(not meta.num_scheduled for meta in step.connector_metas):
        labels.add("connector: metadata for an empty step")
    if step.connector_finishes:
        labels.add("connector: request finished")
    for f in step.failed_loads:
        labels.add(f"connector: {'async' if f.how == 'failed_recving' else 'sync'} load failed, policy {f.policy}"
                   + (", landed" if f.stage == "landed" else ""))
        if f.stage == "reported" and f.status_before.startswith("FINISHED"):
            labels.add(f"{ABORTED_DURING_FAILED_LOAD}, policy {f.policy}")
    for adm in step.admissions:
        if adm.truncated_at is not None:
            labels.add(TRUNCATION)
        if adm.fell_back:
            labels.add(FALLBACK)
        if adm.skips_prefix_cache and adm.admitted:
            labels.add(SKIPPED)
            if (adm.reply or 0) > 0 or any(adm.per_group_hits):
                labels.add(SKIPPED + " past a hit")
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
        if adm.reply_async and not adm.skips_prefix_cache:  # a skipping request's answer is dropped
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


def build_harness(config: SchedulerDraw, *, record: bool = True) -> SchedulerHarness | None:
    """The harness, or None (with an event) when vLLM refuses the config."""
    try:
        return SchedulerHarness(config)
    except adapter.InvalidLayout as exc:
        if record:
            event(f"config rejected by vLLM: {str(exc).split(';')[0][:80]}")
        return None


def triage(
    step: StepObservation, checks: tuple[Callable[..., None], ...] | None = None
) -> tuple[list[InvariantViolation], list[str]]:
    """The step's violations cut to their instances that are no known vLLM
    bug of the installed release (:func:`fuzz.known_bugs.sort_out`), and the
    ids of the known bugs the other instances show."""
    unknown: list[InvariantViolation] = []
    known: list[str] = []
    for violation in step_violations(step, checks):
        if not known_bugs.suppressing():
            unknown.append(violation)
            continue
        bug_ids, rest = known_bugs.sort_out(violation, adapter.VLLM_VERSION)
        if rest is not None:
            unknown.append(rest)
        for bug_id in bug_ids:
            if bug_id not in known:
                known.append(bug_id)
                telemetry.set_aside(bug_id)
    return unknown, known


@contextlib.contextmanager
def carrying_oplog(harness: SchedulerHarness) -> Iterator[None]:
    """A violation raised inside carries ``harness``'s operation log, the
    failing run's (the repro writer's input), unless it carries one already."""
    try:
        yield
    except InvariantViolation as exc:
        if exc.oplog is None:
            exc.oplog = harness.oplog
        raise


class Stepper:
    """Steps a harness: labels each step, runs ``checks`` on it, and raises
    the first violation that is not a known vLLM bug of this release. A
    known bug's violation alone is set aside (labelled, in :attr:`known`);
    every other check of the same step still runs and reports."""

    def __init__(self, harness: SchedulerHarness, checks: tuple[Callable[..., None], ...], context: str = "") -> None:
        self.harness = harness
        self.checks = checks
        self.context = context
        self.labels: set[str] = set()  # every label so far
        self.last_labels: set[str] = set()  # the last step's
        self.max_gap = 0
        self.known: set[str] = set()  # ids of the known bugs seen
        self.failed = False  # a step raised a violation: the run is over
        self.hits: list[int] = []  # the local hit of every admission so far, in order

    def step(self) -> StepObservation:
        obs = self.harness.step(self.context)
        self.hits += [adm.local_hit for adm in obs.admissions if adm.admitted]
        labels = reach_labels(obs)
        for adm in obs.admissions:
            gap = fa_mamba_gap(adm)
            if gap is not None:
                self.max_gap = max(self.max_gap, gap)
        if self.harness.going_nowhere:
            labels.add(NO_PROGRESS)
        unknown, known = triage(obs, self.checks)
        labels.update(f"known vLLM bug: {bug_id}" for bug_id in known)
        telemetry.example_labels(labels)  # the example's, for the schedule's label pairs
        self.known.update(known)
        self.labels |= labels
        self.last_labels = labels
        if unknown:
            self.failed = True
            unknown[0].oplog = self.harness.oplog
            raise unknown[0]
        return obs

    def _busy(self) -> bool:
        return bool(self.harness.live_request_ids) or self.harness.has_pending_output

    def drain(self, max_steps: int = MAX_STEPS_PER_PHASE) -> None:
        steps = 0
        # An output still pending (async scheduling) is fed before idling.
        # A stall (steps with nothing to do) ends it early: later steps
        # would change nothing.
        # A loop of preemptions that gets no request further ends it too.
        while (self._busy() and not self.harness.broken and not self.harness.stalled
               and not self.harness.going_nowhere and steps < max_steps):
            self.step()
            steps += 1
        if self.harness.live_request_ids and not self.harness.broken:
            # A request the pool can never hold, or one still waiting: end it.
            self.labels.add(NO_PROGRESS if self.harness.going_nowhere else "stalled; aborted")
            for rid in self.harness.live_request_ids:
                self.harness.abort(rid)
        # What is left (an output still pending: it returns an aborted
        # request's deferred frees) is served whether or not the run went
        # anywhere.
        while self._busy() and not self.harness.broken and steps < 2 * max_steps:
            self.step()
            steps += 1


def run_single_shot(
    scenario: SingleShotScenario,
    checks: Iterable[Callable[..., None]] = ALL_CHECKS,
    *,
    record: bool = True,
    on_harness: Callable[[SchedulerHarness], None] | None = None,
) -> set[str] | None:
    """Run one single-shot scenario, checking ``checks`` after every step.

    Returns the branch labels reached (None when vLLM refused the config).
    With ``record`` the labels are emitted as Hypothesis events and counted
    in :data:`REACH`. ``on_harness`` is handed the harness once built (its
    operation log is the run's; a failure carries it too).
    """
    checks = tuple(checks)
    context = repr(scenario)
    note(f"scenario: {context}")
    harness = build_harness(scenario.config, record=record)
    if harness is not None and on_harness is not None:
        on_harness(harness)
    if harness is None:
        if record:
            REACH["examples"] += 1
            REACH["config rejected"] += 1
        return None
    run = Stepper(harness, checks, context)
    with carrying_oplog(harness):
        _run_scenario(scenario, harness, run, checks, context)
    if harness.partial_hits_enabled:
        run.labels.add("partial hits enabled")
    if record:
        REACH["examples"] += 1
        for label in sorted(run.labels):
            REACH[label] += 1
            event(label)
        target(float(run.max_gap), label="FA-Mamba hit gap")
    return run.labels


def _run_scenario(
    scenario: SingleShotScenario,
    harness: SchedulerHarness,
    run: Stepper,
    checks: tuple[Callable[..., None], ...],
    context: str,
) -> None:
    """The scenario's requests, eviction and replays, stepped by ``run``."""
    for i, fill in enumerate(scenario.fills):
        harness.add_request(
            scenario.fill_tokens(i),
            max_tokens=fill.max_tokens,
            reply=fill.reply,
            skip_reading_prefix_cache=fill.skip_reading_prefix_cache,
        )
        if not scenario.concurrent:
            run.drain()
    run.drain()
    if scenario.probe is not None and not harness.broken:
        probe = scenario.probe
        harness.add_request(
            scenario.probe_tokens(),
            max_tokens=probe.max_tokens,
            reply=probe.reply,
            skip_reading_prefix_cache=probe.skip_reading_prefix_cache,
        )
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
                scenario.replay_tokens(),
                max_tokens=scenario.replay.max_tokens,
                reply=scenario.replay.reply,
                skip_reading_prefix_cache=scenario.replay.skip_reading_prefix_cache,
            )
        run.drain()
    if check_no_leaked_blocks in checks and not harness.broken:
        check_no_leaked_blocks(harness.pool_observation(context))


def run_fixed(run: FixedRun, checks: Iterable[Callable[..., None]]) -> Stepper:
    """Play ``run`` on a fresh harness with ``checks`` after every step (the
    first violation raises, carrying the operation log), then assert that
    it shows what it was written to show (``FixedRun.hits``, ``events``,
    ``label``, a reset that succeeded): a run that no longer meets its case
    fails loudly instead of passing for want of a trigger."""
    harness = SchedulerHarness(run.config)
    stepper = Stepper(harness, tuple(checks))

    def add(prompt: FixedPrompt) -> None:
        harness.add_request(prompt.tokens, max_tokens=prompt.max_tokens, cache_salt=prompt.cache_salt,
                            lora=prompt.lora, embeds=prompt.embeds, mm=prompt.mm, reply=prompt.reply)

    if not run.one_after_another:
        for prompt in run.prompts:
            add(prompt)
    else:
        for i, prompt in enumerate(run.prompts):
            add(prompt)
            if i == run.reset_during:
                stepper.step()  # admits it
                stepper.step()
                harness.reset_prefix_cache(reset_running=True)
            stepper.drain()
    stepper.drain()
    shown = f"the fixed run {run!r} no longer meets its case"
    assert run.hits is None or tuple(stepper.hits) == run.hits, f"{shown}: admissions hit {stepper.hits}"
    events = harness.observer.events
    for name, least in run.events:
        seen = 0 if events is None else events.events_seen[name]
        assert seen >= least, f"{shown}: {seen} {name} events"
    assert run.label is None or run.label in stepper.labels, f"{shown}: labels {sorted(stepper.labels)}"
    assert run.reset_during is None or (harness.resets and all(ok for _, ok in harness.resets)), (
        f"{shown}: resets {harness.resets}")
    return stepper
