"""Once a mutation is durable, nothing that fails afterwards changes the answer
(docs/architecture.md#outages)."""

from __future__ import annotations

from collections.abc import Sequence

import fakeredis
import pytest

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event, NewEvent
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, new_session, value


class CutAfterAppend(MemoryStore):
    """A store that takes Redis away the moment a ``schedule/change`` is appended."""

    def __init__(self, server: fakeredis.FakeServer) -> None:
        super().__init__()
        self._server = server
        self.armed = True

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        appended = super().append(session_id, events, expected_seq)
        if self.armed and any(e.type == SCHEDULE_CHANGE for e in events):
            self._server.connected = False
        return appended


def _changes(store: MemoryStore, session: str) -> list[dict[str, object]]:
    return [e.data for e in store.read(session).events if e.type == SCHEDULE_CHANGE]


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def test_a_create_whose_redis_goes_away_after_the_append_answers_its_view(
    server: fakeredis.FakeServer, settings: Settings
) -> None:
    # given a store that cuts Redis off right after the create's append
    store = CutAfterAppend(server)
    session = new_session(store)
    client = fakeredis.FakeRedis(server=server)
    tools = ScheduleTools(store, Coordination(client, settings), settings, FakeClock())

    # when the model creates a reminder (the re-arm and the lock release both fail)
    result = tools.call(session, "schedule_create", {"prompt": "stretch", "after_seconds": 60})

    # then it is told the reminder exists, and the log holds exactly one create
    assert not result.is_error
    assert value(result.content)["id"] == "schedule-1"
    assert [c["operation"] for c in _changes(store, session)] == ["create"]


def test_a_delete_whose_redis_goes_away_after_the_append_answers_deleted(
    server: fakeredis.FakeServer, settings: Settings
) -> None:
    # given an active reminder, and a store that cuts Redis off after the next append
    store = CutAfterAppend(server)
    session = new_session(store)
    client = fakeredis.FakeRedis(server=server)
    tools = ScheduleTools(store, Coordination(client, settings), settings, FakeClock())
    store.armed = False
    assert not tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": 60}).is_error
    store.armed = True

    # when the model deletes it
    result = tools.call(session, "schedule_delete", {"id": "schedule-1"})

    # then it is told the reminder is deleted, and the log holds exactly one delete
    assert value(result.content) == {"id": "schedule-1", "deleted": True}
    assert [c["operation"] for c in _changes(store, session)] == ["create", "delete"]


def test_redis_gone_before_anything_was_written_still_answers_internal_error(
    server: fakeredis.FakeServer, settings: Settings
) -> None:
    """The other side of the rule: nothing confirmed, so nothing is claimed."""
    store = MemoryStore()
    session = new_session(store)
    server.connected = False
    client = fakeredis.FakeRedis(server=server)
    tools = ScheduleTools(store, Coordination(client, settings), settings, FakeClock())

    result = tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": 60})

    assert value(result.content)["code"] == "internal_error"
    assert _changes(store, session) == []
