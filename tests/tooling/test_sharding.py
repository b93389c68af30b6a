"""``--shard K/N``: every runner computes the same plan; together they cover each
(target, slot) exactly once; no two runners share a seed stream; merge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.cli import main
from fuzz.campaign import Shard, Totals, merge_campaigns, parse_shard, shard_items

ROOT = Path(__file__).resolve().parents[2]

target_lists = st.lists(st.text("abcdefgh-", min_size=1, max_size=6), min_size=1, max_size=7, unique=True)


@st.composite
def shard_plans(draw: st.DrawFn) -> tuple[list[str], int, int]:
    """(targets, N runners, W workers per runner)."""
    return draw(target_lists, label="targets"), draw(st.integers(1, 12), label="runners"), draw(
        st.integers(1, 4), label="workers"
    )


@given(shard_plans())
def test_shards_partition_the_items(plan: tuple[list[str], int, int]) -> None:
    targets, n, w = plan
    plans = [shard_items(targets, Shard(k, n), w) for k in range(1, n + 1)]
    every = [item for p in plans for item in p]
    # Each (target, slot) once across all runners: no duplicated seed stream.
    assert len(every) == len(set(every)), every
    # Each target fuzzed, by at least one runner; every runner has work.
    assert {t for t, _ in every} == set(targets)
    assert all(plans)
    # A runner's items are whole: W slots for each of its targets.
    for p in plans:
        per_target = Counter(t for t, _ in p)
        assert set(per_target.values()) == {w}, p
    # Balance: runners per target (N > T) or targets per runner (N <= T) differ by <= 1.
    if n > len(targets):
        runners = Counter(t for p in plans for t in {t for t, _ in p})
        assert max(runners.values()) - min(runners.values()) <= 1, runners
    else:
        sizes = [len({t for t, _ in p}) for p in plans]
        assert max(sizes) - min(sizes) <= 1, sizes


# Fixed plans (targets, N, W) covering N < T, N == T and N > T; runners on
# other machines compute their plans in other processes, with other hash
# seeds, so the plan must not depend on anything but these inputs.
_PLANS = [
    (["truncate-hybrid", "truncate-any-layout", "scheduler-state-machine"], n, w)
    for n in (1, 2, 3, 5, 7)
    for w in (1, 3)
] + [(["b", "a", "c", "e", "d", "g", "f"], n, 2) for n in (2, 4, 7, 9, 12)]

_PRINT_PLANS = """
import json, sys
from fuzz.campaign import Shard, shard_items
plans = json.loads(sys.stdin.read())
print(json.dumps([[shard_items(t, Shard(k, n), w) for k in range(1, n + 1)] for t, n, w in plans]))
"""


def _plans_in_a_process(hash_seed: str) -> list[list[list[list[object]]]]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", _PRINT_PLANS], input=json.dumps(_PLANS), capture_output=True, text=True,
        env=env, cwd=ROOT, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_every_runner_process_computes_the_same_plan() -> None:
    """Two processes with different hash seeds (two CI runners) compute the
    same items for every shard of every plan as this process does."""
    here = [[[list(item) for item in shard_items(t, Shard(k, n), w)] for k in range(1, n + 1)] for t, n, w in _PLANS]
    first, second = _plans_in_a_process("1"), _plans_in_a_process("2")
    for plan, mine, a, b in zip(_PLANS, here, first, second):
        assert mine == a == b, f"plan {plan}: this process {mine}, PYTHONHASHSEED=1 {a}, PYTHONHASHSEED=2 {b}"


def test_one_shard_is_the_unsharded_campaign() -> None:
    targets = ["truncate-hybrid", "truncate-any-layout"]
    assert shard_items(targets, None, 2) == shard_items(targets, Shard(1, 1), 2) == [
        ("truncate-hybrid", 0), ("truncate-hybrid", 1), ("truncate-any-layout", 0), ("truncate-any-layout", 1),
    ]


def test_four_runners_two_targets_two_replicas_each() -> None:
    # Runner 3 is truncate-hybrid's second replica: slots 2, 3 (runner 1 has 0, 1).
    targets = ["truncate-hybrid", "truncate-any-layout"]
    assert [shard_items(targets, Shard(k, 4), 2) for k in (1, 2, 3, 4)] == [
        [("truncate-hybrid", 0), ("truncate-hybrid", 1)],
        [("truncate-any-layout", 0), ("truncate-any-layout", 1)],
        [("truncate-hybrid", 2), ("truncate-hybrid", 3)],
        [("truncate-any-layout", 2), ("truncate-any-layout", 3)],
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [("0/4", "K=0 must be in 1..4"), ("5/4", "K=5 must be in 1..4"), ("1/0", "N=0 must be at least 1"),
     ("1", "expected K/N"), ("a/b", "expected K/N")],
)
def test_bad_shards_name_the_rule(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_shard(text)


def test_parse_shard_accepts_spaces() -> None:
    assert parse_shard(" 2 / 4 ") == Shard(2, 4) and str(Shard(2, 4)) == "2/4"


def _campaign(path: Path, shard: str, target: str, examples: int, failures: list[dict], elapsed: float) -> Path:
    path.mkdir(parents=True)
    total = {
        "examples": {target: examples}, "seconds": {target: 10.0}, "failures": failures,
        "telemetry": {"branches": {"b": examples}}, "vllm_version": "0.33.0",
    }
    config = {"targets": [target], "slots": 2, "budget": 10.0, "seed": None, "shard": shard, "plant": None}
    (path / "campaign.json").write_text(json.dumps({"total": total, "config": config, "elapsed": elapsed}))
    return path


def test_merge_adds_counts_and_dedups_failures(tmp_path: Path, capsys) -> None:
    fail = {"key": "truncate-hybrid|must-cover|x:1", "target": "truncate-hybrid", "invariant": "must-cover",
            "failing_line": "x:1", "violation": "boom", "found_after_s": 1.0, "repro": None}
    a = _campaign(tmp_path / "s1", "1/3", "truncate-hybrid", 100, [fail], 12.0)
    b = _campaign(tmp_path / "s2", "2/3", "truncate-any-layout", 50, [], 15.0)
    c = _campaign(tmp_path / "s3", "3/3", "truncate-hybrid", 30, [dict(fail, found_after_s=3.0)], 11.0)
    record = merge_campaigns([a / "campaign.json", b / "campaign.json", c / "campaign.json"])
    total, config = record.totals, record.config
    assert total.examples == {"truncate-hybrid": 130, "truncate-any-layout": 50}
    assert [f["found_after_s"] for f in total.failures] == [1.0]
    assert total.telemetry["branches"] == {"b": 180}
    assert config.targets == ("truncate-hybrid", "truncate-any-layout") and config.slots == 6
    assert config.shard == "1/3, 2/3, 3/3" and record.elapsed == 15.0

    out = tmp_path / "merged"
    assert main(["merge", str(a), str(b), str(c), "--report-dir", str(out), "--repro-dir", str(tmp_path / "r")]) == 1
    assert "merged 3 shard(s)" in capsys.readouterr().out
    md = (out / "report.md").read_text()
    assert "examples: 180" in md and "must-cover" in md
    assert json.loads((out / "campaign.json").read_text())["config"]["slots"] == 6


def test_totals_merge_is_one_sum_for_rounds_workers_and_shards() -> None:
    """Counts add up, the earlier of two findings of one failure is kept, and
    merging is associative (workers then shards, or all at once)."""
    fail = {"key": "t|inv|x:1", "target": "t", "found_after_s": 5.0}
    parts = [
        Totals({"t": 3}, {"t": 1.0}, [fail], {"branches": {"a": 1}}, "0.33.0"),
        Totals({"t": 2, "u": 7}, {"u": 2.0}, [dict(fail, found_after_s=2.0)], {"branches": {"a": 2, "b": 1}}),
        Totals({"u": 1}, {}, [], {"layouts": {"x": 4}}, "0.33.0"),
    ]
    total = Totals.sum(parts)
    assert total.examples == {"t": 5, "u": 8} and total.seconds == {"t": 1.0, "u": 2.0}
    assert [f["found_after_s"] for f in total.failures] == [2.0]
    assert total.telemetry == {"branches": {"a": 3, "b": 1}, "layouts": {"x": 4}}
    assert total.vllm_version == "0.33.0"
    assert parts[0].merge(parts[1]).merge(parts[2]) == parts[0].merge(parts[1].merge(parts[2])) == total
    assert Totals.from_json(total.to_json()) == total
