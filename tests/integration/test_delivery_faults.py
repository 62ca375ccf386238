"""Faults inside the due transaction and the delivery gate
(docs/architecture.md#the-due-transaction)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.errors import FenceConflict
from dsh_schedule.shared.core.events import (
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    NewEvent,
    Session,
)
from dsh_schedule.shared.core.framing import FramingError
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.worker.due import WakeOutcome
from tests.support import (
    FakeClock,
    dispatch_records,
    new_session,
    reminder_messages,
    value,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def system(
    redis_client: redis.Redis, settings: Settings, clock: FakeClock, store: MemoryStore
) -> EmbeddedSystem:
    return EmbeddedSystem(store, settings, clock=clock, sleep=clock.advance,
                          client=redis_client, injected_clock=True)


def _open(system: EmbeddedSystem) -> str:
    session = new_session(system.store)
    system.host.open_root(session)
    system.step()
    return session


def _create(system: EmbeddedSystem, session: str, **args: Any) -> None:
    _d, handler = system.host.agents[session].tools["schedule_create"]
    assert not handler(args).is_error


def _wake(system: EmbeddedSystem, session: str) -> None:
    """Run one wake now (the host keeps renewing its lease meanwhile)."""
    system.host.plugin.renew_leases()
    system.owner.wake([(session, None)])[session]


def _active(system: EmbeddedSystem, session: str) -> list[str]:
    return [r.id for r in system.store.load(session)[1].active]


def test_an_abandoned_smaller_batch_never_stands_in_for_the_recorded_one(
    system: EmbeddedSystem, store: MemoryStore, clock: FakeClock
) -> None:
    """A stale entry {A} left by an abandoned append must not be delivered in place of
    the batch {A, C} the log recorded later; C must reach the session."""
    session = _open(system)
    _create(system, session, prompt="A", every_seconds=3600)
    _create(system, session, prompt="C", every_seconds=3650)
    clock.advance(3600)
    store.fail_next_append()
    _wake(system, session)  # batch [A]: entry written, append abandoned
    assert system.coordination.followups.waiting(session) == 1
    assert len(dispatch_records(system.store, session)) == 0
    clock.advance(60)
    _wake(system, session)  # batch [A, C] recorded
    system.step()
    messages = reminder_messages(system.store, session)
    assert len(messages) == 1
    pairs = [p["scheduleId"] for p in messages[0]["source"]["reminders"]]
    assert pairs == ["schedule-1", "schedule-2"]
    batch = messages[0]["content"][0]["text"].splitlines()[2].removeprefix("reminders_json: ")
    assert [r["reminder_prompt"] for r in json.loads(batch)] == ["A", "C"]
    for _ in range(3):
        _wake(system, session)
        system.step()
    assert len(reminder_messages(system.store, session)) == 1
    assert system.coordination.followups.waiting(session) == 0


def test_a_failed_due_preflight_dispatches_nothing_and_keeps_the_record(
    system: EmbeddedSystem, store: MemoryStore, clock: FakeClock
) -> None:
    session = _open(system)
    _create(system, session, prompt="x", after_seconds=2)
    clock.advance(3)
    store.fail_next_flush()
    _wake(system, session)
    assert len(dispatch_records(system.store, session)) == 0
    assert _active(system, session) == ["schedule-1"]
    _wake(system, session)
    system.step()
    assert len(reminder_messages(system.store, session)) == 1


def test_a_failed_dispatch_barrier_leaves_the_dispatch_for_a_later_preflight(
    system: EmbeddedSystem, store: MemoryStore, clock: FakeClock
) -> None:
    session = _open(system)
    _create(system, session, prompt="x", after_seconds=2)
    clock.advance(3)
    flushes = store.flush_count(session)
    original = store.flush

    def barrier_fails(session_id: str) -> None:
        if store.flush_count(session_id) == flushes + 1:  # preflight ok, barrier fails
            store.fail_next_flush()
        original(session_id)

    store.flush = barrier_fails  # type: ignore[method-assign]
    _wake(system, session)
    store.flush = original  # type: ignore[method-assign]
    assert len(dispatch_records(system.store, session)) == 1
    assert store.unflushed(session)  # not yet confirmed
    system.step()  # the host's gate preflight confirms it and delivers
    assert len(reminder_messages(system.store, session)) == 1
    assert not store.unflushed(session)


def test_a_framing_failure_writes_nothing(
    system: EmbeddedSystem, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _open(system)
    _create(system, session, prompt="x", after_seconds=2)
    clock.advance(3)

    def broken(*args: object) -> str:
        raise FramingError("broken")

    monkeypatch.setattr("dsh_schedule.worker.due_dispatch.plan_dispatch", broken)
    _wake(system, session)
    assert len(dispatch_records(system.store, session)) == 0
    assert system.coordination.followups.waiting(session) == 0
    assert _active(system, session) == ["schedule-1"]


def test_a_failed_barrier_after_host_delivery_still_runs_the_turn(
    system: EmbeddedSystem, store: MemoryStore, clock: FakeClock
) -> None:
    session = _open(system)
    _create(system, session, prompt="x", after_seconds=2)
    clock.advance(3)
    _wake(system, session)
    original = store.flush
    calls = {"n": 0}

    def second_fails(session_id: str) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the gate's preflight passes; the barrier after append fails
            store.fail_next_flush()
        original(session_id)

    store.flush = second_fails  # type: ignore[method-assign]
    delivered = system.host.pump(session)
    store.flush = original  # type: ignore[method-assign]
    assert len(delivered) == 1
    events = system.store.read(session).events
    assert events[-1].type == TURN_END  # the host ran the turn for the reminder
    system.step()
    assert len(reminder_messages(system.store, session)) == 1


@pytest.mark.parametrize("path", ["deliver_next", "deliver_many"])
def test_a_delivery_a_crash_lost_after_its_barrier_failed_is_delivered_again(
    system: EmbeddedSystem, store: MemoryStore, clock: FakeClock, settings: Settings,
    path: str
) -> None:
    """A database that crashes between a delivery's append and its barrier flush loses
    the message (an asynchronous commit not yet written), and the log moves on without
    it: the followup must not have been acknowledged, so it is delivered again, once
    (the gate of one agent, and the gate of a round of many)."""
    # given a dispatched reminder whose delivery is appended but never confirmed durable
    session = _open(system)
    _create(system, session, prompt="x", after_seconds=2)
    clock.advance(3)
    _wake(system, session)
    original = store.flush
    calls = {"n": 0}

    def after_preflight_fail(session_id: str) -> None:
        calls["n"] += 1
        if calls["n"] >= 2:  # the gate's preflight passes; every flush after it fails
            store.fail_next_flush()
        original(session_id)

    store.flush = after_preflight_fail  # type: ignore[method-assign]
    if path == "deliver_next":
        delivered = system.host.pump(session)
    else:
        delivered = [d for _agent, d in system.host.serve()]
    assert len(delivered) == 1  # the turn ran
    store.flush = original  # type: ignore[method-assign]
    # when the database crashed before writing it, and a tool call then appends to the log
    lost = store.lose_unflushed(session)
    assert [e.type for e in lost][:2] == ["turn/start", "user/message"], lost
    assert reminder_messages(system.store, session) == []
    _create(system, session, prompt="later", after_seconds=3600)
    # then the followup, still unacknowledged, is delivered again, and only once
    for _ in range(int(settings.followup_stale_s) + 2):
        clock.advance(1)
        system.step()
    assert len(reminder_messages(system.store, session)) == 1
    assert system.coordination.followups.waiting(session) == 0
    assert len(dispatch_records(system.store, session)) == 1


def test_a_forked_session_has_its_own_reminders_and_delivery(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    parent = _open(system)
    _create(system, parent, prompt="parent's", after_seconds=60)
    system.store.fork(parent, "child", created_at_ms=clock())
    system.host.open_root("child")
    _d, listing = system.host.agents["child"].tools["schedule_list"]
    assert value(listing({}).content) == []
    _d, create = system.host.agents["child"].tools["schedule_create"]
    assert value(create({"prompt": "child's", "after_seconds": 5}).content)["id"] == "schedule-1"
    for _ in range(12):
        clock.advance(1)
        system.step()
    child_messages = reminder_messages(system.store, "child")
    assert len(child_messages) == 1
    assert '"child\'s"' in child_messages[0]["content"][0]["text"]
    assert reminder_messages(system.store, parent) == []
    assert _active(system, parent) == ["schedule-1"]


class AnotherWriterInTheRound(MemoryStore):
    """A store that appends to many sessions at once (``many.AppendsMany``), and lets
    another writer append to one of them just before a round's write."""

    def __init__(self) -> None:
        super().__init__()
        self.interfere: str | None = None
        self.interfere_in = 0  # in which of the rounds (0: the first)
        self.rounds: list[list[str]] = []

    def append_many(self, items: Any) -> dict[str, Any]:
        self.rounds.append([session_id for session_id, _events, _seq in items])
        if self.interfere is not None and len(self.rounds) > self.interfere_in:
            session_id, self.interfere = self.interfere, None
            length = len(self.read(session_id).events)
            self.append(session_id, [NewEvent(type=USER_MESSAGE, time=0, data={
                "content": [{"type": "text", "text": "meanwhile"}],
                "source": {"kind": "user"}})], length)
        found: dict[str, Any] = {}
        for session_id, events, expected_seq in items:
            try:
                found[session_id] = self.append(session_id, events, expected_seq)
            except Exception as exc:
                found[session_id] = exc
        return found


