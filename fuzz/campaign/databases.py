"""Example databases for ``python -m fuzz run --db SPEC``.

A campaign's workers, and the runners of a sharded campaign, share what they
found through one Hypothesis example database: a failure one of them saves is
replayed (and shrunk) first by every other one, and by the next run.

``SPEC`` is one of

``PATH``
    a directory (Hypothesis's ``DirectoryBasedExampleDatabase``; created if
    missing). The default. Safe for many processes on one machine.
``redis://[:PASSWORD@]HOST:PORT/N`` (or ``rediss://``, ``unix://``)
    Hypothesis's ``RedisExampleDatabase``: shared by processes on many
    machines. Reached once when opened, and a server lost mid-run raises
    :class:`DatabaseUnavailable` (a harness error), never a hang or a bogus
    "violation".
``readonly:SPEC``
    a read-only view of any of the above (e.g. a directory copied from a CI
    artifact, or the team's Redis): replays what is there, saves nothing.
``github:OWNER/REPO[/ARTIFACT]``
    Hypothesis's ``GitHubArtifactDatabase`` (read-only): the example database
    a GitHub Actions workflow uploaded as an artifact (default name
    ``hypothesis-example-db``); set ``GITHUB_TOKEN`` for private repositories.

Several specs are combined with Hypothesis's ``MultiplexedDatabase``: reads
from all, writes to the writable ones (``--db .hypothesis/fuzz-db --db
github:me/kvtrunc-fuzz`` replays CI's failures and keeps your own locally).

This module is also a pytest plugin for plain pytest and HypoFuzz: with
``-p fuzz.campaign.databases`` and ``FUZZ_DB=SPEC[,SPEC...]`` in the environment, the
loaded settings profile's database becomes that one, so ``hypothesis fuzz``
workers on many machines share one Redis database (docs/scaling.md).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    GitHubArtifactDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

__all__ = ["DatabaseError", "DatabaseUnavailable", "check_database", "describe", "open_database"]

REDIS_SCHEMES = ("redis", "rediss", "unix")
# A lost server must end the campaign within seconds, not after the client's
# default retries: connect and socket timeouts in seconds (overridable in the
# URL, e.g. ?socket_timeout=30).
REDIS_TIMEOUT_S = 5.0


class DatabaseError(Exception):
    """A ``--db`` spec that cannot be opened: one line, names the spec."""


class DatabaseUnavailable(RuntimeError):
    """The example database failed mid-run (e.g. the Redis server went away).

    A harness error, not a finding: the campaign stops with exit code 2 and
    keeps every repro it already wrote.
    """


def describe(spec: str) -> str:
    """``spec`` with any password hidden, for messages and reports."""
    parts = urlsplit(spec) if "://" in spec else None
    if parts is None or parts.password is None:
        return spec
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def open_database(specs: str | Sequence[str], *, read_only: bool = False) -> ExampleDatabase:
    """Open one ``--db`` spec, or several multiplexed (see the module docstring).

    Raises :class:`DatabaseError` with one line naming the spec and what is
    wrong: an unknown scheme, a Redis server that does not answer, a
    ``readonly:`` directory that does not exist, an artifact that cannot be
    downloaded.
    """
    if isinstance(specs, str):
        specs = [specs]
    if not specs:
        raise DatabaseError("--db: at least one database spec is needed")
    dbs = [_open_one(s, read_only=read_only) for s in specs]
    return dbs[0] if len(dbs) == 1 else MultiplexedDatabase(*dbs)


def check_database(db: ExampleDatabase | None) -> None:
    """Raise :class:`DatabaseUnavailable` if a networked database stopped answering.

    Cheap (one round trip per Redis server); the campaign calls it once per
    slice, so a lost server is noticed within one slice even by a worker that
    is not reading or writing examples.
    """
    for inner in _leaves(db):
        if isinstance(inner, _GuardedRedis):
            inner.ping()


def pytest_configure(config: object) -> None:
    """``-p fuzz.campaign.databases``: FUZZ_DB becomes the database of the loaded profile.

    Runs after conftest.py loaded its profile and before any test module is
    imported, so every ``@given`` test (and HypoFuzz's check that all tests
    share one database) sees it.
    """
    spec = os.environ.get("FUZZ_DB", "").strip()
    if not spec:
        return
    from hypothesis import settings

    try:
        db = open_database([s for s in spec.split(",") if s])
    except DatabaseError as exc:
        import pytest

        raise pytest.UsageError(f"FUZZ_DB: {exc}") from None
    settings.register_profile("fuzz-db", parent=settings(), database=db)
    settings.load_profile("fuzz-db")


def _leaves(db: ExampleDatabase | None) -> Iterable[ExampleDatabase]:
    if db is None:
        return
    if isinstance(db, MultiplexedDatabase):
        for d in db._wrapped:
            yield from _leaves(d)
    elif isinstance(db, ReadOnlyDatabase):
        yield from _leaves(db._wrapped)
    else:
        yield db


def _open_one(spec: str, *, read_only: bool) -> ExampleDatabase:
    spec = spec.strip()
    if not spec:
        raise DatabaseError("--db '': empty database spec")
    if spec.startswith("readonly:"):
        inner = spec[len("readonly:"):]
        if "://" not in inner and not Path(inner).expanduser().is_dir():
            raise DatabaseError(f"--db {spec}: no directory {inner} to replay from")
        return _open_one(inner, read_only=True)
    if spec.startswith("github:"):
        return ReadOnlyDatabase(_open_github(spec))
    scheme = spec.split("://", 1)[0].lower() if "://" in spec else None
    if scheme in REDIS_SCHEMES:
        db: ExampleDatabase = _open_redis(spec)
    elif scheme is not None:
        raise DatabaseError(
            f"--db {describe(spec)}: unknown scheme {scheme}://; expected a directory, "
            f"{', '.join(s + '://' for s in REDIS_SCHEMES)}, readonly:SPEC or github:OWNER/REPO"
        )
    else:
        path = Path(spec).expanduser()
        if path.exists() and not path.is_dir():
            raise DatabaseError(f"--db {spec}: exists and is not a directory")
        if not read_only:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseError(f"--db {spec}: cannot create the directory ({exc.strerror})") from None
        db = DirectoryBasedExampleDatabase(path)
    return ReadOnlyDatabase(db) if read_only else db


def _open_redis(url: str) -> ExampleDatabase:
    try:
        from hypothesis.extra.redis import RedisExampleDatabase
        from redis import Redis
        from redis.exceptions import RedisError
    except ImportError:
        raise DatabaseError(f"--db {describe(url)}: the redis client is not installed (pip install redis)") from None
    query = urlsplit(url).query
    kwargs = {}
    if "socket_timeout" not in query:
        kwargs["socket_timeout"] = REDIS_TIMEOUT_S
    if "socket_connect_timeout" not in query:
        kwargs["socket_connect_timeout"] = REDIS_TIMEOUT_S
    try:
        client = Redis.from_url(url, **kwargs)
        client.ping()
    except (RedisError, ValueError, OSError) as exc:
        raise DatabaseError(f"--db {describe(url)}: cannot reach the Redis server ({_one_line(exc)})") from None
    return _GuardedRedis(RedisExampleDatabase(client), describe(url))


def _open_github(spec: str) -> GitHubArtifactDatabase:
    m = re.fullmatch(r"github:([\w.-]+)/([\w.-]+)(?:/([\w.-]+))?", spec)
    if m is None:
        raise DatabaseError(f"--db {spec}: expected github:OWNER/REPO or github:OWNER/REPO/ARTIFACT")
    owner, repo, artifact = m.groups()
    db = GitHubArtifactDatabase(owner, repo, artifact_name=artifact or "hypothesis-example-db")
    # Download now (or reuse the cached copy), so that a missing artifact or
    # no network is one clear line here, not a warning-turned-error in the
    # middle of the campaign. A fetch of an unknown key does just that.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            list(db.fetch(b"kvtrunc-fuzz: probe"))
        except Exception as exc:  # noqa: BLE001 - any failure here is "cannot download"
            raise DatabaseError(f"--db {spec}: cannot read the artifact ({_one_line(exc)})") from None
    if caught:
        raise DatabaseError(f"--db {spec}: cannot read the artifact ({_one_line(caught[0].message)})")
    return db


def _one_line(exc: object) -> str:
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else (text or type(exc).__name__)


class _GuardedRedis(ExampleDatabase):
    """Hypothesis's Redis database, with a lost server raised as DatabaseUnavailable.

    Without this, a ``redis.ConnectionError`` from inside Hypothesis's engine
    looks exactly like a failing example to the campaign.
    """

    def __init__(self, db: ExampleDatabase, name: str) -> None:
        super().__init__()
        from redis.exceptions import RedisError

        self._db = db
        self._name = name
        self._errors = (RedisError, OSError)

    def __repr__(self) -> str:
        return f"RedisExampleDatabase({self._name})"

    def __eq__(self, other: object) -> bool:
        # One URL, one database, whichever client reaches it (HypoFuzz checks
        # that every test uses the default database; its forked workers open
        # their own client).
        return isinstance(other, _GuardedRedis) and self._name == other._name

    def __hash__(self) -> int:
        return hash(self._name)

    def _lost(self, op: str, exc: BaseException) -> DatabaseUnavailable:
        return DatabaseUnavailable(f"example database {self._name} became unreachable during {op}: {_one_line(exc)}")

    def ping(self) -> None:
        try:
            self._db.redis.ping()  # type: ignore[attr-defined]
        except self._errors as exc:
            raise self._lost("ping", exc) from None

    def fetch(self, key: bytes) -> Iterable[bytes]:
        try:
            return list(self._db.fetch(key))
        except self._errors as exc:
            raise self._lost("fetch", exc) from None

    def save(self, key: bytes, value: bytes) -> None:
        try:
            self._db.save(key, value)
        except self._errors as exc:
            raise self._lost("save", exc) from None

    def delete(self, key: bytes, value: bytes) -> None:
        try:
            self._db.delete(key, value)
        except self._errors as exc:
            raise self._lost("delete", exc) from None

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        try:
            self._db.move(src, dest, value)
        except self._errors as exc:
            raise self._lost("move", exc) from None

    # Change listeners (HypoFuzz's dashboard) go straight to the Redis pub/sub.
    def add_listener(self, f) -> None:  # type: ignore[no-untyped-def]
        self._db.add_listener(f)

    def remove_listener(self, f) -> None:  # type: ignore[no-untyped-def]
        self._db.remove_listener(f)

    def clear_listeners(self) -> None:
        self._db.clear_listeners()
