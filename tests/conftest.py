"""Shared fixtures: stores, Redis (embedded and real), settings with short test timings.

The real Redis is the one ``.ci/run`` starts or finds on 127.0.0.1:6379; a test that needs
it fails (never skips) when it is missing. Tests use database 9 and flush it first.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings

REAL_REDIS_URL = os.environ.get("DSH_SCHEDULE_TEST_REDIS", "redis://127.0.0.1:6379/9")


def real_redis_client() -> redis.Redis:
    client = redis.Redis.from_url(REAL_REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:  # fail loudly: CI must provide Redis
        raise RuntimeError(f"real Redis not answering at {REAL_REDIS_URL}") from exc
    return client


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
        redis_url=REAL_REDIS_URL,
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
