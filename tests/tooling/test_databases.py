"""``--db SPEC``: directory, read-only replay, GitHub artifact, multiplexing, clear errors.

The Redis-backed database is tested against a real server in
``test_redis_campaign.py``; here nothing needs a server or the network.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase, ReadOnlyDatabase

from fuzz.cli import main
from fuzz.campaign.databases import DatabaseError, check_database, describe, open_database

ROOT = Path(__file__).resolve().parents[2]
KEY, VALUE = b"truncate-hybrid", b"\x01\x02choices"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_directory_is_created_and_round_trips(tmp_path: Path) -> None:
    db = open_database(str(tmp_path / "new" / "db"))
    assert isinstance(db, DirectoryBasedExampleDatabase)
    db.save(KEY, VALUE)
    assert list(open_database(str(tmp_path / "new" / "db")).fetch(KEY)) == [VALUE]


def test_readonly_directory_replays_and_saves_nothing(tmp_path: Path) -> None:
    """A directory copied from a CI artifact: replay what CI found, keep it pristine."""
    DirectoryBasedExampleDatabase(tmp_path / "ci-db").save(KEY, VALUE)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "ci-db").rglob("*"))
    db = open_database(f"readonly:{tmp_path / 'ci-db'}")
    assert isinstance(db, ReadOnlyDatabase)
    assert list(db.fetch(KEY)) == [VALUE]
    db.save(KEY, b"new")
    db.delete(KEY, VALUE)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "ci-db").rglob("*")) == before


def test_several_specs_read_from_all_and_write_to_the_writable(tmp_path: Path) -> None:
    DirectoryBasedExampleDatabase(tmp_path / "ci-db").save(KEY, VALUE)
    db = open_database([str(tmp_path / "local"), f"readonly:{tmp_path / 'ci-db'}"])
    assert isinstance(db, MultiplexedDatabase)
    assert list(db.fetch(KEY)) == [VALUE]
    db.save(KEY, b"mine")
    assert list(DirectoryBasedExampleDatabase(tmp_path / "local").fetch(KEY)) == [b"mine"]
    assert list(DirectoryBasedExampleDatabase(tmp_path / "ci-db").fetch(KEY)) == [VALUE]
    check_database(db)  # nothing networked: a no-op


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty database spec"),
        ("http://example.invalid/db", "unknown scheme http://"),
        ("readonly:/nonexistent/ci-db", "no directory /nonexistent/ci-db to replay from"),
        ("github:just-an-owner", "expected github:OWNER/REPO"),
        ("redis://:hunter2@127.0.0.1:{port}/0", "redis://:***@127.0.0.1:{port}/0: cannot reach the Redis server"),
    ],
)
def test_bad_specs_are_one_line_naming_the_spec(spec: str, message: str) -> None:
    port = _free_port()  # nothing listens there
    with pytest.raises(DatabaseError) as info:
        open_database(spec.format(port=port))
    text = str(info.value)
    assert message.format(port=port) in text and "\n" not in text and "hunter2" not in text, text


def test_a_file_is_not_a_database_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(DatabaseError, match="exists and is not a directory"):
        open_database(str(tmp_path / "f"))


def test_describe_hides_passwords_only() -> None:
    assert describe("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert describe("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert describe("redis://h:1/0") == "redis://h:1/0"
    assert describe(".hypothesis/fuzz-db") == ".hypothesis/fuzz-db"


def _github(spec: str, home: Path) -> subprocess.CompletedProcess[str]:
    # A subprocess: Hypothesis fixes its storage directory (where artifacts are
    # cached) once per process.
    code = (
        "from fuzz.campaign.databases import open_database, DatabaseError\n"
        "try:\n"
        f"    db = open_database({spec!r})\n"
        f"    print(repr(db), list(db.fetch({KEY!r})))\n"
        "except DatabaseError as e:\n"
        "    print('ERROR', e)\n"
    )
    env = dict(os.environ, HYPOTHESIS_STORAGE_DIRECTORY=str(home), PYTHONPATH=str(ROOT), GITHUB_TOKEN="")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=home)


def test_github_artifact_replays_a_cached_artifact(tmp_path: Path) -> None:
    """The read path of ``github:OWNER/REPO``, offline: a cached artifact younger
    than a day is used as is (exactly what a laptop has after one download)."""
    ci = tmp_path / "ci-db"
    DirectoryBasedExampleDatabase(ci).save(KEY, VALUE)
    cache = tmp_path / "home" / "github-artifacts" / "fuzz-db"
    cache.mkdir(parents=True)
    stamp = datetime.now(timezone.utc).isoformat().replace(":", "_")
    with zipfile.ZipFile(cache / f"{stamp}.zip", "w") as zf:
        for f in ci.rglob("*"):
            zf.write(f, f.relative_to(ci).as_posix())
    proc = _github("github:me/kvtrunc-fuzz/fuzz-db", tmp_path / "home")
    assert proc.stdout.startswith("ReadOnlyDatabase(GitHubArtifactDatabase(owner='me'"), proc.stdout + proc.stderr
    assert repr([VALUE]) in proc.stdout


def test_github_artifact_without_network_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    proc = _github("github:me/kvtrunc-fuzz", tmp_path / "home")
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR --db github:me/kvtrunc-fuzz: cannot read the artifact ("), proc.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--db", "ftp://x/y"], "--db ftp://x/y: unknown scheme ftp://"),
        (["run", "--db", "readonly:/nonexistent/ci-db"], "no directory /nonexistent/ci-db"),
        (["run", "--shard", "5/4"], "--shard '5/4': K=5 must be in 1..4"),
        (["run", "--shard", "two"], "--shard 'two': expected K/N"),
        (["merge", "/nonexistent/campaign.json"], "merge: /nonexistent/campaign.json is not a campaign.json"),
    ],
)
def test_cli_db_and_shard_errors_exit_2_with_one_line(argv, message, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_cli_unreachable_redis_exits_2_before_fuzzing(capsys) -> None:
    port = _free_port()
    assert main(["run", "--db", f"redis://127.0.0.1:{port}/0", "--budget", "1s"]) == 2
    captured = capsys.readouterr()
    assert "cannot reach the Redis server" in captured.err and "fuzz run:" not in captured.out


_HYPOFUZZ_COLLECT = """
import json
from hypothesis import settings
from hypofuzz.collection import collect_tests
r = collect_tests(["-p", "fuzz.campaign.databases", "fuzz/targets"])
out = {"fuzzable": [], "function_fixtures": {}, "database": repr(settings().database)}
for t in r.fuzz_targets:
    item = t.pytest_item
    out["fuzzable"].append(item.nodeid)
    fixtures = [n for n, defs in item._fixtureinfo.name2fixturedefs.items() if defs[-1].scope == "function"]
    if fixtures:
        out["function_fixtures"][item.nodeid] = fixtures
