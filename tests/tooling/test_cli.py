"""``python -m fuzz``: exit codes, one-line usage errors, repros, reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import adapter
from fuzz.campaign import CampaignConfig
from fuzz.campaign.config import ENV
from fuzz.cli import UsageError, main, parse_duration

ROOT = Path(__file__).resolve().parents[2]


def _fuzz(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fuzz", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600), ("1m30s", 90)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "0s", "5x"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="--budget"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--budget", "soon"], "--budget 'soon'"),
        (["run", "--workers", "0"], "--workers '0'"),
        (["run", "--target", "nope"], "--target nope: unknown target"),
        (["run", "--vllm-src", "/nonexistent/vllm"], "--vllm-src /nonexistent/vllm: no vllm/__init__.py"),
        (["run", "--plant", "nope"], "--plant nope: unknown"),
        (["replay", "/nonexistent/repro.py"], "/nonexistent/repro.py: no such file"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_unknown_flag_exits_2_with_one_line(capsys) -> None:
    assert main(["run", "--no-such-flag"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m fuzz run: unrecognized arguments: --no-such-flag"], err


def _config(**changes: object) -> CampaignConfig:
    fields = dict(targets=("truncate-hybrid", "scheduler-machine"), items=(("truncate-hybrid", 0), ("scheduler-machine", 0)),
                  slots=1, budget=60.0, start=1.0, repro_dir="r", stats_dir="s", db=("db",), seed=7)
    return CampaignConfig(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_campaign_config_reaches_a_worker_unchanged() -> None:
    config = _config(shard="2/3", plant="pre_fix_assert_all")
    assert CampaignConfig.from_env({ENV: config.to_env()}) == config
    assert CampaignConfig.from_env({}) is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"budget": 0.0}, "budget=0.0 must be positive"), ({"slots": 0}, "slots=0 must be at least 1"),
     ({"items": (("nope", 0),)}, "name targets outside"), ({"targets": ()}, "targets: none")],
)
def test_a_bad_campaign_config_is_refused_on_both_ends(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        _config(**changes)
    good = _config().to_json()
    with pytest.raises(ValueError, match=message):
        CampaignConfig.from_json({**good, **{k: list(v) if isinstance(v, tuple) else v for k, v in changes.items()}})


def test_list_names_every_target(capsys) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "truncate-hybrid" in out and "truncate-any-layout" in out


def test_planted_bug_campaign_writes_a_repro_that_fails_then_passes(tmp_path: Path) -> None:
    """End to end: a planted pre-fix bug is found, shrunk and written as a
    test in vLLM's idiom that fails on the buggy vLLM and passes on the fixed one."""
    repros, report, junit = tmp_path / "repros", tmp_path / "report", tmp_path / "junit.xml"
    proc = _fuzz(
        "run", "--budget", "8s", "--target", "truncate-hybrid", "--seed", "3",
        "--plant", "pre_fix_assert_all", "--db", str(tmp_path / "db"),
        "--repro-dir", str(repros), "--report-dir", str(report), "--junit", str(junit),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    metas = [json.loads(p.read_text()) for p in repros.glob("*.json")]
    assert metas and metas[0]["invariant"] == "no-unexpected-failure", metas
    assert metas[0]["vllm_version"] == adapter.VLLM_VERSION and metas[0]["blob"]
    repro = repros / metas[0]["repro"]
    source = repro.read_text()
    assert "kvtrunc" in source and "import fuzz" not in source and "from fuzz" not in source
    assert f"vLLM {adapter.VLLM_VERSION} breaks 'no-unexpected-failure'" in source
    assert metas[0]["upstream_path"] == "v1/core/test_truncate_computed_blocks_no_unexpected_failure.py", metas
    assert "failures" in junit.read_text()
    assert "<svg" in (report / "report.html").read_text()
    assert "no-unexpected-failure" in (report / "report.md").read_text()

    # The repro fails while the bug is planted and passes on unmodified vLLM.
    with adapter.planted_truncate_bug("pre_fix_assert_all"):
        assert pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(repros), "-c", "/dev/null", str(repro)]) == 1
    assert pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(repros), "-c", "/dev/null", str(repro)]) == 0
    replay = _fuzz("replay", str(repro))
    assert replay.returncode == 0 and "PASSES now" in replay.stdout, replay.stdout