def _three_dispatched(store: MemoryStore, client: redis.Redis, settings: Settings,
                      clock: FakeClock) -> tuple[EmbeddedSystem, list[str]]:
    """Three sessions served by one host, each with a reminder dispatched."""
    system = EmbeddedSystem(store, settings, clock=clock, sleep=clock.advance,
                            client=client, injected_clock=True)
    sessions = [new_session(store, f"s{i}") for i in range(3)]
    for session in sessions:
        system.host.open_root(session)
    system.step()
    for session in sessions:
        _create(system, session, prompt=f"for {session}", after_seconds=2)
    clock.advance(3)
    system.host.plugin.renew_leases()
    system.owner.wake([(session, None) for session in sessions])
    return system, sessions


def test_a_delivery_round_written_at_once_delivers_each_once_when_another_writer_came_between(
    redis_client: redis.Redis, settings: Settings, clock: FakeClock
) -> None:
    # given three sessions with a reminder each, dispatched, and a store whose round's one
    # write finds another writer's message in the second session
    store = AnotherWriterInTheRound()
    system, sessions = _three_dispatched(store, redis_client, settings, clock)
    store.interfere = sessions[1]

    # when the host delivers them in one round
    delivered = [agent for agent, _delivery in system.host.serve()]

    # then the round wrote its deliveries together, each session got its reminder once,
    # and the one another writer moved was decided again after that writer's message
    assert sorted(store.rounds[0]) == sorted(sessions)
    assert sorted(delivered) == sorted(sessions)
    for session in sessions:
        assert len(reminder_messages(store, session)) == 1
    texts = [e.data["content"][0]["text"] for e in store.read(sessions[1]).events
             if e.type == USER_MESSAGE]
    assert texts[-2] == "meanwhile" and texts[-1].endswith(f"\"for {sessions[1]}\"")
    system.step()
    assert all(len(reminder_messages(store, s)) == 1 for s in sessions)


