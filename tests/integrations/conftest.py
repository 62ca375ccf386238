"""An asyncio plugin on the embedded Redis, for the adapters' in-process tests."""

from __future__ import annotations

import fakeredis
import pytest

from dsh_schedule.host.aio import AsyncSchedulePlugin
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore


@pytest.fixture
def plugin(settings: Settings) -> AsyncSchedulePlugin:
    return AsyncSchedulePlugin(
        store=JsonlStore(settings.sessions), settings=settings,
        coordination=Coordination(fakeredis.FakeRedis(), settings),
    )


@pytest.fixture
def plugin_off(settings: Settings) -> AsyncSchedulePlugin:
    """``plugin`` with the lifecycle off whatever the run's settings say
    (tests/switched.py): the three tools."""
    return AsyncSchedulePlugin(
        store=JsonlStore(settings.sessions), settings=settings,
        coordination=Coordination(fakeredis.FakeRedis(), settings), lifecycle=False,
    )


@pytest.fixture
def lifecycle_plugin(settings: Settings) -> AsyncSchedulePlugin:
    """``plugin`` with the lifecycle on: ``schedule_update`` is offered."""
    return AsyncSchedulePlugin(
        store=JsonlStore(settings.sessions), settings=settings,
        coordination=Coordination(fakeredis.FakeRedis(), settings), lifecycle=True,
    )
