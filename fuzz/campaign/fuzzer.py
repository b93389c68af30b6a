"""One worker slot fuzzing its targets: slices of fresh generation that
follow discovery (:mod:`fuzz.campaign.schedule`), and a replay whenever the
shared database holds something new.

Each slice is one Hypothesis run of one target (:func:`fuzz.hunting.property_test`):

- **Generation** (generate, target and shrink phases) runs *without* the
  example database: with one, Hypothesis keeps a pareto front of every
  example's ``target()`` scores in it, which took a quarter to over a third
  of a worker's time here (docs/campaign-profile.md) for a corpus nothing
  here replays. A
  failure found this way is saved to the database by hand (its
  ``@reproduce_failure`` choices) under the target's key.
- **Replay** (reuse and shrink phases, with the database) runs only when the
  target's database key holds entries this slot has not seen: what another
  worker or runner found, or what the last run left. Hypothesis replays each
  entry (and drops those that no longer fail); nothing is replayed twice.

A failure whose key is already known (:class:`~fuzz.campaign.findings.Findings`)
is counted as an example and not shrunk again; generation goes on. A target
stops after five distinct failures.
"""

from __future__ import annotations

import contextlib
import time
import unittest
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from hypothesis import Phase, Verbosity
from hypothesis.database import ExampleDatabase
from hypothesis.errors import HypothesisException

from fuzz import telemetry
from fuzz.campaign.config import CampaignConfig
from fuzz.campaign.databases import DatabaseUnavailable, check_database
from fuzz.campaign.findings import Findings, failing_choices
from fuzz.campaign.progress import Progress
from fuzz.campaign.novelty import features
from fuzz.campaign.schedule import DiscoverySchedule, Turn
from fuzz.hunting import budget_settings, property_test, settle_heap
from fuzz.model import HarnessError
from fuzz.outcomes import Outcome, classify
from fuzz.registry import get_target

__all__ = ["TargetFuzzer", "database_key", "run_slot"]

MAX_FAILURES_PER_TARGET = 5
GENERATE = [Phase.generate, Phase.target, Phase.shrink]
REPLAY = [Phase.reuse, Phase.shrink]


class _SliceOver(BaseException):
    """The slice has had its time (never raised while a failure is being shrunk)."""


def database_key(target: str) -> bytes:
    """The key of a target's examples in the shared database: the target's name,
    so every worker, runner and version of this code shares it."""
    return f"kvtrunc-fuzz campaign: {target}".encode()


def slice_seed(campaign_seed: int | None, slot: int, index: int) -> int | None:
    """Slice ``index`` of a target on ``slot``: ``seed*1000003 + slot*10007 + index``."""
    return None if campaign_seed is None else campaign_seed * 1_000_003 + slot * 10_007 + index


class TargetFuzzer:
    """One target on one slot."""

    def __init__(self, name: str, *, slot: int, database: ExampleDatabase | None, progress: Progress,
                 findings: Findings, campaign_seed: int | None = None) -> None:
        self.name = name
        self.slot = slot
        self.database = database
        self.progress = progress
        self.findings = findings
        self.campaign_seed = campaign_seed
        self.strategy, self.check, self.machine = get_target(name).load()
        self.key = database_key(name)
        self.seen: set[bytes] = set()  # database entries already replayed (or saved) here
        self.failures = 0  # distinct failures this fuzzer recorded
        self._examples = 0
        self._shrinking = False

    # -- replay -------------------------------------------------------------------
    def has_new_entries(self) -> bool:
        if self.database is None:
            return False
        return bool(set(self.database.fetch(self.key)) - self.seen)

    def replay(self) -> int:
        """Replay every entry under this target's key (all of them: Hypothesis
        cannot replay a chosen few), report each one that fails; return the
        examples run."""
        assert self.database is not None
        entries = list(self.database.fetch(self.key))
        # One more than the entries: Hypothesis stops at max_examples valid
        # examples, before it could drop an entry that no longer fails.
        settings = budget_settings(max_examples=len(entries) + 1, phases=REPLAY, database=self.database,
                                   print_blob=True, report_multiple_bugs=True, verbosity=Verbosity.quiet)
        self._run(settings, seed=None, swallow_known=False, stop_at=None, save=False)
        self.seen |= set(entries) | set(self.database.fetch(self.key))
        return self._examples

    # -- generation -----------------------------------------------------------
    def generate(self, turn: Turn, *, stop_at: float) -> int:
        """One slice of fresh examples (at most ``turn.examples``, stopped at
        ``stop_at`` on the monotonic clock); return the examples run."""
        # Quiet: the failure's text and blob travel on the exception; what
        # Hypothesis would print (a seed for each slice stopped) is noise.
        settings = budget_settings(max_examples=turn.examples, phases=GENERATE, print_blob=True,
                                   verbosity=Verbosity.quiet)
        self._run(settings, seed=slice_seed(self.campaign_seed, self.slot, turn.index), swallow_known=True,
                  stop_at=stop_at, save=True)
        return self._examples

    # -- one Hypothesis run -------------------------------------------------------
    def _run(self, settings: Any, *, seed: int | None, swallow_known: bool, stop_at: float | None,
             save: bool) -> None:
        self._examples = 0
        self._shrinking = False
        test = property_test(settings=settings, strategy=self.strategy, body=self.check, machine=self.machine,
                             seed=seed, database_key=self.key, wrap=self._counting(swallow_known, stop_at))
        try:
            test()
        except (_SliceOver, unittest.SkipTest):
            pass  # time is up; or a replay found nothing to replay after all
        except DatabaseUnavailable:
            raise
        except BaseExceptionGroup as group:  # several failures replayed at once
            for exc in group.exceptions:
                self._found(exc, seed, save=False)
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            self._found(exc, seed, save=save)

    def _counting(self, swallow_known: bool, stop_at: float | None) -> Callable[[Callable[..., None]], Callable[..., None]]:
        def wrap(inner: Callable[..., None]) -> Callable[..., None]:
            def counted(*args: Any, **kwargs: Any) -> None:
                self._examples += 1
                self.progress.count(self.name)
                telemetry.begin_example()
                try:
                    inner(*args, **kwargs)
                except HypothesisException:
                    raise  # assume(), an invalid draw: Hypothesis's business
                except Exception as exc:
                    if not (swallow_known and self.findings.known(self.name, exc)):
                        self._shrinking = True
                        raise
                    # else: found before, not worth another shrink
                finally:
                    telemetry.end_example()
                # Stop only after a whole example: a state machine draws as it
                # goes, and a run cut before its draws reads as flaky data.
                if stop_at is not None and not self._shrinking and time.monotonic() > stop_at:
                    raise _SliceOver

            return counted

        return wrap

    def _found(self, exc: BaseException, seed: int | None, *, save: bool) -> None:
        """A failure, judged first (:mod:`fuzz.outcomes`): a harness misfit
        stops the worker (exit 2), a refusal is counted, a violation or a
        missed hit recorded (its sidecar says which: ``outcome``)."""
        verdict = classify(exc, self.findings.vllm_version)
        if verdict.outcome is Outcome.HARNESS_ERROR:
            raise HarnessError(f"target {self.name}: {verdict.reason}") from exc
        if verdict.outcome is Outcome.CONFIG_REJECTED:
            telemetry.reject(verdict.reason.split(";")[0][:80])
            return
        meta = self.findings.record(self.name, seed, exc)
        if meta is None:
            return
        self.failures += 1
        self.progress.totals.failures.append(meta)
        self.progress.flush()
        choices = failing_choices(exc) if save and self.database is not None else None
        if choices is not None:
            assert self.database is not None
            self.database.save(self.key, choices)  # a read-only database ignores it
            self.seen.add(choices)


