"""Redis connections: a real server by URL, or the embedded in-process one
(docs/architecture.md#processes-and-cli)."""

from __future__ import annotations

import redis


def connect(url: str | None) -> redis.Redis:
    """A client for ``url``; without one, an embedded fakeredis with Lua support.

    The embedded server is private to this process: only single-process commands
    (``call``, ``demo``, ``loadtest``) may use it.
    """
    if url:
        return redis.Redis.from_url(url)
    import fakeredis  # imported lazily: only the embedded mode needs it

    client: redis.Redis = fakeredis.FakeRedis()
    return client


def is_embedded(client: redis.Redis) -> bool:
    return type(client).__module__.startswith("fakeredis")
