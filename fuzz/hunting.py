"""Run a property under an explicit budget and return the first violation.

Used by the self-tests (a planted bug must be found), the benchmark (seconds
to find it, examples per second) and the campaign, which builds its
Hypothesis tests with :func:`property_test` too. Independent of the active
settings profile: the budget, seed and phases are given explicitly, and no
example database is used unless one is passed.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from fuzz.model import InvariantViolation

__all__ = ["HuntResult", "budget_settings", "hunt", "property_test", "settle_heap", "without_module_constants"]

T = TypeVar("T")


@dataclass(frozen=True)
class HuntResult:
    violation: InvariantViolation | None
    seconds: float  # wall time until the violation was raised (or the budget ran out)
    examples: int  # examples run, shrinking included

    @property
    def found(self) -> bool:
        return self.violation is not None


@contextlib.contextmanager
def without_module_constants() -> Iterator[None]:
    """Hypothesis (6.170) mixes literal constants mined from every loaded
    module of the project into generation, so a seeded run's examples depend
    on what else the process imported. Inside this block it mines none: a
    seeded run then draws the same examples whatever was imported."""
    from hypothesis.internal.conjecture import providers

    saved = providers._get_local_constants
    providers._get_local_constants = lambda: providers.Constants()
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = saved
        providers.CONSTANTS_CACHE.cache.clear()


def budget_settings(
    *, max_examples: int, phases: list[Phase], database: object = None, print_blob: bool = False,
    report_multiple_bugs: bool = False, verbosity: Verbosity = Verbosity.normal,
) -> settings:
    """Settings for a run whose budget is given explicitly (independent of the
    active profile): no deadline, every health check off, first bug only
    unless ``report_multiple_bugs``."""
    return settings(
        verbosity=verbosity,
        max_examples=max_examples,
        database=database,
        deadline=None,
        phases=phases,
        derandomize=False,
        print_blob=print_blob,
        report_multiple_bugs=report_multiple_bugs,
        suppress_health_check=list(HealthCheck),
    )


def property_test(
    *,
    settings: settings,
    strategy: st.SearchStrategy[Any] | None = None,
    body: Callable[[Any], None] | None = None,
    machine: type[RuleBasedStateMachine] | None = None,
    seed: int | None = None,
    database_key: bytes | None = None,
    wrap: Callable[[Callable[..., None]], Callable[..., None]] | None = None,
) -> Callable[[], None]:
    """The Hypothesis test of ``body`` on examples of ``strategy``, or of the
    state machine ``machine``, ready to call.

    ``wrap`` gets the function Hypothesis calls once per example (for a
    state machine: one whole run) and returns its replacement, e.g. to count
    examples; ``database_key`` fixes the key under which the example database
    keeps this test's examples (default: Hypothesis's digest of the source).
    """
    if machine is not None:
        test = get_state_machine_test(machine, settings=settings)
    else:
        assert strategy is not None and body is not None, "a strategy and a body, or a machine"
        check = body

        def example(value: Any) -> None:  # one argument, whatever the body's signature
            check(value)

        test = settings(given(strategy)(example))
    if wrap is not None:
        # Hypothesis's documented hook for wrapping what runs each example.
        test.hypothesis.inner_test = wrap(test.hypothesis.inner_test)  # type: ignore[attr-defined]
    if seed is not None:
        test = hyp_seed(seed)(test)
    if database_key is not None:
        test._hypothesis_internal_database_key = database_key  # type: ignore[attr-defined]
    return test


def hunt(
    body: Callable[[T], None] | None = None,
    strategy: st.SearchStrategy[T] | None = None,
    *,
    machine: type[RuleBasedStateMachine] | None = None,
    max_examples: int = 1000,
    seed: int | None = 0,
    shrink: bool = False,
) -> HuntResult:
    """Run ``body`` on examples of ``strategy`` (or the state machine
    ``machine``) until an InvariantViolation.

    ``seed=None`` draws randomly; an int makes the run reproducible. With
    ``shrink=False`` the clock stops at the first failing example, which is
    what "time to find" means; ``shrink=True`` returns the minimal example's
    violation instead.
    """
    count = 0

    def counting(inner: Callable[..., None]) -> Callable[..., None]:
        def counted(*args: Any, **kwargs: Any) -> None:
            nonlocal count
            count += 1
            inner(*args, **kwargs)

        return counted

    phases = [Phase.generate, Phase.target] + ([Phase.shrink] if shrink else [])
    test = property_test(settings=budget_settings(max_examples=max_examples, phases=phases), strategy=strategy,
                         body=body, machine=machine, seed=seed, wrap=counting)
    start = time.perf_counter()
    try:
        test()
    except InvariantViolation as exc:
        return HuntResult(exc, time.perf_counter() - start, count)
    return HuntResult(None, time.perf_counter() - start, count)


def settle_heap() -> None:
    """Once a fuzzing process has imported vLLM and built its first
    configurations: move the ~650,000 objects start-up left into the
    permanent generation (:func:`gc.freeze`), so that no full collection
    walks them again (each took about 0.4 s, one every few seconds of
    machine examples: scripts/gc_settle.py, docs/campaign-profile.md). A
    second call freezes what the first left."""
    gc.collect()
    gc.freeze()