def run_slot(config: CampaignConfig, slot: int, targets: list[str], *, database: ExampleDatabase | None,
             progress: Progress, findings: Findings,
             slice_context: Callable[[str], AbstractContextManager[None]] | None = None) -> DiscoverySchedule | None:
    """Fuzz ``targets`` on ``slot`` for the campaign's budget (counted from
    now, so start-up comes on top), in slices that follow discovery, and
    return the schedule as it ran (each slice's target, why it got the
    slice, and how many new behaviours it found: :mod:`fuzz.campaign.novelty`);
    with ``reuse_only``, replay what the database holds (and what others
    save into it) instead, until each target has reported a failure
    or the budget ends. ``slice_context(target)`` wraps each slice (the
    coverage tracer's per-target context, :mod:`fuzz.coverage`)."""
    start = time.monotonic()
    deadline = start + config.budget
    progress.totals.startup_s.append(round(time.time() - config.start, 3))
    fuzzers: dict[str, TargetFuzzer] = {}

    def fuzzer(name: str) -> TargetFuzzer:
        if name not in fuzzers:
            fuzzers[name] = TargetFuzzer(name, slot=slot, database=database, progress=progress, findings=findings,
                                         campaign_seed=config.seed)
        return fuzzers[name]

    @contextlib.contextmanager
    def timed(name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            with slice_context(name) if slice_context is not None else contextlib.nullcontext():
                yield
        finally:
            progress.totals.seconds[name] = progress.totals.seconds.get(name, 0.0) + time.monotonic() - t0

    if config.reuse_only:
        waiting = list(targets)
        while waiting and time.monotonic() < deadline:
            check_database(database)
            for name in list(waiting):
                f = fuzzer(name)
                if f.has_new_entries():
                    with timed(name):
                        f.replay()
                    if f.failures:
                        waiting.remove(name)  # reported; replaying it again adds nothing
            if waiting:
                time.sleep(0.5)  # wait for other runners to save something
        progress.flush()
        return None

    schedule = DiscoverySchedule(list(targets), config.budget)
    seen = features()  # what start-up reached is nobody's discovery
    settled = False
    while (turn := schedule.next_turn(time.monotonic() - start)) is not None:
        check_database(database)
        f = fuzzer(turn.target)
        t0 = time.monotonic()
        with timed(turn.target):
            replay = f.has_new_entries()
            if replay:
                examples = f.replay()
            else:
                examples = f.generate(turn, stop_at=min(t0 + 2 * turn.seconds, deadline))
        seconds = time.monotonic() - t0
        reached = features()
        novelty = len(reached - seen)
        seen = reached
        schedule.record(turn, seconds=seconds, examples=examples, novelty=novelty, generated=not replay)
        if not settled and all(schedule.turns[t] for t in targets):
            settle_heap()  # every target has built its first configurations: start-up is over
            settled = True
        progress.totals.turns.setdefault(progress.worker, []).append(turn.target)
        progress.totals.slices.setdefault(progress.worker, []).append(
            [turn.target, turn.why, round(seconds, 3), examples, novelty])
        if f.failures >= MAX_FAILURES_PER_TARGET:
            schedule.finish(turn.target)
    progress.flush()
    return schedule
