"""Redis connections: a real server by URL, or the embedded in-process one when asked for
by name (docs/architecture.md#processes-and-cli).

A URL is one redis-py reads (``redis://``, ``rediss://``, ``unix://``), or a Sentinel URL
``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…]/SERVICE[/DB]``: the client
asks the sentinels where the primary of SERVICE is, and asks again after a failover
(docs/architecture.md#sentinel). The credentials are the data servers'; the sentinels
are asked without any.

There is no implicit embedded mode: a host built without a Redis URL would answer
"scheduled" and never deliver (nothing outside its own process can see its wakes), so
``connect`` refuses a missing URL and only ``connect_embedded`` makes the private one
(docs/decisions.md#no-implicit-embedded-redis).
"""

from __future__ import annotations

import re
from typing import Any, Final, NamedTuple
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from dsh_schedule.shared.core.errors import ScheduleError

SENTINEL_SCHEME: Final = "redis+sentinel"
_HOST_PORT: Final = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/,]+):(\d{1,5})")
SENTINEL_URL_FORM: Final = (
    "a Sentinel URL is redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]"
    "/SERVICE[/DB]")


class SentinelUrl(NamedTuple):
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None


def is_sentinel_url(url: str) -> bool:
    return url.lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The sentinels, service, database and credentials of a Sentinel URL; ValueError
    (``SENTINEL_URL_FORM``, never the password) for one that is not of that form."""
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        userinfo, hosts = "", netloc
    sentinels = []
    for item in hosts.split(","):
        match = _HOST_PORT.fullmatch(item.strip())
        if match is None or not 0 < int(match[2]) <= 65535:
            raise ValueError(SENTINEL_URL_FORM)
        sentinels.append((match[1].strip("[]"), int(match[2])))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if not path or not path[0] or len(path) > 2 or parts.query or parts.fragment:
        raise ValueError(SENTINEL_URL_FORM)
    db_text = path[1] if len(path) == 2 and path[1] else "0"
    if not (db_text.isascii() and db_text.isdigit()):
        raise ValueError(SENTINEL_URL_FORM)
    username, colon, password = userinfo.partition(":")
    return SentinelUrl(
        sentinels=tuple(sentinels), service=path[0], db=int(db_text),
        username=unquote(username) or None,
        password=unquote(password) if colon and password else None,
    )


def location(url: str) -> str:
    """Where a URL points, without credentials (for messages and logs); ValueError for
    a URL no client can be made from."""
    if is_sentinel_url(url):
        named = parse_sentinel_url(url)
        hosts = ",".join(f"{h}:{p}" for h, p in named.sentinels)
        return f"sentinel {hosts} service {named.service}/{named.db}"
    kwargs = redis.Redis.from_url(url).connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']} db {kwargs.get('db', 0)}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


class RedisUrlMissing(ScheduleError, ValueError):
    """``connect`` was given no Redis URL."""

    def __init__(self) -> None:
        super().__init__(
            "no Redis URL: pass one to connect() (Settings.redis_url, from "
            "DSH_SCHEDULE_REDIS_URL or --redis, e.g. redis://127.0.0.1:6379/0); the "
            "embedded in-process Redis is asked for by name with connect_embedded(), and "
            "only a single-process program may use it (docs/host-integration.md)"
        )


def connect(url: str | None, **options: Any) -> redis.Redis:
    """A client for the Redis server at ``url`` (a Sentinel URL: its service's primary,
    wherever it is), with redis-py connection ``options`` (socket timeouts, health check
    interval); ``RedisUrlMissing`` for None or '', ValueError for a malformed URL."""
    if not url:
        raise RedisUrlMissing()
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **options)
    named = parse_sentinel_url(url)
    sentinel_options = {k: v for k, v in options.items() if k.startswith("socket_")}
    # redis-py's sentinel module has no annotations.
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(named.sentinels), sentinel_kwargs=sentinel_options)
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        named.service, db=named.db, username=named.username, password=named.password,
        **options)
    return client


def connect_async(url: str, **options: Any) -> redis.asyncio.Redis:
    """``connect`` for asyncio: a client for the server (or Sentinel service) at ``url``."""
    if not is_sentinel_url(url):
        return redis.asyncio.Redis.from_url(url, **options)
    named = parse_sentinel_url(url)
    sentinel_options = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(named.sentinels), sentinel_kwargs=sentinel_options)
    client: redis.asyncio.Redis = sentinel.master_for(
        named.service, db=named.db, username=named.username, password=named.password,
        **options)
    return client


def connect_embedded() -> redis.Redis:
    """A new embedded Redis (fakeredis, with Lua), private to this process: only the
    single-process commands (``call``, ``demo``, ``loadtest``, ``web`` without a Redis
    URL) and tests use it — a worker or scheduler in another process never sees it."""
    import fakeredis  # imported lazily: only the embedded mode needs it

    client: redis.Redis = fakeredis.FakeRedis()
    return client


def is_embedded(client: redis.Redis) -> bool:
    return type(client).__module__.startswith("fakeredis")
