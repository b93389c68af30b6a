"""pytest plugin that :mod:`fuzz.matrix` loads into every target run.

Loaded with ``-p fuzz.matrix.plugin`` in the per-(release, target)
subprocess; inert unless ``FUZZ_MATRIX_STATS`` names a file. It does two
things:

* Loads the ``matrix`` settings profile: the ``ci`` profile (derandomized,
  ``FUZZ_CI_EXAMPLES`` examples) with ``report_multiple_bugs=False`` and
  without the phases named in ``FUZZ_MATRIX_SKIP_PHASES`` (default
  ``target,explain``). Why: on a release with a bug, the target phase's
  hill-climber keeps running failing test cases (it stops on a count of
  *passing* ones), so a failure found after ~1 s took 8-9 min and 3 GB to
  report on vLLM 0.27.1; without it, ~45 s. ``explicit`` may be added to
  measure discovery without the pinned ``@example`` s.
* Counts Hypothesis test cases per pytest item through Hypothesis's
  observability callbacks (which also see stateful tests), and writes, per
  node id, the examples run (explicit, reuse, generate, target phases), the
  shrink calls, and the seconds and examples to the first failure; plus the
  ``vllm`` module the run really imported, so the matrix can check it ran the
  release it meant to.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

STATS_ENV = "FUZZ_MATRIX_STATS"
SKIP_PHASES_ENV = "FUZZ_MATRIX_SKIP_PHASES"
_STATS: dict[str, dict[str, Any]] = {}
_current: dict[str, Any] | None = None


def _enabled() -> bool:
    return bool(os.environ.get(STATS_ENV))


def _observe(observation: Any) -> None:
    cur = _current
    if cur is None or getattr(observation, "type", None) != "test_case":
        return
    how = str(getattr(observation, "how_generated", ""))
    # Hypothesis marks a *failing* explicit example's observation as invalid.
    failed = observation.status == "failed" or (
        how == "explicit example" and observation.status == "gave_up"
    )
    if observation.status == "gave_up" and not failed:
        return  # invalid (filtered or overrun) draws: not an example
    if "shrink" in how:
        cur["shrink_calls"] += 1
    elif how == "explicit example" or any(
        f"during {phase} phase" in how for phase in ("reuse", "generate", "target")
    ):
        cur["examples"] += 1
    else:
        return  # the explain phase and the final replay are not new examples
    if failed and cur["first_failure_s"] is None:
        cur["first_failure_s"] = round(time.monotonic() - cur["_start"], 3)
        cur["examples_to_failure"] = cur["examples"]


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _enabled():
        return
    from hypothesis import settings
    from hypothesis.internal import observability

    skip = set(filter(None, os.environ.get(SKIP_PHASES_ENV, "target,explain").split(",")))
    settings.register_profile(
        "matrix",
        parent=settings.get_profile("ci"),
        report_multiple_bugs=False,
        phases=[p for p in settings.get_profile("ci").phases if p.name not in skip],
    )
    settings.load_profile("matrix")
    # With a callback registered Hypothesis would also trace line coverage of
    # every example (slow); the counts need none. The documented switch for
    # that, HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER, also turns on writing
    # every observation to .hypothesis/observed (130 MB per matrix run), so
    # turn off the module flag instead.
    observability.OBSERVABILITY_COLLECT_COVERAGE = False
    observability.add_observability_callback(_observe)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    global _current
    if not _enabled():
        yield
        return
    _current = _STATS.setdefault(
        item.nodeid,
        dict(examples=0, shrink_calls=0, first_failure_s=None, examples_to_failure=None),
    )
    _current["_start"] = time.monotonic()
    try:
        yield
    finally:
        _current.pop("_start", None)
        _current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    """A failing test's verdict and structured facts (never its message):
    what :mod:`fuzz.outcomes` makes of the exception and, for a violation,
    the facts :mod:`fuzz.known_bugs` matches on."""
    yield
    if not _enabled() or call.when != "call" or call.excinfo is None:
        return
    import dataclasses

    from fuzz import known_bugs
    from fuzz.model import InvariantViolation
    from fuzz.outcomes import classify

    exc = call.excinfo.value
    if isinstance(exc, BaseExceptionGroup):  # several distinct failures: the first decides
        exc = exc.exceptions[0]
    import vllm

    verdict = classify(exc, vllm.__version__)
    entry = _STATS.setdefault(item.nodeid, dict(examples=0, shrink_calls=0, first_failure_s=None,
                                                examples_to_failure=None))
    entry["outcome"] = verdict.outcome.value
    entry["reason"] = verdict.reason
    if isinstance(exc, InvariantViolation):
        entry["failure"] = dataclasses.asdict(known_bugs.failure_of(exc))


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(STATS_ENV)
    if not path:
        return
    import sys

    vllm = sys.modules.get("vllm")
    out = {
        "vllm_version": getattr(vllm, "__version__", None),
        "vllm_file": getattr(vllm, "__file__", None),
        "items": _STATS,
    }
    Path(path).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