def test_turn_ends_written_at_once_each_follow_their_delivery_when_another_writer_came_between(
    redis_client: redis.Redis, settings: Settings, clock: FakeClock
) -> None:
    # given three sessions with a reminder each, dispatched, and a store whose third
    # round (the turns' ends, after the dispatches and the deliveries) finds another
    # writer's message in one
    store = AnotherWriterInTheRound()
    system, sessions = _three_dispatched(store, redis_client, settings, clock)
    store.interfere, store.interfere_in = sessions[2], 2

    # when the host delivers them in one round and ends their turns
    delivered = [agent for agent, _delivery in system.host.serve()]

    # then the turns' ends were written together, and each log ends its turn, the moved
    # one after the other writer's message
    assert sorted(delivered) == sorted(sessions)
    assert sorted(store.rounds[2]) == sorted(sessions)
    for session in sessions:
        types = [e.type for e in store.read(session).events]
        assert types[-1] == TURN_END
        assert len(reminder_messages(store, session)) == 1
    moved = store.read(sessions[2]).events
    meanwhile = [i for i, e in enumerate(moved) if e.type == USER_MESSAGE
                 and e.data["content"][0]["text"] == "meanwhile"]
    assert meanwhile and meanwhile[0] < len(moved) - 4


class EndRefusedForOne(AnotherWriterInTheRound):
    """``AnotherWriterInTheRound`` whose round of turn ends fails for its first session
    with an error no store failure explains (a bug, a bound)."""

    def append_many(self, items: Any) -> dict[str, Any]:
        ends = all(events[-1].type == TURN_END for _session, events, _seq in items)
        found = super().append_many(items[1:] if ends else items)
        if ends:
            found[items[0][0]] = RuntimeError("unexpected")
        return found


