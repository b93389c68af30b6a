"""The release matrix (``python -m fuzz matrix``, :mod:`fuzz.matrix`).

Fast unit tests of argument parsing, target names, JUnit reading and the
table; then the light CI check: one short truncation target on the oldest
supported release (installed on demand into ``.cache/vllm-envs``) and on the
newest (the base venv). The full matrix is slow and stays out of CI.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from fuzz import known_bugs

from fuzz import matrix
from fuzz.cli import main, matrix_exit_code
from fuzz.matrix import (
    SUPPORTED_RELEASES,
    Cell,
    Release,
    format_table,
    parse_release,
    run_matrix,
)
from fuzz.matrix.releases import base_vllm_version
from fuzz.registry import TARGETS

OLDEST, NEWEST = SUPPORTED_RELEASES[0], SUPPORTED_RELEASES[-1]
HYBRID = TARGETS["truncate-hybrid"]
SCHEDULER = TARGETS["scheduler-single-shot"]


# -- arguments ---------------------------------------------------------------


def test_a_version_is_a_pypi_release_and_the_base_version_is_the_base_venv() -> None:
    assert parse_release("0.30.0") == Release("0.30.0", "pypi")
    base = base_vllm_version()
    assert parse_release(base).kind == "base"
    assert parse_release("0.27.1").reference  # pre-fix reference, never "supported"


def test_a_source_checkout_needs_a_v1_vllm_package(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no vllm/__init__.py"):
        parse_release(f"src:{tmp_path}")
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    with pytest.raises(ValueError, match="not a V1 vLLM"):
        parse_release(f"src:{tmp_path}")
    core = tmp_path / "vllm" / "v1" / "core"
    core.mkdir(parents=True)
    (core / "kv_cache_manager.py").write_text("")
    release = parse_release(f"src:{tmp_path}")
    assert (release.kind, release.path) == ("src", tmp_path.resolve())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["0.3"], "expected a version like 0.30.0"),
        (["latest"], "expected a version like 0.30.0"),
        (["src:"], "src: needs a path"),
        (["--vllm-src", "/no/such/dir"], "no vllm/__init__.py"),
        (["--examples", "0"], "--examples: expected a positive integer"),
        (["--timeout", "-5"], "--timeout: expected a positive number"),
        (["--target", "fuzz_truncate_hybrid"], "--target fuzz_truncate_hybrid: unknown target; known: truncate-hybrid"),
        (["--json", "/no/such/dir/out.json"], "does not exist"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_flags_and_paths_give_one_line_and_exit_2(argv, message, capsys) -> None:
    assert main(["matrix", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert err.startswith("python -m fuzz matrix: "), err


def test_list_names_releases_and_the_registry_targets_without_running(capsys) -> None:
    assert main(["matrix", "--list", "--reference"]) == 0
    out = capsys.readouterr().out
    for version in SUPPORTED_RELEASES:
        assert f"release {version}" in out
    assert "0.27.1 (pre-fix reference, not supported)" in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("target")] == list(TARGETS)
    assert f"target  truncate-hybrid  ({HYBRID.nodeid})" in out


def test_a_target_is_named_as_in_the_campaign(capsys) -> None:
    assert main(["matrix", "--list", "--target", "scheduler-machine", "--target", "truncate-hybrid"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("target")] == [
        "scheduler-machine", "truncate-hybrid"]


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_registry_target_names_a_pytest_test_in_its_module(name: str) -> None:
    """The matrix runs ``Target.nodeid``: the test must exist where the registry says."""
    target = TARGETS[name]
    path, test = target.nodeid.split("::")
    assert (matrix.runner.ROOT / path).is_file(), target.nodeid
    assert hasattr(importlib.import_module(target.module), test), target.nodeid


# -- results -----------------------------------------------------------------


def _junit(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "r.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


STATS = {"vllm_version": "0.30.0", "items": {HYBRID.nodeid: {"examples": 37, "shrink_calls": 12,
                                                      "first_failure_s": 1.5, "examples_to_failure": 37}}}


@pytest.mark.parametrize(
    ("body", "status", "note"),
    [
        ('<testcase name="fuzz_truncate_hybrid" time="1"/>', "pass", ""),
        ('<testcase name="x"><skipped message="needs FUZZ_SHORTCUT=1">s</skipped></testcase>', "skipped",
         "needs FUZZ_SHORTCUT=1"),
        ('<testcase name="x"><failure message="invariants.truncation.InvariantViolation: [must-cover] short">'
         "invariants/truncation.py:46: InvariantViolation</failure></testcase>", "violation",
         "found at example 37 after 1.5s, 12 shrink calls; invariants.truncation.InvariantViolation: [must-cover]"),
        ('<testcase name="x"><failure message="AssertionError">'
         ".cache/vllm-envs/0.27.1/vllm/v1/core/kv_cache_manager.py:790: AssertionError</failure></testcase>",
         "violation", "AssertionError"),
        ('<testcase name="x"><error message="collection failure">e</error></testcase>', "error", "pytest error"),
    ],
)
def test_junit_outcomes_become_cells(tmp_path: Path, body: str, status: str, note: str) -> None:
    release = Release("0.30.0", "pypi")
    cell = matrix.runner._cell_from_junit(release, HYBRID, _junit(tmp_path, body), STATS, 9.0)
    assert cell.status == status, cell
    assert note in cell.note, cell


def _judged(outcome: str, reason: str, failure: dict | None = None, version: str = "0.30.0") -> dict:
    """The plugin's record of a failing test: its verdict and structured facts."""
    item = dict(STATS["items"][HYBRID.nodeid], outcome=outcome, reason=reason)
    if failure is not None:
        item["failure"] = failure
    return {"vllm_version": version, "items": {HYBRID.nodeid: item}}


