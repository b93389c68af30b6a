"""Run a property under an explicit budget and return the first violation.

Used by the self-tests (a planted bug must be found), the benchmark (seconds
to find it) and the CLI. Independent of the active settings profile: the
budget, seed and phases are given explicitly, and no example database is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from invariants.truncation import InvariantViolation

__all__ = ["HuntResult", "budget_settings", "hunt"]

T = TypeVar("T")


@dataclass(frozen=True)
class HuntResult:
    violation: InvariantViolation | None
    seconds: float  # wall time until the violation was raised (or the budget ran out)
    examples: int  # examples run, shrinking included

    @property
    def found(self) -> bool:
        return self.violation is not None


def budget_settings(
    *, max_examples: int, phases: list[Phase], database: object = None, print_blob: bool = False
) -> settings:
    """Settings for a run whose budget is given explicitly (independent of the
    active profile): no deadline, every health check off, first bug only."""
    return settings(
        max_examples=max_examples,
        database=database,
        deadline=None,
        phases=phases,
        derandomize=False,
        print_blob=print_blob,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )


def hunt(
    body: Callable[[T], None],
    strategy: st.SearchStrategy[T],
    *,
    max_examples: int = 1000,
    seed: int | None = 0,
    shrink: bool = False,
) -> HuntResult:
    """Run ``body`` on examples of ``strategy`` until an InvariantViolation.

    ``seed=None`` draws randomly; an int makes the run reproducible. With
    ``shrink=False`` the clock stops at the first failing example, which is
    what "time to find" means; ``shrink=True`` returns the minimal example's
    violation instead.
    """
    count = 0

    def counted(value: T) -> None:
        nonlocal count
        count += 1
        body(value)

    phases = [Phase.generate, Phase.target] + ([Phase.shrink] if shrink else [])
    test = budget_settings(max_examples=max_examples, phases=phases)(given(strategy)(counted))
    if seed is not None:
        test = hyp_seed(seed)(test)
    start = time.perf_counter()
    try:
        test()
    except InvariantViolation as exc:
        return HuntResult(exc, time.perf_counter() - start, count)
    return HuntResult(None, time.perf_counter() - start, count)
