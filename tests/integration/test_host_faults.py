"""The hosts through the faults of an ordinary week (docs/architecture.md#outages): a Redis
that answers but refuses writes (out of memory, too few replicas, a replica after a
failover) and a disk that fills up are outages, not crashes. The loop keeps running, says
so once each way, and delivers what fell due once it can; no delivered turn is left open.

Each Redis here is one the test starts (``redis_server``), since the test reconfigures it;
a full disk is a ``JsonlStore`` whose writes fail with ENOSPC, as the store's own tests
simulate it.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec
import pytest
import redis

from dsh_schedule import status
from dsh_schedule.host.aio import AsyncAgentRegistry, AsyncSchedulePlugin
from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.scheduler.process import SchedulerLoop
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import (
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    Event,
    NewEvent,
    SessionHeader,
)
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.worker.due import DueOwner, WakeOutcome
from tests.redis_server import RedisServer
from tests.support import (
    delivered_counts,
    dispatch_counts,
    new_session,
    refuse_writes,
    wait_until,
)

pytestmark = pytest.mark.redis


# -- the faults --------------------------------------------------------------------------


REFUSALS = ["OOM", "NOREPLICAS", "READONLY"]


class FullDisk:
    """Makes a ``JsonlStore``'s writes fail with ENOSPC, as a full disk does (the store
    rolls each failed write back), from ``fill(after=n)``'s n-th next write on until
    ``free()``."""

    def __init__(self, store: JsonlStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self._left: int | None = None
        self._lock = threading.Lock()
        original = store._write

        def write(fd: int, data: bytes, offset: int) -> None:
            with self._lock:
                if self._left is not None:
                    self.full, self._left = self._left == 0, self._left - 1
                    if self.full:
                        self._left = None
                full = self.full
            if full:
                raise OSError(errno.ENOSPC, "No space left on device")
            original(fd, data, offset)

        monkeypatch.setattr(store, "_write", write)

    def fill(self, *, after: int = 0) -> None:
        with self._lock:
            self._left = after

    def free(self) -> None:
        with self._lock:
            self.full, self._left = False, None


# -- helpers -----------------------------------------------------------------------------


@pytest.fixture
def private(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def own(settings: Settings, redis_server: RedisServer) -> Settings:
    """The suite's test settings, on the test's own Redis, renewing leases every second
    (so a refusal of a second and a half spans a renewal)."""
    return msgspec.structs.replace(settings, redis_url=redis_server.url(), lease_renew_s=1.0)


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


def _create(host: ReferenceHost, session: str, **args: Any) -> None:
    _definition, handler = host.agents[session].tools["schedule_create"]
    result = handler(args)
    assert not result.is_error, result.content


def open_turns(events: Sequence[Event]) -> list[int]:
    """The turns that start in the log and never end (none may be left open)."""
    started: list[int] = []
    for event in events:
        if event.type == TURN_START:
            started.append(event.data["turn"])
        elif event.type == TURN_END and event.data["turn"] in started:
            started.remove(event.data["turn"])
    return started


class Running:
    """A loop in a thread of its own until ``close`` sets ``stop``."""

    def __init__(self, target: Callable[[], object], stop: threading.Event) -> None:
        self.stop = stop
        self.failure: BaseException | None = None

        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self.failure = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)


# -- Redis refusing writes ---------------------------------------------------------------


@pytest.mark.parametrize("how", REFUSALS)
def test_the_host_loop_rides_out_an_error_reply_and_delivers_once_afterwards(
    how: str, private: redis.Redis, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # given a host serving one session through its run loop, on a Redis of this test
    caplog.set_level(logging.INFO)
    store = JsonlStore(settings.sessions)
    coordination = Coordination(private, settings)
    host = ReferenceHost(store, coordination, settings)
    owner = DueOwner(JsonlStore(settings.sessions), coordination, settings,
                     clock=wall_clock_ms)
    session = new_session(store, "s1")
    host.open_root(session)
    stop = threading.Event()
    loop = Running(lambda: host.run(stop, poll_s=0.2), stop)
    try:
        _create(host, session, prompt="through the refusal", after_seconds=1)
        # when Redis refuses writes for longer than a lease renewal, the reminder falling
        # due meanwhile
        restore = refuse_writes(private, how)
        try:
            time.sleep(settings.lease_renew_s + 1.5)
            alive_through_it = loop.alive
        finally:
            restore()
        # then the loop kept running and said so once each way ...
        assert alive_through_it, repr(loop.failure)
        assert wait_until(lambda: _lines(caplog, "host: Redis is back") == 1, timeout=10)
        assert _lines(caplog, "host: Redis unavailable") == 1
        # ... and the reminder that fell due is delivered once
        assert owner.wake([(session, None)])[session] is WakeOutcome.SETTLED
        assert wait_until(lambda: delivered_counts(store, session)["schedule-1"] == 1,
                          timeout=20)
        time.sleep(0.5)
        assert loop.alive, repr(loop.failure)
    finally:
        loop.close()
    assert delivered_counts(store, session) == dispatch_counts(store, session) == {
        "schedule-1": 1}
    assert open_turns(store.read(session).events) == []


@pytest.mark.parametrize("how", REFUSALS)
def test_a_host_starting_while_redis_refuses_writes_serves_its_agents_afterwards(
    how: str, private: redis.Redis, settings: Settings
) -> None:
    # given a session, and Redis refusing writes as a host starts (the chaos run restarted
    # a host then: its start-up install died on the error reply)
    store = JsonlStore(settings.sessions)
    coordination = Coordination(private, settings)
    session = new_session(store, "s1")
    host = ReferenceHost(store, coordination, settings)
    restore = refuse_writes(private, how)
    try:
        # when it opens its roots, then it does not fail
        host.open_roots([session])
    finally:
        restore()
    assert not coordination.leases.live_among([session], now_ms=wall_clock_ms())
    # and once Redis takes writes, its run loop's renewal installs the agent
    stop = threading.Event()
    loop = Running(lambda: host.run(stop, poll_s=0.2), stop)
    try:
        assert wait_until(lambda: bool(coordination.leases.live_among(
            [session], now_ms=wall_clock_ms())), timeout=settings.lease_renew_s + 10)
    finally:
        loop.close()


@pytest.mark.parametrize("how", REFUSALS)
def test_the_scheduler_loop_rides_out_an_error_reply_and_rebuilds_afterwards(
    how: str, private: redis.Redis, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # given a scheduler loop past its first rebuild, reconciling
    caplog.set_level(logging.INFO)
    coordination = Coordination(private, settings)
    scheduler = SchedulerLoop(coordination, settings)

    def last_pass() -> str | None:
        found = status.read_reconcile(private, coordination.keys, now_ms=wall_clock_ms())
        return None if found is None else found.kind

    loop = Running(scheduler.run, scheduler.stop)
    try:
        assert wait_until(lambda: last_pass() == "reconcile", timeout=10)
        # when Redis refuses writes for longer than a reconcile interval (each pass writes
        # its summary, each second the heartbeat)
        restore = refuse_writes(private, how)
        try:
            time.sleep(settings.reconcile_interval_s + 1.0)
            alive_through_it = loop.alive
        finally:
            restore()
        # then the loop kept running, said so once each way, and rebuilt once back
        assert alive_through_it, repr(loop.failure)
        assert wait_until(lambda: _lines(caplog, "scheduler: Redis is back") == 1, timeout=10)
        assert _lines(caplog, "scheduler: Redis unavailable") == 1
        assert wait_until(lambda: last_pass() == "rebuild", timeout=10)
        assert _lines(caplog, "scheduler pass failed") == 0
    finally:
        loop.close()


def test_a_delivery_round_an_error_reply_interrupts_still_finishes_its_turn(
    private: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate delivered (the reminder's turn is in the log) and then Redis refused to
    acknowledge the entry: the round answers with its delivery, so the host finishes the
    turn, and the entry is dropped, never delivered twice, once Redis takes writes."""
    # given a dispatched reminder whose delivery append makes Redis refuse writes
    store = JsonlStore(settings.sessions)
    coordination = Coordination(private, settings)
    host = ReferenceHost(store, coordination, settings)
    owner = DueOwner(JsonlStore(settings.sessions), coordination, settings,
                     clock=wall_clock_ms)
    session = new_session(store, "s1")
    host.open_root(session)
    host.serve(0.0)
    _create(host, session, prompt="acknowledge me", after_seconds=1)
    assert wait_until(lambda: owner.wake([(session, None)])[session] is WakeOutcome.SETTLED
                      and dispatch_counts(store, session)["schedule-1"] == 1, timeout=10)
    restores: list[Callable[[], None]] = []
    append = store.append

    def refusing_after_delivery(session_id: str, events: Sequence[NewEvent],
                                expected_seq: int) -> tuple[Event, ...]:
        appended = append(session_id, events, expected_seq)
        if events and events[0].type == TURN_START and not restores:
            restores.append(refuse_writes(private, "NOREPLICAS"))
        return appended

    monkeypatch.setattr(store, "append", refusing_after_delivery)
    # when the host serves it
    try:
        host.serve(1.0)
    except redis.RedisError as exc:  # the end of the turns could not release the phase
        assert "NOREPLICAS" in str(exc)
    finally:
        for restore in restores:
            restore()
    # then the delivered turn is finished, and nothing is delivered twice afterwards
    assert restores, "the reminder was never delivered"
    assert open_turns(store.read(session).events) == []
    assert wait_until(lambda: (host.serve(0.2), coordination.followups.waiting(session))[1]
                      == 0, timeout=20)
    assert delivered_counts(store, session) == {"schedule-1": 1}
    assert open_turns(store.read(session).events) == []