@pytest.mark.parametrize(
    ("outcome", "status"), [("harness error", "error"), ("config rejected", "error"), ("violation", "violation")]
)
def test_the_plugins_verdict_decides_the_cell_not_the_failure_text(tmp_path: Path, outcome: str, status: str) -> None:
    body = ('<testcase name="x"><failure message="AttributeError: no prefix_cacheable">'
            "fuzz/adapter/_scheduler.py:399: AttributeError</failure></testcase>")
    reason = "AttributeError: no prefix_cacheable at fuzz/adapter/_scheduler.py:399 (vLLM 0.30.0)"
    cell = matrix.runner._cell_from_junit(Release("0.30.0", "pypi"), HYBRID, _junit(tmp_path, body),
                                          _judged(outcome, reason), 9.0)
    assert cell.status == status, cell
    if status == "error":
        assert cell.note == f"{outcome}: {reason}", cell


def test_table_and_exit_code() -> None:
    ok = Cell("0.30.0", "truncate-hybrid", "pass", 100, 12.3)
    ref = Cell("0.27.1 (pre-fix reference, not supported)", "truncate-hybrid", "violation", 38, 45.0,
               "no | pipes", reference=True)
    table = format_table([ok, ref]).splitlines()
    assert table[0].split("|")[1:-1] == [c.ljust(len(c)) for c in table[0].split("|")[1:-1]]
    assert "| release" in table[0] and "| examples |" in table[0]
    assert "violation (expected)" in table[3] and "no \\| pipes" in table[3]
    assert matrix_exit_code([ok, ref]) == 0  # a reference row never fails the run
    assert matrix_exit_code([ok, Cell("0.31.0", "t", "violation", 1, 1.0)]) == 1
    assert matrix_exit_code([Cell("0.31.0", "t", "violation", 1, 1.0), Cell("0.32.0", "t", "error", None, 1.0)]) == 2


# The 0.28.0 finding as the scheduler tier reports it (matrix of 2026-11-29),
# as the plugin records its facts.
SECOND_FA_GROUP = {"invariant": "computed-adds-up", "exception": None, "frames": [],
                   "where": "Scheduler.schedule", "group_kind": "FullAttentionSpec", "spec_class": None}