def test_clean_campaign_runs_every_default_target_early_and_reports(tmp_path: Path) -> None:
    """A short campaign on the default targets: every target runs its first
    slice before any target runs its second (fair slices from the start, not
    one target after another), each of those slices runs examples, and the
    report says when. Asserted on the order of slices and the counts, never
    on the clock: a loaded machine changes how long, not in what order."""
    from fuzz.registry import default_targets

    proc = _fuzz(
        "run", "--budget", "20s", "--seed", "1",
        "--db", str(tmp_path / "db"), "--repro-dir", str(tmp_path / "r"), "--report-dir", str(tmp_path / "rep"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "first example" in proc.stdout and "start-up: workers ready to fuzz" in proc.stdout
    record = json.loads((tmp_path / "rep" / "campaign.json").read_text())["total"]
    names = {t.name for t in default_targets()}
    (order,) = record["turns"].values()  # one worker slot
    first_round = order[: len(names)]
    assert sorted(first_round) == sorted(names), order
    assert set(record["first_example_s"]) == names, record["first_example_s"]
    assert all(record["examples"][name] >= 1 for name in names), record["examples"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Branches reached" in md and "Spec types drawn" in md and "start-up:" in md
    # The schedule is shown: every slice with why its target got it.
    (slices,) = record["slices"].values()
    assert [s[0] for s in slices] == order
    assert {s[1].split()[0] for s in slices} <= {"first", "floor", "best"}, slices
    assert "## Schedule" in md and "new behaviours" in md


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("missing.py", None, "missing.py: no such file"),
        ("missing.json", None, "missing.json: no such file"),
        ("finding.json", '{"invariant": "no-exception"}', "finding.json: a JSON file without a finding's 'repro' field"),
        ("list.json", "[1, 2]", "list.json: a JSON file without a finding's 'repro' field"),
        ("broken.json", "not json {", "broken.json: not JSON (JSONDecodeError)"),
        ("elsewhere.json", '{"repro": "gone.py"}', "elsewhere.json: its repro gone.py is not next to it"),
        ("escape.json", '{"repro": "../x.py"}', "escape.json: a JSON file without a finding's 'repro' field"),
        ("plain.py", "x = 1\n", "plain.py: no test function in it"),
        ("notes.txt", "hello\n", "notes.txt: not a .py file"),
    ],
)
def test_replay_answers_bad_input_with_one_line_and_exit_2(tmp_path: Path, capsys, name: str, content: str | None,
                                                           expected: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("python -m fuzz replay: ") and f"{tmp_path}/{expected}" in err[0], err[0]
    assert "expected a repro .py file written by `run`, or its .json sidecar" in err[0], err[0]


def _recorded_scheduler_finding(tmp_path: Path, bug: str):  # type: ignore[no-untyped-def]
    """A planted bug's fixed run (tests/invariants/planted_cases.py),
    its violation recorded as a campaign worker records it: the violation and
    the sidecar returned."""
    from fuzz.campaign.findings import Findings
    from fuzz.model import InvariantViolation
    from tests.invariants.planted_cases import FIXED_CASES

    check, run = next((c, r) for c, _, b, r, _ in FIXED_CASES if b == bug)
    with adapter.planted_scheduler_bug(bug):
        with pytest.raises(InvariantViolation) as caught:
            run((check,))
        findings = Findings(repro_dir=tmp_path, start=0.0, campaign_seed=None, worker="w0",
                            vllm_version=adapter.VLLM_VERSION)
        meta = findings.record("scheduler-machine", 1, caught.value)
    assert meta is not None
    return caught.value, meta


def test_replay_reruns_a_sidecars_operation_log_under_every_claim(tmp_path: Path, capsys) -> None:
    """The sidecar keeps the shrunk log the repro file came from (not the
    campaign's totals: the returned entry has none); `replay` of the
    sidecar, or of its .py, rebuilds that log and replays it with every
    check on: it STILL FAILS, naming the claim and crash state, while the
    bug is planted, and PASSES now without it."""
    from fuzz.campaign.findings import crash_state
    from fuzz.model import decode_oplog

    violation, meta = _recorded_scheduler_finding(tmp_path, "cache_salt_not_hashed")
    sidecar = tmp_path / f"{meta['stem']}.json"
    kept = json.loads(sidecar.read_text())
    assert "oplog" not in meta and kept["repro"] == meta["repro"]
    assert decode_oplog(kept["oplog"]) == violation.repro_oplog
    assert len(violation.repro_oplog.steps) <= len(violation.oplog.steps)
    for path in (sidecar, tmp_path / meta["repro"]):
        with adapter.planted_scheduler_bug("cache_salt_not_hashed"):
            assert main(["replay", str(path)]) == 1
        out = capsys.readouterr().out
        assert f"{path.name}: STILL FAILS (replayed its operation log" in out, out
        assert f"  claim: {meta['invariant']}\n" in out and f"  state: {crash_state(violation)}" in out, out
        assert main(["replay", str(path)]) == 0
        out = capsys.readouterr().out
        assert f"{path.name}: PASSES now (replayed its operation log" in out, out


def test_replay_refuses_an_unreadable_operation_log_with_one_line(tmp_path: Path, capsys) -> None:
    sidecar = tmp_path / "finding.json"
    sidecar.write_text(json.dumps({"repro": None, "oplog": {"format": 1, "log": {"@type": "OpLog", "ops": []}}}))
    assert main(["replay", str(sidecar)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{sidecar}: its sidecar's oplog cannot be read: log: " in err[0], err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["list", "extra"], "python -m fuzz list: unrecognized arguments: extra"),
        (["nosuch"], "python -m fuzz: argument {run,list,replay,merge,matrix,bugbench}: invalid choice: 'nosuch'"),
        (["bugbench", "--seeds", "x"], "python -m fuzz bugbench: argument --seeds: invalid int value: 'x'"),
        (["bugbench", "--bug", "nosuch"], "python -m fuzz bugbench: unknown bug nosuch; known: "),
        (["matrix", "--nosuch"], "python -m fuzz matrix: unrecognized arguments: --nosuch"),
    ],
)
def test_every_subcommand_answers_bad_input_with_one_line_and_exit_2(capsys, argv: list[str], expected: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(expected), err
