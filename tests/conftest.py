"""Shared fixtures: stores, Redis (embedded and real), settings with short test timings.

The real Redis of the test session is a ``redis-server`` the suite starts itself, on a free
port in a temporary directory, with nothing saved, and stops at the end
(``tests/redis_server.py``). When ``DSH_SCHEDULE_TEST_REDIS`` names a database URL the
tests use that database instead and only ever FLUSHDB it. A test that needs the real
Redis fails (never skips) when neither can be had. ``REAL_REDIS_URL`` (importable from
here) and ``real_redis_url()`` name the database in use.
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis
from redis.connection import Connection

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from tests import children, switched
from tests.postgres_server import postgres_store, postgres_url  # noqa: F401 (fixtures)
from tests.redis_server import TEST_REDIS_ENV, RedisServer, RedisServerMissing

# Where real-Redis tests point when there is no Redis to be had: nothing listens on port 1,
# and the ``real_redis`` fixture fails with the reason before a test gets this far.
UNAVAILABLE_URL = "redis://127.0.0.1:1/0"


class _SuiteRedis:
    """The session's real Redis: resolved once, at session start or on first use."""

    url: str | None = None
    server: RedisServer | None = None
    unavailable: str | None = None
    exported: bool = False


def real_redis_url() -> str:
    """The real Redis database of this test session (starting the suite's own server on
    first use unless ``DSH_SCHEDULE_TEST_REDIS`` names one)."""
    if _SuiteRedis.url is not None:
        return _SuiteRedis.url
    named = os.environ.get(TEST_REDIS_ENV)
    if named:
        _SuiteRedis.url = named
        return named
    try:
        server = RedisServer().start()
    except (RedisServerMissing, RuntimeError) as exc:
        _SuiteRedis.unavailable = str(exc)
        _SuiteRedis.url = UNAVAILABLE_URL
        return UNAVAILABLE_URL
    _SuiteRedis.server = server
    atexit.register(_stop_suite_redis)
    _SuiteRedis.url = server.url(0)
    # Subprocesses, and any code that reads the variable itself, land on this server too.
    os.environ[TEST_REDIS_ENV] = _SuiteRedis.url
    _SuiteRedis.exported = True
    return _SuiteRedis.url


def suite_owns_redis() -> bool:
    """True when the real Redis is the suite's own server (not a named database)."""
    real_redis_url()
    return _SuiteRedis.server is not None


def _stop_suite_redis() -> None:
    server, _SuiteRedis.server = _SuiteRedis.server, None
    if server is not None:
        server.close()
    if _SuiteRedis.exported:
        os.environ.pop(TEST_REDIS_ENV, None)
        _SuiteRedis.exported = False


def __getattr__(name: str) -> str:
    # ``from tests.conftest import REAL_REDIS_URL`` keeps working; the value is resolved
    # when first asked for (pytest_sessionstart asks before any test module is imported).
    if name == "REAL_REDIS_URL":
        return real_redis_url()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The browser tests run last, whatever order pytest chose for its parametrised fixtures.

    Playwright's sync API keeps an event loop running in the main thread from the first
    browser test to the end of the session, and ``asyncio.run`` refuses to start under a
    running loop: any asyncio test after the first browser test would fail. pytest groups
    items by session-scoped parameters (the browser's name), which can move the browser
    tests in front of others as the collection grows.
    """
    browser = [item for item in items if "browser_name" in getattr(item, "fixturenames", ())]
    if browser:
        others = [item for item in items if "browser_name" not in getattr(item, "fixturenames", ())]
        items[:] = others + browser


def pytest_configure(config: pytest.Config) -> None:
    # With DSH_SCHEDULE_LIFECYCLE=on the suite runs with the lifecycle on (tests/switched.py).
    switched.install()
    # Every process a test starts ends with the run, however it is stopped.
    if not config.pluginmanager.has_plugin(children.__name__):
        config.pluginmanager.register(children, children.__name__)


def pytest_sessionstart(session: pytest.Session) -> None:
    real_redis_url()


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_suite_redis()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [_redis_header()]
    if switched.lifecycle_suite():
        lines.append("lifecycle: on for every Settings not naming it (tests/switched.py)")
    return lines


def _redis_header() -> str:
    if _SuiteRedis.server is not None:
        return f"real Redis: the suite's own redis-server at {_SuiteRedis.url}"
    if _SuiteRedis.unavailable is not None:
        return f"real Redis: none ({_SuiteRedis.unavailable})"
    return f"real Redis: {TEST_REDIS_ENV}={_SuiteRedis.url} (FLUSHDB only)"


def real_redis_client() -> redis.Redis:
    """A client of the session's real Redis; fails the test (never skips) when there is none."""
    url = real_redis_url()
    if _SuiteRedis.unavailable is not None:
        pytest.fail(f"this test needs a real Redis: {_SuiteRedis.unavailable}", pytrace=False)
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    else:
        return client
    client.close()
    pytest.fail(f"this test needs a real Redis, and none answers at {url} ({error})",
                pytrace=False)


@pytest.fixture
def real_redis() -> Iterator[redis.Redis]:
    client = real_redis_client()
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.redis)])
def redis_client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    if request.param == "fake":
        yield fakeredis.FakeRedis()
        return
    yield request.getfixturevalue("real_redis")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return Settings(
        redis_url=real_redis_url(),
        sessions=tmp_path / "sessions",
        prefix=f"t{tag}:",
        queue=f"q{tag}",
        lock_ttl_s=5.0,
        tool_lock_wait_s=2.0,
        wake_lock_wait_s=1.0,
        maintenance_ttl_s=5.0,
        turn_ttl_s=10.0,
        turn_renew_s=2.0,
        lease_ttl_s=30.0,
        lease_renew_s=5.0,
        mover_interval_s=0.05,
        reconcile_interval_s=2.0,
    )


@pytest.fixture
def coordination(redis_client: redis.Redis, settings: Settings) -> Coordination:
    return Coordination(redis_client, settings)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (not the session's), for tests that stop, kill or
    restart Redis; fails the test when redis-server is missing."""
    server = RedisServer(tmp_path / "redis")
    missing: str | None = None
    try:
        server.start()
    except RedisServerMissing as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts what is sent to Redis: one packed send is one round trip (a pipeline's
    commands go in one)."""
    sent = [0]
    original = Connection.send_packed_command

    def counting(self: Connection, command: object, check_health: bool = True) -> None:
        sent[0] += 1
        original(self, command, check_health)  # type: ignore[arg-type]

    monkeypatch.setattr(Connection, "send_packed_command", counting)
    yield sent
