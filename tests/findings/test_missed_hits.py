"""The fourth outcome, a missed hit: classified apart from violations,
recorded and deduplicated like them, and counted, reported and exited on
apart (fuzz/outcomes.py, fuzz/campaign/)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fuzz.campaign.config import CampaignConfig
from fuzz.campaign.findings import Findings
from fuzz.campaign.report import summary_table, write_reports
from fuzz.campaign.runner import progress_line
from fuzz.campaign.totals import Totals
from fuzz.cli import EXIT_MISSED_HIT, EXIT_VIOLATION, main
from fuzz.model import InvariantViolation, MissedHit
from fuzz.outcomes import Outcome, classify

WHERE = "KVCacheManager.get_computed_blocks"


def _missed() -> MissedHit:
    return MissedHit("hit-matches-index", "served 8, the index allows 12", where=WHERE, state="a missed hit")


def _longer() -> InvariantViolation:
    return InvariantViolation("hit-matches-index", "served 12, the index allows 8", where=WHERE)


def test_a_missed_hit_is_its_own_outcome() -> None:
    assert classify(_missed(), "0.33.0").outcome is Outcome.MISSED_HIT
    assert classify(_longer(), "0.33.0").outcome is Outcome.VIOLATION


def _found(tmp_path: Path, *failures: BaseException) -> Totals:
    findings = Findings(repro_dir=tmp_path / "repros", start=time.time(), campaign_seed=1, worker="w",
                        vllm_version="0.33.0")
    metas = [findings.record("scheduler-machine", 0, exc) for exc in failures]
    return Totals(examples={"scheduler-machine": 10}, failures=[m for m in metas if m is not None],
                  vllm_version="0.33.0")


def test_a_missed_hit_is_recorded_and_counted_apart_from_violations(tmp_path: Path) -> None:
    # The same claim's missed hit, found twice, and its violation: two entries.
    total = _found(tmp_path, _missed(), _missed(), _longer())
    assert len(total.failures) == 2
    sidecars = {json.loads(p.read_text())["outcome"] for p in (tmp_path / "repros").glob("*.json")}
    assert sidecars == {"missed hit", "violation"}
    assert [f["outcome"] for f in total.missed_hits] == ["missed hit"]
    assert [f["outcome"] for f in total.new_failures] == [f["outcome"] for f in total.violations] == ["violation"]
    assert "failures 1  missed hits 1" in progress_line(total, 1.0, 60.0)
    header, _, row = summary_table(total, 1.0).splitlines()
    assert header.split()[-2:] == ["missed", "hits"] and row.split()[-2:] == ["1", "1"]


def test_the_report_lists_missed_hits_in_their_own_section(tmp_path: Path) -> None:
    total = _found(tmp_path, _missed())
    config = CampaignConfig(targets=("scheduler-machine",), items=(("scheduler-machine", 0),), slots=1, budget=60.0,
                            start=1.0, repro_dir="r", stats_dir="s", db=("db",), seed=7)
    md, html = write_reports(total, tmp_path / "report", repro_dir=tmp_path / "repros", elapsed=1.0, config=config)
    text = md.read_text()
    violations, missed = text.split("## Violations", 1)[1].split("## Missed hits", 1)
    assert "None." in violations and "hit-matches-index" not in violations
    assert "hit-matches-index" in missed.split("## Known", 1)[0]
    assert "Missed hits" in html.read_text()


def _campaign(path: Path, failures: list[dict]) -> Path:
    path.mkdir(parents=True)
    total = {"examples": {"scheduler-machine": 5}, "seconds": {"scheduler-machine": 1.0}, "failures": failures,
             "telemetry": {}, "vllm_version": "0.33.0"}
    config = {"targets": ["scheduler-machine"], "slots": 1, "budget": 1.0, "seed": None, "shard": "1/1", "plant": None}
    (path / "campaign.json").write_text(json.dumps({"total": total, "config": config, "elapsed": 1.0}))
    return path


def test_merge_exits_3_on_missed_hits_alone_and_1_with_a_violation(tmp_path: Path) -> None:
    found = _found(tmp_path, _missed(), _longer()).failures
    missed = [f for f in found if f["outcome"] == "missed hit"]
    only = _campaign(tmp_path / "only", missed)
    both = _campaign(tmp_path / "both", found)
    args = ["--report-dir", str(tmp_path / "out"), "--repro-dir", str(tmp_path / "repros")]
    assert main(["merge", str(only), *args]) == EXIT_MISSED_HIT == 3
    assert main(["merge", str(both), *args]) == EXIT_VIOLATION
