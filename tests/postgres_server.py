"""The test run's own PostgreSQL database: created on first use, dropped at the end.

The server is ``DSH_SCHEDULE_TEST_POSTGRES`` (a ``postgresql://`` URL whose database is
used only to create and drop the run's own) or, by default, the local one on
127.0.0.1:5432 as user ``postgres`` (``.ci/run`` starts it when it is not answering).
The run's database has a name of its own (``dsh_schedule_test_<pid>_<random>``); no
other database is ever touched. A test that needs PostgreSQL fails when it cannot be had
in CI (``CI=true``, or under ``.ci/run``), and is skipped with the reason otherwise.
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from dsh_schedule.shared.store.postgres import EVENTS, SESSIONS, PostgresStore

TEST_POSTGRES_ENV = "DSH_SCHEDULE_TEST_POSTGRES"
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` instead."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


class _SuiteDatabase:
    url: str | None = None
    name: str | None = None
    server_url: str | None = None
    unavailable: str | None = None


def _drop() -> None:
    name, _SuiteDatabase.name = _SuiteDatabase.name, None
    if name is None or _SuiteDatabase.server_url is None:
        return
    with psycopg.connect(_SuiteDatabase.server_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def test_database_url() -> str | None:
    """The URL of this run's database (created on first call); None when PostgreSQL
    cannot be had (``_SuiteDatabase.unavailable`` says why)."""
    if _SuiteDatabase.url is not None or _SuiteDatabase.unavailable is not None:
        return _SuiteDatabase.url
    server = os.environ.get(TEST_POSTGRES_ENV) or DEFAULT_SERVER_URL
    name = f"dsh_schedule_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    except psycopg.Error as exc:
        _SuiteDatabase.unavailable = f"PostgreSQL at {server} cannot be used: {exc}"
        return None
    _SuiteDatabase.server_url = server
    _SuiteDatabase.name = name
    atexit.register(_drop)
    _SuiteDatabase.url = with_database(server, name)
    return _SuiteDatabase.url


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` true, or ``.ci/run``'s own mark)."""
    return (os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
            or bool(os.environ.get("DSH_SCHEDULE_CI_TOOLS")))


def require_postgres() -> str:
    """This run's database URL; fails the test (CI) or skips it when there is none."""
    url = test_database_url()
    if url is None:
        reason = _SuiteDatabase.unavailable or "PostgreSQL unavailable"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return url


def empty_database(url: str) -> None:
    """Remove every session of the run's database (the schema stays)."""
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (SESSIONS,)).fetchone()
        if exists and exists[0]:
            conn.execute(f"TRUNCATE {EVENTS}, {SESSIONS}")  # type: ignore[arg-type]


@pytest.fixture
def postgres_url() -> str:
    """The run's database, emptied of sessions for this test."""
    url = require_postgres()
    empty_database(url)
    return url


@pytest.fixture
def postgres_store(postgres_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(postgres_url)
    try:
        yield store
    finally:
        store.close()
