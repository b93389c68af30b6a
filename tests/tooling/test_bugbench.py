"""``python -m fuzz bugbench`` (fuzz/bugbench.py): which release each known
bug's trials run on, how trials are summed up, and the switch that turns
known-bug suppression off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import bugbench, known_bugs
from fuzz.known_bugs import KNOWN_BUGS
from fuzz.matrix.envs import DEFAULT_ROOT, MARKER
from fuzz.registry import TARGETS

ROOT = Path(__file__).resolve().parents[2]


def _root(tmp_path: Path, *releases: str) -> Path:
    for r in releases:
        (tmp_path / r).mkdir()
        (tmp_path / r / MARKER).write_text("{}")
    (tmp_path / "0.29.0").mkdir()  # no marker: an unfinished install is not a release
    return tmp_path


def test_every_timed_bug_names_registered_targets_and_the_others_say_why() -> None:
    for bug in KNOWN_BUGS:
        assert set(bug.targets) <= set(TARGETS), bug.id
        assert bug.targets or bug.bench_note, f"{bug.id}: neither targets nor a reason it is not timed"


def test_each_bug_runs_on_the_newest_installed_release_that_has_it(tmp_path: Path) -> None:
    bugs = {b.bug.id: b for b in bugbench.bench_bugs(_root(tmp_path, "0.27.1", "0.28.0"))}
    assert bugs["pre-fix-truncate-assert"].release == "0.27.1"  # fixed in 0.28.0
    assert bugs["second-full-attention-untrimmed"].release == "0.28.0"
    base = bugbench.installed_releases(tmp_path)
    assert "0.29.0" not in base
    # The chain (0.28.0-0.33.0, open) runs on the newest release that has it:
    # the base venv's, and the bench says which.
    chain = bugs["same-step-cow-chain"]
    if chain.release is not None:
        assert chain.path is None and "ran on" in chain.note
    sink = bugs["sink-full-attention-manager-init"]
    assert sink.release is None and "constructor" in sink.note


def test_a_missed_trial_counts_as_past_the_budget() -> None:
    hit = {"found": True, "seconds": 3.0, "target": "t", "examples": 5}
    miss = {"found": False, "seconds": None, "target": None, "examples": 9}
    s = bugbench.summarize_trials([hit, dict(hit, seconds=5.0), miss], budget=60)
    assert (s["found"], s["trials"], s["median_s"], s["worst_s"]) == (2, 3, 5.0, None)
    s = bugbench.summarize_trials([hit, miss, miss], budget=60)
    assert s["median_s"] is None and s["found_by"] == {"t": 1}
    table = bugbench.format_table({"budget_s": 60, "bugs": [{"id": "x", "fixed_in": None, "targets": ["t"],
                                                             "release": "0.33.0", "summary": s,
                                                             "trials": [dict(hit, other_failures={})]}]})
    assert "| 1/3 | > 60 | > 60 |" in table


def test_suppression_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert known_bugs.suppressing()
    monkeypatch.setenv(known_bugs.SUPPRESS_ENV, "report")
    assert not known_bugs.suppressing()


def test_with_suppression_off_the_scheduler_tier_reports_a_known_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same step: set aside as a known bug by default, raised with the
    switch off (what the bench relies on to time the scheduler-tier bugs)."""
    from fuzz import adapter
    from fuzz.runners.scheduler import triage
    from tests.known_bugs.runs import shared_partial_hit_step

    if not known_bugs.known_bug("same-step-cow-chain").affects(adapter.VLLM_VERSION):
        pytest.skip(f"vLLM {adapter.VLLM_VERSION} has no same-step copy-on-write chain")
    step = shared_partial_hit_step(2)
    assert triage(step) == ([], ["same-step-cow-chain"])
    monkeypatch.setenv(known_bugs.SUPPRESS_ENV, "report")
    unknown, known = triage(step)
    # Every check that sees the chain: the ownership model's same-step-hazard,
    # and the contents model's reads-written and index-written (the second
    # copy's destination lacks what the first copy put into its source).
    assert known == [] and sorted(v.invariant for v in unknown) == [
        "copy-source-ready", "index-written", "reads-written", "same-step-hazard"
    ]


@pytest.mark.skipif(not (DEFAULT_ROOT / "0.27.1" / MARKER).is_file(), reason="vLLM 0.27.1 not installed")
def test_the_bench_finds_the_pre_fix_crash_on_0_27_1(tmp_path: Path) -> None:
    out = tmp_path / "bb.json"
    proc = subprocess.run([sys.executable, "-m", "fuzz", "bugbench", "--bug", "pre-fix-truncate-assert",
                           "--seeds", "1", "--budget", "20", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (bug,) = json.loads(out.read_text())["bugs"]
    assert bug["vllm_version"] == "0.27.1" and bug["summary"]["found"] == 1, bug
    assert "| `pre-fix-truncate-assert` | 0.27.1 | 0.28.0 |" in proc.stdout


def test_every_planted_scheduler_bug_is_benched_with_the_claims_the_table_shows_catching_it() -> None:
    from fuzz import plantbench
    from fuzz.adapter import PLANTED_SCHEDULER_BUGS
    from invariants.table import INVARIANTS

    claims = plantbench.planted_claims()
    assert set(claims) == set(PLANTED_SCHEDULER_BUGS)
    assert claims["hash_ignores_parent"] == ("reads-written", "keys-name-one-prefix")
    listed = {plant for row in INVARIANTS for plant in row.planted}
    # A sibling plant the table does not list is still timed (any new failure finds it).
    assert {p for p, c in claims.items() if not c} == set(PLANTED_SCHEDULER_BUGS) - listed


def _planted(commit: str, **medians: tuple[int, float | None, float | None]) -> dict:
    plants = []
    for name, (found, median, examples) in medians.items():
        trials = [{"found": i < found, "seconds": median if i < found else None, "target": "t", "examples": 5}
                  for i in range(5)]
        plants.append({"plant": name, "summary": dict(bugbench.summarize_trials(trials, 60), median_s=median),
                       "median_examples": examples, "trials": trials})
    return {"commit": commit, "budget_s": 60, "plants": plants}


def test_the_planted_comparison_flags_fewer_finds_and_a_median_past_twice_and_5_s_but_not_noise() -> None:
    from fuzz import plantbench

    before = _planted("a", same=(5, 2.0, 40), slower=(5, 4.0, 80), fewer=(5, 1.0, 9), jitter=(5, 0.5, 9),
                      gone=(5, 1.0, 9))
    after = _planted("b", same=(5, 2.2, 41), slower=(5, 12.0, 300), fewer=(4, 1.0, 9), jitter=(5, 1.9, 30))
    table, worse = plantbench.compare(before, after)
    assert worse == ["slower", "fewer"]  # 0.5 s -> 1.9 s is under 5 s apart: noise at five seeds
    assert "| `slower` | 5/5 | 5/5 | 4.0 → 12.0 | 80 → 300 | 3.00 |" in table
    assert "gone" not in table  # timed on one side only: not compared