out["not_collected"] = {k: v["status_reason"] for k, v in r.not_collected.items()}
print("RESULT " + json.dumps(out))
"""


def test_hypofuzz_collects_every_target_unchanged_with_the_shared_database(tmp_path: Path) -> None:
    """``hypothesis fuzz -- -p fuzz.campaign.databases fuzz/targets`` (docs/scaling.md):
    HypoFuzz's own collection accepts every ``fuzz_*`` target that is not
    skipped by its own marks, none uses a function-scoped fixture, and
    FUZZ_DB is the database they all share."""
    pytest.importorskip("hypofuzz", reason="hypofuzz is not installed (requirements/lean.txt)")
    env = dict(os.environ, HYPOTHESIS_PROFILE="nightly", FUZZ_DB=str(tmp_path / "db"), PYTHONPATH=str(ROOT))
    env.pop("CI", None)
    proc = subprocess.run([sys.executable, "-c", _HYPOFUZZ_COLLECT], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert {"fuzz/targets/target_truncate.py::fuzz_truncate_hybrid",
            "fuzz/targets/target_truncate.py::fuzz_truncate_any_layout"} <= set(result["fuzzable"]), result
    assert set(result["not_collected"].values()) <= {"skip", "skipif"}, result["not_collected"]
    assert result["function_fixtures"] == {}, result["function_fixtures"]
    assert result["database"] == f"DirectoryBasedExampleDatabase({tmp_path / 'db'!r})", result["database"]