_FAILURE = ('<testcase name="x"><failure message="InvariantViolation: [computed-adds-up] ...">'
            "invariants/scheduler.py:70: InvariantViolation</failure></testcase>")


@pytest.mark.parametrize(
    ("release", "facts", "known"),
    [
        ("0.28.0", SECOND_FA_GROUP, True),
        # Fixed in 0.29.0: the same facts there are a new finding.
        ("0.29.0", SECOND_FA_GROUP, False),
        # Another invariant on the buggy release is not explained by the bug.
        ("0.28.0", dict(SECOND_FA_GROUP, invariant="mamba-state-at-boundary", group_kind="MambaSpec"), False),
        # A Mamba group is not the bug's signature (only full attention is left untrimmed).
        ("0.28.0", dict(SECOND_FA_GROUP, group_kind="MambaSpec"), False),
    ],
)
def test_only_a_documented_bug_of_that_release_is_known(tmp_path: Path, release: str, facts: dict, known: bool) -> None:
    stats = _judged("violation", "[computed-adds-up]", facts, version=release)
    cell = matrix.runner._cell_from_junit(Release(release, "pypi"), HYBRID, _junit(tmp_path, _FAILURE), stats, 9.0)
    assert cell.status == "violation", cell
    assert (cell.known_bug is not None) is known, cell
    if known:
        bug = known_bugs.known_bug(cell.known_bug)
        assert bug.pinned_by in cell.note and f"fixed in {bug.fixed_in}" in cell.note, cell
    assert matrix_exit_code([cell]) == (0 if known else 1)
    assert ("violation (known)" in format_table([cell])) is known


# -- the light CI check: oldest and newest supported release ------------------


def test_oldest_and_newest_release_import_and_run_a_short_target(tmp_path: Path) -> None:
    """Installs the oldest release on demand (cached in .cache/vllm-envs), then
    runs 10 examples of the hybrid truncation target on it and on the base
    venv's release, each in its own subprocess."""
    releases = [parse_release(OLDEST), parse_release(NEWEST)]
    cells = run_matrix(releases, [HYBRID], examples=10, timeout=300, out_dir=tmp_path)
    assert [(c.status, c.vllm_version) for c in cells] == [("pass", OLDEST), ("pass", NEWEST)], cells
    assert all(c.examples and c.examples >= 10 for c in cells), cells


def test_oldest_and_newest_release_run_the_scheduler_tier(tmp_path: Path) -> None:
    """The scheduler tier leans hardest on vLLM internals (constructor
    recipes, the admission path, SchedulerOutput's shape): its pinned
    examples (one needs a preempted request resumed under the V1 model
    runner) and 10 generated ones, on the oldest and newest release."""
    releases = [parse_release(OLDEST), parse_release(NEWEST)]
    cells = run_matrix(releases, [SCHEDULER], examples=10, timeout=300, out_dir=tmp_path)
    assert [c.vllm_version for c in cells] == [OLDEST, NEWEST], cells
    assert matrix_exit_code(cells) == 0, cells  # passes, or only a documented bug of the release
    assert all(c.status == "pass" or c.known_bug for c in cells), cells


@pytest.mark.slow
def test_generation_alone_finds_the_pre_fix_crash_on_the_reference_release(tmp_path: Path) -> None:
    """The suite's proof against a real historical bug: on vLLM 0.27.1 (before
    PR 51468) the hybrid truncation target, without its pinned @example,
    finds the short-Mamba-group crash (seen: example 30, 0.5 s)."""
    cells = run_matrix([parse_release("0.27.1")], [HYBRID], examples=100, timeout=600,
                       out_dir=tmp_path, skip_phases="target,explain,explicit")
    (cell,) = cells
    assert cell.reference and cell.status == "violation", cell
    assert "[no-unexpected-failure]" in cell.note and "found at example" in cell.note, cell
    assert matrix_exit_code(cells) == 0
