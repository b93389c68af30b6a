"""Search drawn scenarios, with a bug planted, until one breaks a claim.

The self-tests (a planted bug must be caught) and the repro tests (what is
caught becomes a file) share this one search: a derandomized Hypothesis run
of the single-shot fuzzer over ``strategy`` with ``bug`` planted, stopped at
the first :class:`~fuzz.model.InvariantViolation`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import seed as seeded
from hypothesis import settings as Settings
from hypothesis.strategies import SearchStrategy

from fuzz.adapter import planted_scheduler_bug
from fuzz.hunting import without_module_constants
from fuzz.model import InvariantViolation
from fuzz.runners.scheduler import run_single_shot

__all__ = ["SEED", "planted_failure"]

# The seed of every search that names none: the one Hypothesis first drew
# these searches from (``derandomize``: a digest of the search function's
# source), written out so that editing this module moves no search.
SEED = int("2cf072687d11a3f713498e1c541ec3f0fe74dd4b6717d8f5bf0f004d1bfc584c2d31d51f04ab1bdab0fe6651b406d252", 16)


def planted_failure(
    bug: str,
    strategy: SearchStrategy[Any],
    *,
    settings: Settings,
    checks: Iterable[Callable[..., None]] | None = None,
    module_constants: bool = True,
    seed: int | None = SEED,
) -> tuple[InvariantViolation, Any]:
    """The first example of ``strategy`` whose single-shot run, with ``bug``
    planted, breaks one of ``checks`` (None: every check, as a campaign runs
    them): its violation and the example.

    ``settings`` sets the budget (its ``max_examples``) and how the search
    runs; pass ``phases=[Phase.generate]`` for the first failure unshrunk.
    ``module_constants=False`` keeps Hypothesis from mixing in the literals
    of the loaded modules, so an edit elsewhere in the suite does not move
    which example is met first. ``seed`` fixes the random stream (None: the
    settings choose, e.g. ``derandomize``). No failing example within the
    budget fails the calling test.
    """
    chosen = None if checks is None else tuple(checks)
    found: list[Any] = []

    def search(scenario: Any) -> None:
        try:
            if chosen is None:
                run_single_shot(scenario, record=False)
            else:
                run_single_shot(scenario, chosen, record=False)
        except InvariantViolation:
            found.append(scenario)
            raise

    constants = contextlib.nullcontext() if module_constants else without_module_constants()
    with planted_scheduler_bug(bug), constants:
        try:
            test = settings(given(strategy)(search))
            (test if seed is None else seeded(seed)(test))()
        except InvariantViolation as violation:
            return violation, found[-1]
    pytest.fail(f"{bug}: no example of {settings.max_examples} broke a claim")
