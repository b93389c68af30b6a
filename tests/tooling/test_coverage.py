"""``python -m fuzz run --coverage``: coverage.py measures vLLM's KV-cache and
scheduler code in every worker, and the runner and ``merge`` combine the
workers' and shards' data into one result (:mod:`fuzz.coverage`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fuzz import coverage
from fuzz.cli import ROOT


def _fuzz(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fuzz", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _fuzz_together(*runs: list[str]) -> list[tuple[int, str]]:
    """Run several ``python -m fuzz`` commands at once (their start-up overlaps)."""
    procs = [subprocess.Popen([sys.executable, "-m", "fuzz", *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for args in runs]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def test_the_waiting_queue_loop_is_found_in_the_installed_scheduler() -> None:
    source = (coverage.vllm_root() / "vllm/v1/core/sched/scheduler.py").read_text()
    regions = {name: (a, b) for name, a, b in coverage._regions(source)}
    first, last = regions["Scheduler.schedule[waiting]"]
    s_first, s_last = regions["Scheduler.schedule"]
    assert s_first < first < last < s_last
    lines = source.splitlines()
    assert lines[first - 1].lstrip().startswith("while"), lines[first - 1]
    # The loop admits requests: it calls the prefix-cache lookup.
    assert "get_computed_blocks" in "\n".join(lines[first - 1:last])


def test_the_branch_of_a_function_is_its_own_not_a_nested_functions() -> None:
    src = "class A:\n    def f(self, x):\n        if x:\n            def g(y):\n                if y:\n                    return 1\n            return g\n        return None\n"
    regions = coverage._regions(src)
    assert ("A.f", 2, 8) in regions and ("A.f.g", 4, 6) in regions
    assert coverage._pattern_matches("*.f", "A.f") and not coverage._pattern_matches("*.f", "A.f.g")


def test_coverage_with_one_and_two_workers_and_across_shards(tmp_path: Path) -> None:
    """Shard 1/2 on one worker, shard 2/2 on two, each with --coverage; then
    merge. Each result holds every worker's data; the merge holds both."""
    common = ["--coverage", "--budget", "3s", "--seed", "2", "--target", "truncate-hybrid",
              "--target", "truncate-any-layout", "--db", str(tmp_path / "db"), "--repro-dir", str(tmp_path / "r")]
    (rc1, out1), (rc2, out2) = _fuzz_together(
        ["run", *common, "--shard", "1/2", "--workers", "1", "--report-dir", str(tmp_path / "s1")],
        ["run", *common, "--shard", "2/2", "--workers", "2", "--report-dir", str(tmp_path / "s2")],
    )
    assert rc1 == 0 and rc2 == 0, out1 + out2
    assert "kv_cache_manager.py" in out1 and "examples/s traced" in out1

    def result(d: Path) -> tuple[dict, dict]:
        return (json.loads((d / "coverage-summary.json").read_text()),
                json.loads((d / coverage.TIMELINE).read_text()))

    (s1, t1), (s2, t2) = result(tmp_path / "s1"), result(tmp_path / "s2")
    assert len(t1["parts"]) == 1 and len(t2["parts"]) == 2  # one data file per worker
    assert {e[1] for e in t1["events"]} == {"truncate-hybrid", coverage.STARTUP}
    assert {e[1] for e in t2["events"]} == {"truncate-any-layout", coverage.STARTUP}

    merged = _fuzz("merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--report-dir", str(tmp_path / "m"),
                   "--repro-dir", str(tmp_path / "r"))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    sm, tm = result(tmp_path / "m")
    assert len(tm["parts"]) == 3
    assert set(sm["growth"]) == {"truncate-hybrid", "truncate-any-layout", coverage.STARTUP, "all"}

    def branches(s: dict, module: str = "vllm/v1/core/kv_cache_coordinator.py") -> int:
        return s["files"][module]["branches_covered"]

    assert branches(sm) >= max(branches(s1), branches(s2)) > 0
    # The growth of all targets ends at the branches covered in the measured files.
    assert sm["growth"]["all"][-1][1] == sum(f["branches_covered"] for f in sm["files"].values())
    truncate = next(r for r in sm["functions"] if r["function"] == "KVCacheManager.truncate_computed_blocks")
    assert truncate["covered"] > 0
    report = (tmp_path / "m" / "report.md").read_text()
    assert "Branches never taken" in report and "Covered branches over time" in report
    assert "<polyline" in (tmp_path / "m" / "report.html").read_text()


def test_coverage_refuses_a_planted_bug(capsys) -> None:  # type: ignore[no-untyped-def]
    from fuzz.cli import main

    assert main(["run", "--coverage", "--plant", "pre_fix_assert_all"]) == 2
    assert "unmodified vLLM" in capsys.readouterr().err


def test_compare_lists_the_branches_only_the_other_side_takes() -> None:
    def summary(missing: list[tuple[int, int]]) -> dict:
        rows = [{"module": "vllm/v1/core/kv_cache_manager.py", "function": "KVCacheManager.f", "branches": 4,
                 "covered": 4 - len(missing),
                 "missing": [{"from": a, "to": b, "source": f"if x{a}:", "to_source": ""} for a, b in missing]}]
        return {"files": {"vllm/v1/core/kv_cache_manager.py": {"branches": 4, "branches_covered": 4 - len(missing)}},
                "functions": rows}

    ours, theirs = summary([(10, 11), (12, -5)]), summary([(12, -5), (14, 15)])
    text = "\n".join(coverage.compare(ours, theirs))
    assert "| `KVCacheManager.f` | 2/4 | 2/4 | 1 | 1 |" in text
    assert "kv_cache_manager.py:10 `if x10:` -> line 11" in text
    assert ":12" not in text.split("never does:")[1]  # both miss it: no gap of ours
