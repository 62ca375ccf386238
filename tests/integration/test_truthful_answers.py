"""Once a mutation is durable, nothing that fails afterwards changes the answer
(docs/architecture.md#outages)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import fakeredis
import pytest
import redis

from dsh_schedule.cli.commands import repay_before_exit
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event, NewEvent
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import T0, FakeClock, new_session, value


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


class ReplyLost(MemoryStore):
    """A store whose next ``schedule/change`` append is written and then raises, as a
    database does whose reply was lost after it committed (``lands``), or raises
    without writing (not ``lands``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lose: bool | None = None  # None: no fault; else whether the append lands

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        lands, self.lose = self.lose, None
        if lands is None or not any(e.type == SCHEDULE_CHANGE for e in events):
            return super().append(session_id, events, expected_seq)
        if lands:
            super().append(session_id, events, expected_seq)
        raise PersistenceError("the reply was lost")


def live_tools(
    store: MemoryStore, clock: FakeClock, settings: Settings
) -> tuple[str, ScheduleTools, Callable[[], list[float]]]:
    """A session whose agent is live on an in-process Redis, the tools on it, and what
    reads the moments (epoch seconds) of the wakes armed in rq-scheduler's schedule."""
    session = new_session(store)
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    coordination = Coordination(client, settings)
    coordination.leases.install("host", [session], settings.queue, now_ms=clock(), ttl_s=600)

    def armed() -> list[float]:
        scheduled = coordination.keys.scheduled_jobs()
        return [score for _, score in client.zrange(scheduled, 0, -1, withscores=True)]

    return session, ScheduleTools(store, coordination, settings, clock), armed


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "not-landed"])
def test_a_create_whose_outcome_is_unknown_is_woken_for_if_it_landed(
    settings: Settings, lands: bool
) -> None:
    # given a live agent with nothing scheduled, and an append whose reply is lost
    store, clock = ReplyLost(), FakeClock()
    session, tools, armed = live_tools(store, clock, settings)
    store.lose = lands

    # when the model creates a reminder due in a minute
    result = tools.call(session, "schedule_create", {"prompt": "stretch", "after_seconds": 60})

    # then the answer is uncertain, and a wake is armed no later than the reminder's
    # moment: whether or not it landed, the wake reads the log and decides
    assert value(result.content)["code"] == "persistence_uncertain"
    assert [c["operation"] for c in _changes(store, session)] == (["create"] if lands else [])
    assert armed() == [(clock() + 60_000) // 1000]


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "not-landed"])
def test_a_delete_whose_outcome_is_unknown_keeps_the_wake_of_the_reminder(
    settings: Settings, lands: bool
) -> None:
    # given a live agent with a reminder due in a minute, and a delete whose reply is lost
    store, clock = ReplyLost(), FakeClock()
    session, tools, armed = live_tools(store, clock, settings)
    assert not tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": 60}).is_error
    store.lose = lands

    # when the model deletes it
    result = tools.call(session, "schedule_delete", {"id": "schedule-1"})

    # then the wake stays at the reminder's moment: had the delete not landed, a wake
    # armed from the log without the reminder would lose it
    assert value(result.content)["code"] == "persistence_uncertain"
    assert armed() == [(clock() + 60_000) // 1000]


def test_a_create_whose_re_arm_redis_refuses_after_the_append_is_still_woken_for(
    server: fakeredis.FakeServer, settings: Settings
) -> None:
    # given a live agent with nothing scheduled, and a store that cuts Redis off right
    # after the create's append (a one-shot `dsh-schedule call` then exits owing it)
    store, clock = CutAfterAppend(server), FakeClock()
    session = new_session(store)
    client = fakeredis.FakeRedis(server=server)
    coordination = Coordination(client, settings)
    coordination.leases.install("host", [session], settings.queue, now_ms=clock(), ttl_s=600)
    tools = ScheduleTools(store, coordination, settings, clock)

    # when the model creates a reminder due in a minute, and the process forgets its
    # owed re-arm
    result = tools.call(session, "schedule_create", {"prompt": "stretch", "after_seconds": 60})
    server.connected = True
    del tools

    # then the answer is its view, and the reminder's wake was armed before the append
    assert value(result.content)["id"] == "schedule-1"
    scheduled = coordination.keys.scheduled_jobs()
    assert [score for _, score in client.zrange(scheduled, 0, -1, withscores=True)] == [
        (clock() + 60_000) // 1000]


def test_a_create_that_makes_the_wake_earlier_arms_it_once_before_the_write(
    server: fakeredis.FakeServer, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a live agent with a reminder due in two minutes
    store, clock = MemoryStore(), FakeClock()
    session = new_session(store)
    client = fakeredis.FakeRedis(server=server)
    coordination = Coordination(client, settings)
    coordination.leases.install("host", [session], settings.queue, now_ms=clock(), ttl_s=600)
    tools = ScheduleTools(store, coordination, settings, clock)
    tools.call(session, "schedule_create", {"prompt": "later", "after_seconds": 120})
    arms: list[int] = []  # the changes in the log at each arm
    rearm = coordination.rearm

    def counted(*args: object, **kwargs: object) -> object:
        arms.append(len(_changes(store, session)))
        return rearm(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(coordination, "rearm", counted)

    # when the model creates one due sooner
    result = tools.call(session, "schedule_create", {"prompt": "sooner", "after_seconds": 60})

    # then its wake was armed once, before the append (none after it), and the lock is free
    assert not result.is_error
    assert arms == [1]
    scheduled = coordination.keys.scheduled_jobs()
    assert [score for _, score in client.zrange(scheduled, 0, -1, withscores=True)] == [
        (clock() + 60_000) // 1000]
    assert client.exists(coordination.keys.lock(session)) == 0


class _LeasedDuringAppend(MemoryStore):
    """A host installs the agent's lease while the create appends (a renewal after an
    outage): the agent was not live when the wake was armed before the write."""

    def __init__(self, install: Callable[[str], None]) -> None:
        super().__init__()
        self.install = install

    def append(self, session_id: str, events: Sequence[NewEvent],
               expected_seq: int) -> tuple[Event, ...]:
        self.install(session_id)
        return super().append(session_id, events, expected_seq)


def test_a_create_armed_for_an_agent_not_live_before_the_write_is_armed_after_it(
    server: fakeredis.FakeServer, settings: Settings
) -> None:
    # given an agent no host holds a lease on, whose host installs it during the append
    clock = FakeClock()
    client = fakeredis.FakeRedis(server=server)
    coordination = Coordination(client, settings)
    store = _LeasedDuringAppend(lambda agent: coordination.leases.install(
        "host", [agent], settings.queue, now_ms=clock(), ttl_s=600))
    session = new_session(store)
    tools = ScheduleTools(store, coordination, settings, clock)

    # when the model creates a reminder
    result = tools.call(session, "schedule_create", {"prompt": "stretch", "after_seconds": 60})

    # then the wake the arm before the write could not make is armed after it
    assert not result.is_error
    scheduled = coordination.keys.scheduled_jobs()
    assert [score for _, score in client.zrange(scheduled, 0, -1, withscores=True)] == [
        (clock() + 60_000) // 1000]


def test_a_create_whose_wake_redis_refuses_before_the_append_writes_nothing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a live agent whose wake Redis refuses to arm, after its lock was taken
    store, clock = MemoryStore(), FakeClock()
    session, tools, armed = live_tools(store, clock, settings)

    def refused(*_args: object, **_kwargs: object) -> None:
        raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'")

    monkeypatch.setattr(Coordination, "rearm", refused)

    # when the model creates a reminder
    result = tools.call(session, "schedule_create", {"prompt": "stretch", "after_seconds": 60})

    # then nothing was written, and the answer says the call failed
    assert value(result.content)["code"] == "internal_error"
    assert _changes(store, session) == []
    assert armed() == []


@pytest.mark.parametrize("back", [True, False], ids=["redis-back", "redis-still-gone"])
def test_a_one_shot_call_tries_its_owed_re_arm_again_before_it_exits(
    server: fakeredis.FakeServer, settings: Settings, back: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given a live agent whose delete was written and whose re-arm then failed (a
    # delete moves the wake later: it is re-armed after the write, not before)
    store = CutAfterAppend(server)
    session = new_session(store)
    client = fakeredis.FakeRedis(server=server)
    coordination = Coordination(client, settings)
    coordination.leases.install("host", [session], settings.queue, now_ms=T0, ttl_s=600)
    tools = ScheduleTools(store, coordination, settings, FakeClock())
    store.armed = False
    for after in (60, 120):
        tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": after})
    store.armed = True
    assert not tools.call(session, "schedule_delete", {"id": "schedule-1"}).is_error
    assert tools.owed.owed() == [session]

    # when `dsh-schedule call` is about to exit, and Redis answers again (or not)
    if back:
        threading.Timer(0.3, lambda: setattr(server, "connected", True)).start()
    repaid = repay_before_exit(tools, 2.0 if back else 0.5)

    # then the agent is woken before the process exits, or the process says it was not
    assert repaid is back
    assert (tools.owed.owed() == []) is back
    said = capsys.readouterr().err
    assert ("did not take the wake" in said) is not back
    if back:
        assert client.llen(f"rq:queue:{settings.queue}") == 1