# -- a full disk -------------------------------------------------------------------------


def test_a_full_disk_keeps_the_host_running_and_closes_every_turn_once_space_returns(
    private: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given a host whose disk fills up right after it delivers a reminder (the worker
    # writes elsewhere)
    caplog.set_level(logging.INFO)
    store = JsonlStore(settings.sessions)
    disk = FullDisk(store, monkeypatch)
    coordination = Coordination(private, settings)
    host = ReferenceHost(store, coordination, settings)
    owner = DueOwner(JsonlStore(settings.sessions), coordination, settings,
                     clock=wall_clock_ms)
    session = new_session(store, "s1")
    host.open_root(session)
    stop = threading.Event()
    loop = Running(lambda: host.run(stop, poll_s=0.2), stop)
    try:
        _create(host, session, prompt="first", after_seconds=1)
        _create(host, session, prompt="second", after_seconds=3)
        time.sleep(1.1)
        disk.fill(after=1)  # the delivery's append fits, the turn's end does not
        assert owner.wake([(session, None)])[session] is WakeOutcome.SETTLED
        assert wait_until(lambda: _lines(caplog, "host: session store unavailable") == 1,
                          timeout=10)
        # when the second reminder falls due while the disk stays full
        assert wait_until(lambda: owner.wake([(session, None)])[session] is WakeOutcome.SETTLED
                          and dispatch_counts(store, session)["schedule-2"] == 1, timeout=10)
        time.sleep(2.0)
        # then the host keeps running, delivering nothing into the open turn ...
        assert loop.alive, repr(loop.failure)
        assert delivered_counts(store, session) == {"schedule-1": 1}
        assert len(open_turns(store.read(session).events)) == 1
        # ... and once space returns it closes that turn, then delivers the second
        disk.free()
        assert wait_until(lambda: delivered_counts(store, session)["schedule-2"] == 1,
                          timeout=20)
        assert wait_until(lambda: open_turns(store.read(session).events) == [], timeout=10)
        time.sleep(0.5)
        assert loop.alive, repr(loop.failure)
    finally:
        loop.close()
    assert delivered_counts(store, session) == {"schedule-1": 1, "schedule-2": 1}
    assert _lines(caplog, "host: session store unavailable") == 1
    assert _lines(caplog, "host: session store is back") == 1
    assert "ENOSPC" in caplog.text
    assert _lines(caplog, "delivering followups") == 0  # no traceback per retry


def test_async_serve_rides_out_a_full_disk_and_an_error_reply(
    private: redis.Redis, own: Settings, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The asyncio host API: a handler whose append finds the disk full is awaited again
    (its turn held) until it succeeds; a reminder the gate could not append is delivered
    once the disk takes it; a Redis refusing writes is ridden out."""
    caplog.set_level(logging.INFO)
    settings = own
    store = JsonlStore(settings.sessions)
    disk = FullDisk(store, monkeypatch)
    coordination = Coordination(private, settings)
    owner = DueOwner(JsonlStore(settings.sessions), coordination, settings,
                     clock=wall_clock_ms)
    handled: list[tuple[int, bool]] = []  # (turn, whether the end was appended)

    async def scenario() -> None:
        plugin = AsyncSchedulePlugin(store=store, coordination=coordination,
                                     settings=settings)
        registry = AsyncAgentRegistry()
        plugin.load(registry)
        store.create(SessionHeader(id="s1", createdAt=0))
        agent = await registry.create("s1")
        stop = asyncio.Event()

        async def on_delivery(agent_id: str, delivery: Delivery) -> None:
            end = [NewEvent(type=STEP_START, time=wall_clock_ms(),
                            data={"turn": delivery.turn, "step": 1}),
                   NewEvent(type=STEP_END, time=wall_clock_ms(),
                            data={"turn": delivery.turn, "step": 1}),
                   NewEvent(type=TURN_END, time=wall_clock_ms(),
                            data={"turn": delivery.turn})]
            try:
                at = delivery.turn + len(delivery.events)
                await asyncio.to_thread(store.append, agent_id, end, at)
            except Exception:
                handled.append((delivery.turn, False))
                raise
            handled.append((delivery.turn, True))
            if len({turn for turn, ok in handled if ok}) == 2:
                stop.set()

        for prompt in ("first", "second"):
            _definition, handler = agent.tools["schedule_create"]
            result = await handler({"prompt": prompt, "after_seconds": 1})
            assert not result.is_error, result.content
        serving = asyncio.create_task(plugin.serve(on_delivery, stop, poll_s=0.2))
        try:
            await asyncio.sleep(1.1)
            # the disk is full when the reminders are dispatched: nothing is delivered ...
            disk.fill()
            woken = await asyncio.to_thread(owner.wake, [("s1", None)])
            assert woken["s1"] is WakeOutcome.SETTLED
            await asyncio.sleep(1.0)
            assert delivered_counts(store, "s1") == {}
            # ... then a delivery fits, and the handler's end of its turn does not
            disk.fill(after=1)
            await asyncio.sleep(1.5)
            assert delivered_counts(store, "s1") == {"schedule-1": 1}
            restore = refuse_writes(private, "OOM")
            await asyncio.sleep(1.5)
            restore()
            disk.free()
            await asyncio.wait_for(serving, 30)
        finally:
            stop.set()
            await asyncio.gather(serving, return_exceptions=True)
            await plugin.dispose()

    asyncio.run(scenario())
    assert delivered_counts(store, "s1") == {"schedule-1": 1, "schedule-2": 1}
    assert open_turns(store.read("s1").events) == []
    assert [ok for _turn, ok in handled].count(False) >= 1  # awaited again after it failed
    assert _lines(caplog, "async host: session store unavailable") == 1
    assert _lines(caplog, "async host: session store is back") == 1
    assert _lines(caplog, "async host: Redis unavailable") == 1
    assert _lines(caplog, "async host: Redis is back") == 1
    assert _lines(caplog, "delivering followups") == 0


def test_a_tool_call_on_a_full_disk_answers_persistence_uncertain_and_changes_nothing(
    private: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the tool contract already says, on the store's own ENOSPC (a check, not a
    change): a create whose append the disk refuses is not confirmed and leaves nothing;
    once space returns the same call succeeds."""
    store = JsonlStore(settings.sessions)
    disk = FullDisk(store, monkeypatch)
    host = ReferenceHost(store, Coordination(private, settings), settings)
    session = new_session(store, "s1")
    host.open_root(session)
    _definition, create = host.agents[session].tools["schedule_create"]
    disk.fill()
    refused = create({"prompt": "later", "after_seconds": 60})
    assert refused.is_error
    assert json.loads(refused.content)["code"] == "persistence_uncertain"
    assert store.load(session)[1].active == ()
    disk.free()
    assert not create({"prompt": "later", "after_seconds": 60}).is_error
    assert [r.id for r in store.load(session)[1].active] == ["schedule-1"]


def test_a_prompt_turn_the_disk_would_not_end_is_ended_once_space_returns(
    private: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a user turn whose tool call is confirmed, and then the disk is full
    store = JsonlStore(settings.sessions)
    disk = FullDisk(store, monkeypatch)
    host = ReferenceHost(store, Coordination(private, settings), settings)
    session = new_session(store, "s1")
    host.open_root(session)
    host.serve(0.0)
    disk.fill(after=3)  # the turn's opening, the create, the tool call and its result
    # when the turn's end cannot be appended
    with pytest.raises(PersistenceError):
        host.prompt(session, "remind me", tool_calls=[
            ("schedule_create", {"prompt": "later", "after_seconds": 60})])
    assert len(open_turns(store.read(session).events)) == 1
    # then the host appends it once the disk takes writes, and nothing else before it
    disk.free()
    host.serve(0.0)
    events = store.read(session).events
    assert open_turns(events) == []
    assert [e.type for e in events][-2:] == [STEP_END, TURN_END]
    assert [r.id for r in store.load(session)[1].active] == ["schedule-1"]


def test_a_turn_heartbeat_rides_out_an_error_reply_with_one_line_each_way(
    private: redis.Redis, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # given a turn held through the bridge, its phase renewed every turn_renew_s
    caplog.set_level(logging.INFO)
    coordination = Coordination(private, settings)
    host = ReferenceHost(JsonlStore(settings.sessions), coordination, settings)
    session = new_session(host.store, "s1")
    host.open_root(session)
    with host.plugin.bridge.turn(session):
        # when Redis refuses writes across two renewals, then takes them again
        restore = refuse_writes(private, "NOREPLICAS")
        try:
            time.sleep(2 * settings.turn_renew_s + 0.5)
        finally:
            restore()
        time.sleep(settings.turn_renew_s + 0.5)
        # then the heartbeat said so once each way, and renews the phase again
        assert _lines(caplog, "turn heartbeat of s1: Redis unavailable") == 1
        assert _lines(caplog, "turn heartbeat of s1: Redis is back") == 1
        ttl_ms = private.pttl(coordination.keys.phase(session))
        assert ttl_ms > (settings.turn_ttl_s - settings.turn_renew_s - 1) * 1000
