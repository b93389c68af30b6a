"""The pytest plugin :func:`fuzz.upstream.run_in_tree` loads into vLLM's
tests tree (``-p fuzz.upstream._plugin``): it applies the planted bug named
by ``FUZZ_UPSTREAM_PLANT`` for the whole run (or, where that is a JSON object
of test file -> planted bug, each file's own around each of its tests), and
writes each test's outcome to the JSON file named by
``FUZZ_UPSTREAM_OUTCOMES``."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from fuzz.upstream._tree import OUTCOMES_ENV, PLANT_ENV

_plant = contextlib.ExitStack()
_outcomes: dict[str, tuple[str, str]] = {}
_per_file: dict[str, str] = {}  # test file (as a node id starts) -> its planted bug


def pytest_configure(config: pytest.Config) -> None:
    name = os.environ.get(PLANT_ENV)
    if name and name.startswith("{"):
        _per_file.update(json.loads(name))
    elif name:
        from fuzz.adapter import planted_scheduler_bug

        _plant.enter_context(planted_scheduler_bug(name))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    name = _per_file.get(item.nodeid.split("::")[0])
    if name is None:
        yield
        return
    from fuzz.adapter import planted_scheduler_bug

    with planted_scheduler_bug(name):
        yield


def pytest_unconfigure(config: pytest.Config) -> None:
    _plant.close()
    path = os.environ.get(OUTCOMES_ENV)
    if path:
        with open(path, "w") as out:
            json.dump(_outcomes, out, indent=1)


def _last_line(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":
        outcome = report.outcome if report.when == "call" or report.skipped else "error"
        # The first non-pass of a test wins (a setup error, then its teardown).
        if report.nodeid not in _outcomes or _outcomes[report.nodeid][0] == "passed":
            _outcomes[report.nodeid] = (outcome, _last_line(report))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:  # an import error: the file's tests never ran
        _outcomes[report.nodeid] = ("error", _last_line(report))
