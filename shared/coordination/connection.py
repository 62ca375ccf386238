"""Redis connections: a real server by URL, or the embedded in-process one when asked for
by name (docs/architecture.md#processes-and-cli).

There is no implicit embedded mode: a host built without a Redis URL would answer
"scheduled" and never deliver (nothing outside its own process can see its wakes), so
``connect`` refuses a missing URL and only ``connect_embedded`` makes the private one
(docs/decisions.md#no-implicit-embedded-redis).
"""

from __future__ import annotations

import redis

from dsh_schedule.shared.core.errors import ScheduleError


class RedisUrlMissing(ScheduleError, ValueError):
    """``connect`` was given no Redis URL."""

    def __init__(self) -> None:
        super().__init__(
            "no Redis URL: pass one to connect() (Settings.redis_url, from "
            "DSH_SCHEDULE_REDIS_URL or --redis, e.g. redis://127.0.0.1:6379/0); the "
            "embedded in-process Redis is asked for by name with connect_embedded(), and "
            "only a single-process program may use it (docs/host-integration.md)"
        )


def connect(url: str | None) -> redis.Redis:
    """A client for the Redis server at ``url``; ``RedisUrlMissing`` for None or ''."""
    if not url:
        raise RedisUrlMissing()
    return redis.Redis.from_url(url)


def connect_embedded() -> redis.Redis:
    """A new embedded Redis (fakeredis, with Lua), private to this process: only the
    single-process commands (``call``, ``demo``, ``loadtest``, ``web`` without a Redis
    URL) and tests use it — a worker or scheduler in another process never sees it."""
    import fakeredis  # imported lazily: only the embedded mode needs it

    client: redis.Redis = fakeredis.FakeRedis()
    return client


def is_embedded(client: redis.Redis) -> bool:
    return type(client).__module__.startswith("fakeredis")