class EndMovedThenUnreadableForOne(AnotherWriterInTheRound):
    """``AnotherWriterInTheRound`` whose round of turn ends finds its first session moved
    by another writer, and whose read of that session, to append its end again, fails
    with an error no store failure explains (a bug, a bound)."""

    def __init__(self) -> None:
        super().__init__()
        self.unreadable: str | None = None

    def append_many(self, items: Any) -> dict[str, Any]:
        ends = all(events[-1].type == TURN_END for _session, events, _seq in items)
        found = super().append_many(items[1:] if ends else items)
        if ends:
            self.unreadable = items[0][0]
            found[self.unreadable] = FenceConflict(items[0][2], items[0][2] + 1)
        return found

    def read(self, session_id: str) -> Session:
        if session_id == self.unreadable:
            self.unreadable = None
            raise RuntimeError("unexpected")
        return super().read(session_id)


@pytest.mark.parametrize("failing", [
    pytest.param(EndRefusedForOne, id="refused"),
    pytest.param(EndMovedThenUnreadableForOne, id="moved-then-unreadable"),
])
def test_a_turn_end_that_fails_unexpectedly_leaves_the_others_of_its_round_ended_once(
    redis_client: redis.Redis, settings: Settings, clock: FakeClock,
    failing: type[AnotherWriterInTheRound],
) -> None:
    # given three sessions with a reminder each, dispatched, and a store whose turn ends
    # round fails for one of them with an unexpected error (at once, or once its end,
    # moved by another writer, is appended again)
    store = failing()
    system, sessions = _three_dispatched(store, redis_client, settings, clock)

    # when the host delivers them in one round (the error is raised), and a person then
    # opens a turn in each session
    with pytest.raises(RuntimeError):
        system.host.serve()
    for session in sessions:
        system.host.prompt(session, "hello")

    # then every turn is ended once
    for session in sessions:
        types = [e.type for e in store.read(session).events]
        assert types.count(TURN_END) == types.count(TURN_START), session


def test_a_wake_that_waited_for_a_turn_is_owed_when_redis_fails_to_send_it_at_the_turns_end(
    system: EmbeddedSystem, store: MemoryStore, clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a served session whose reminder fell due during a turn (its wake waited)
    session = _open(system)
    _create(system, session, prompt="stretch", after_seconds=2)
    clock.advance(3)
    plugin = system.host.plugin

    def refused(_agents: object) -> int:
        raise redis.ConnectionError("connection lost")

    # when Redis fails to send the wake as the turn ends
    with pytest.raises(redis.ConnectionError), plugin.bridge.turn(session):
        plugin.renew_leases()
        assert system.owner.wake([(session, None)])[session] is WakeOutcome.WAITING_FOR_IDLE
        monkeypatch.setattr(system.coordination, "trigger", refused)
    monkeypatch.undo()

    # then the agent is owed its wake, sent once Redis answers, and the reminder delivered
    assert plugin.bridge.owed.owed() == [session]
    assert plugin.check_redis() == [session]
    system.step()
    assert len(reminder_messages(store, session)) == 1


def test_a_reminder_another_process_made_after_its_agents_host_entry_was_lost_is_delivered(
    system: EmbeddedSystem, store: MemoryStore, clock: FakeClock, settings: Settings,
    redis_client: redis.Redis,
) -> None:
    """The host's watchdog knows the moments of its own tool calls; one made by another
    process (``dsh-schedule call``) names the agent on its host's ready stream, so a lost
    ``agent-host`` entry (the agent then looks not live: no wake is armed) is repaired and
    the reminder delivered (docs/architecture.md#repairing-lost-keys)."""
    # given a served session whose install was looked at, and its agent-host entry lost
    session = _open(system)
    clock.advance(settings.repair_after_s + 1)
    system.step()
    redis_client.hdel(system.coordination.keys.agent_host(), session)
    # when another process creates a reminder in it
    other = ScheduleTools(store, Coordination(redis_client, settings), settings, clock,
                          announce=True)
    assert not other.call(session, "schedule_create", {"prompt": "x", "after_seconds": 5}).is_error
    # then the host repairs the agent and the reminder is delivered, once
    for _ in range(int(settings.repair_after_s) + 20):
        clock.advance(1)
        system.step()
    assert len(reminder_messages(store, session)) == 1
