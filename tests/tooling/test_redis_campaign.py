"""Two campaigns sharing one Redis example database, against a real redis-server.

Worker A fuzzes with a planted bug (the pre-PR-51468 assert) and finds it;
worker B runs ``--reuse-only`` (it generates nothing, so it can only know the
failure from the database) and reports the same violation moments after A
saved it. Then the Redis server is killed under A: A stops with one clear
line and exit code 2, and the repro it wrote before is still on disk.

redis-server comes from Debian (``scripts/ensure-redis.sh``, run by
``scripts/run-tests.sh``); without it these tests skip, saying so.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fuzz.campaign.databases import DatabaseUnavailable, check_database, open_database

redis = pytest.importorskip("redis", reason="the redis client is not installed (requirements/lean.txt)")
REDIS_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed (scripts/ensure-redis.sh could not install it)"
)

ROOT = Path(__file__).resolve().parents[2]
PLANT = ("--plant", "pre_fix_assert_all", "--target", "truncate-hybrid")
# Campaign seed 16 hits the planted bug in its first round of 100 examples.
FINDING_SEED = "16"
BUDGET = "150s"  # an upper bound: B stops once it has replayed, A is stopped by the kill
PREFIX = b"hypothesis-example:"


class RedisServer:
    """A throw-away redis-server on a free loopback port, no persistence."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "redis.log"
        for _ in range(3):  # the free port may be taken between bind and start
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            self.proc = subprocess.Popen(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(workdir), "--logfile", str(self.log)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 20
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    redis.Redis(port=self.port, socket_timeout=1).ping()
                    return
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
            self.stop()
        pytest.fail(f"redis-server did not start; log: {self.log.read_text()[-2000:] if self.log.exists() else '-'}")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield srv
    finally:
        srv.stop()


def test_redis_database_is_shared_between_clients(server: RedisServer) -> None:
    a, b = open_database(server.url(1)), open_database(server.url(1))
    a.save(b"k", b"v")
    assert list(b.fetch(b"k")) == [b"v"]
    b.delete(b"k", b"v")
    assert list(a.fetch(b"k")) == []
    check_database(a)
    assert "RedisExampleDatabase(redis://127.0.0.1:" in repr(a)


def test_a_lost_server_raises_database_unavailable_quickly(tmp_path: Path) -> None:
    srv = RedisServer(tmp_path)
    try:
        db = open_database(srv.url())
        db.save(b"k", b"v")
        srv.kill()
        # Refused, not retried forever: the client's socket timeouts are
        # bounded (fuzz.campaign.databases.REDIS_TIMEOUT_S), so a hang ends
        # in DatabaseUnavailable too; how long it takes is the bench's business.
        with pytest.raises(DatabaseUnavailable, match=r"redis://127\.0\.0\.1:\d+/0 became unreachable during fetch"):
            list(db.fetch(b"k"))
        with pytest.raises(DatabaseUnavailable, match="during ping"):
            check_database(db)
    finally:
        srv.stop()


def _campaign(out: Path, db: str, *extra: str) -> subprocess.Popen:
    out.mkdir(parents=True)
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "fuzz", "run", *PLANT, "--budget", BUDGET, "--db", db,
             "--repro-dir", str(out / "repros"), "--report-dir", str(out / "report"), *extra],
            cwd=ROOT, stdout=stdout, stderr=stderr,
        )


def _sidecars(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "repros").glob("*.json"))]


def _wait(what: str, cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def two_workers(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Run the whole scenario once; the tests below each check one claim about it."""
    tmp = tmp_path_factory.mktemp("workers")
    url = server.url(0)
    client = redis.Redis(port=server.port)
    b = _campaign(tmp / "b", url, "--reuse-only")
    a = _campaign(tmp / "a", url, "--seed", FINDING_SEED)
    run: dict[str, Any] = {"a": tmp / "a", "b": tmp / "b", "url": url, "saved_at": float("inf")}
    try:
        # When did A first save a failing example (a primary key, not the
        # .secondary/.pareto corpus) to the shared database?
        def saved() -> bool:
            for key in client.scan_iter(match=PREFIX + b"*"):
                if not key.endswith((b".secondary", b".pareto")) and client.scard(key):
                    run["saved_at"] = time.time()
                    return True
            return False

        _wait("worker A to save a failure to Redis", lambda: saved() or a.poll() is not None, 300)
        _wait("worker B to replay it", lambda: b.poll() is not None, 120)
        run["b_rc"] = b.returncode
        # A keeps fuzzing (long budget) with its repro written; now the server dies.
        _wait("worker A's repro", lambda: any((tmp / "a" / "repros").glob("*.json")) or a.poll() is not None, 120)
        time.sleep(0.5)
        run["a_repros_before_kill"] = {p.name: p.read_bytes() for p in (tmp / "a" / "repros").iterdir()}
        run["a_alive_at_kill"] = a.poll() is None
        run["killed_at"] = time.time()
        server.kill()
        try:
            a.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pass
        run["a_exited_after_s"] = time.time() - run["killed_at"] if a.poll() is not None else None
        run["a_rc"] = a.returncode
        yield run
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow
def test_b_replays_a_failure_from_the_shared_database(two_workers: dict[str, Any]) -> None:
    a_meta, b_meta = _sidecars(two_workers["a"]), _sidecars(two_workers["b"])
    assert two_workers["b_rc"] == 1, (two_workers["b"] / "stdout").read_text() + (two_workers["b"] / "stderr").read_text()
    assert a_meta and b_meta and {m["key"] for m in b_meta} == {m["key"] for m in a_meta}
    assert b_meta[0]["invariant"] == "no-unexpected-failure" and b_meta[0]["repro"]
    # B generates nothing: it can only have had the failure from A, after A saved it.
    assert b_meta[0]["found_at"] >= two_workers["saved_at"] - 0.5
    b_report = json.loads((two_workers["b"] / "report" / "campaign.json").read_text())
    assert b_report["config"]["reuse_only"]
    print(f"B replayed A's failure {b_meta[0]['found_at'] - two_workers['saved_at']:.2f}s after A saved it")


@pytest.mark.slow
def test_killing_redis_mid_run_is_one_line_and_exit_2(two_workers: dict[str, Any]) -> None:
    assert two_workers["a_alive_at_kill"], "A had already stopped: nothing was killed under it"
    stderr = (two_workers["a"] / "stderr").read_text().strip().splitlines()
    assert two_workers["a_rc"] == 2, stderr
    assert two_workers["a_exited_after_s"] is not None, "A did not stop on its own once the server was gone"
    assert len(stderr) == 1, stderr
    assert stderr[0].startswith(f"python -m fuzz: harness error: example database {two_workers['url']} became unreachable")
    assert "1 violation(s) or missed hit(s) found before it, repros kept in" in stderr[0]


@pytest.mark.slow
def test_repros_written_before_the_kill_survive(two_workers: dict[str, Any]) -> None:
    before = two_workers["a_repros_before_kill"]
    assert any(n.endswith(".py") for n in before) and any(n.endswith(".json") for n in before)
    repros = two_workers["a"] / "repros"
    for name, content in before.items():
        assert (repros / name).read_bytes() == content
    for py in repros.glob("*.py"):
        compile(py.read_text(), str(py), "exec")
