"""Connections (docs/decisions.md#no-implicit-embedded-redis): a missing Redis URL is a
clear error, never a private in-process Redis that answers "scheduled" and delivers
nothing; the embedded Redis is had only by asking for it by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh_schedule import (
    Coordination,
    JsonlStore,
    RedisUrlMissing,
    SchedulePlugin,
    Settings,
    connect,
    connect_embedded,
)
from dsh_schedule.shared.coordination.connection import is_embedded
from dsh_schedule.shared.core.errors import ScheduleError


@pytest.mark.parametrize("url", [None, ""])
def test_no_url_is_a_schedule_error_naming_what_to_pass(url: str | None) -> None:
    with pytest.raises(RedisUrlMissing) as raised:
        connect(url)
    assert isinstance(raised.value, ScheduleError) and isinstance(raised.value, ValueError)
    message = str(raised.value)
    assert "DSH_SCHEDULE_REDIS_URL" in message and "connect_embedded()" in message


def test_a_host_built_as_the_guide_shows_without_a_url_fails_before_answering(
        tmp_path: Path) -> None:
    # given settings from an environment that names no Redis
    settings = Settings.from_env({}, sessions=tmp_path / "sessions")
    assert settings.redis_url is None

    # when the host is composed as docs/host-integration.md shows, then it stops there
    with pytest.raises(RedisUrlMissing):
        store = JsonlStore(settings.sessions, cache_mb=settings.cache_mb,
                           syncfs=settings.syncfs)
        SchedulePlugin(store=store,
                       coordination=Coordination(connect(settings.redis_url), settings),
                       settings=settings)


def test_the_embedded_redis_is_had_by_name_and_is_private() -> None:
    first, second = connect_embedded(), connect_embedded()
    assert is_embedded(first) and first.ping()
    first.set("k", "v")
    assert second.get("k") is None  # each is its own server


def test_a_url_gives_a_real_client() -> None:
    client = connect("redis://127.0.0.1:1/3")
    assert not is_embedded(client)
    assert client.connection_pool.connection_kwargs["db"] == 3
