"""Pushed delivery (docs/architecture.md#hosts-followups-and-rebuild): a followup entry
announces its agent on the ready stream of its lease's queue, and a host delivers for the
agents announced, never by looking at every agent.

Exactly once survives the new path: a flush, a stream begun anew behind the host's place,
a host killed while it held an announcement or an entry, several hosts on one queue.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
import pytest
import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.worker.due import DueOwner, WakeOutcome
from tests.redis_server import RedisServer
from tests.support import (
    FakeClock,
    dispatch_records,
    new_session,
    reminder_messages,
    reminder_texts,
    wait_until,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def quick(settings: Settings) -> Settings:
    """An entry another consumer read becomes claimable after 50 ms."""
    return msgspec.structs.replace(settings, followup_stale_s=0.05)


@pytest.fixture
def system(redis_client: redis.Redis, quick: Settings, clock: FakeClock) -> EmbeddedSystem:
    return EmbeddedSystem(MemoryStore(), quick, clock=clock, sleep=clock.advance,
                          client=redis_client, injected_clock=True)


def _open(system: EmbeddedSystem, session: str = "s1", host: ReferenceHost | None = None) -> str:
    new_session(system.store, session)
    (host or system.host).open_root(session)
    system.step()  # the new lease's wake finds nothing due
    return session


def _create(host: ReferenceHost, session: str, **args: Any) -> None:
    _definition, handler = host.agents[session].tools["schedule_create"]
    result = handler(args)
    assert not result.is_error, result.content


def _dispatch(system: EmbeddedSystem, clock: FakeClock, seconds: float) -> None:
    """Let ``seconds`` pass and run the due wakes: entries written and announced; nothing
    is delivered."""
    clock.advance(seconds)
    system.coordination.wakes.move_due(clock())
    system.worker.work(burst=True, logging_level="WARNING")


# -- what an idle host costs ----------------------------------------------------------------


def _calls(client: redis.Redis) -> dict[str, int]:
    stats: Any = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


@pytest.mark.redis
def test_an_idle_host_sends_redis_nothing_but_its_blocking_read_and_marker_checks(
    redis_server: RedisServer, settings: Settings
) -> None:
    # given a host serving 2,000 idle agents, on a Redis of this test alone, whose lease
    # renewals are further apart than the measured window
    client = redis_server.client()
    idle = msgspec.structs.replace(settings, lease_ttl_s=600.0, lease_renew_s=300.0)
    store = MemoryStore()
    host = ReferenceHost(store, Coordination(client, idle), idle)
    for i in range(2_000):
        host.open_root(new_session(store, f"idle-{i:04d}"))
    probe = redis_server.client()
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,), kwargs={"poll_s": 0.2},
                              daemon=True)
    thread.start()
    try:
        # past the first passes (the renewal, one look at each agent just installed) ...
        assert wait_until(lambda: _calls(probe).get("xread", 0) >= 3, timeout=60)
        before = _calls(probe)
        # ... when the host serves its idle agents for a while
        time.sleep(3)
        after = _calls(probe)
    finally:
        stop.set()
        thread.join(10)
    delta = {name: after[name] - before.get(name, 0) for name in after}
    # then Redis saw nothing from it but its blocking reads of the ready stream and, about
    # once a second, its check of the generation marker (one script reading one key)
    assert {name: n for name, n in delta.items()
            if n and name not in ("xread", "info", "eval", "get")} == {}
    assert 1 <= delta["xread"] < 100  # a handful of reads, not one per agent
    assert 1 <= delta["eval"] == delta["get"] <= 3 / idle.generation_check_s + 2


@pytest.mark.redis
def test_the_run_loop_delivers_what_is_announced(
    real_redis: redis.Redis, settings: Settings
) -> None:
    store = JsonlStore(settings.sessions)
    coordination = Coordination(real_redis, settings)
    host = ReferenceHost(store, coordination, settings)
    owner = DueOwner(store, coordination, settings, clock=wall_clock_ms)
    session = new_session(store, "s1")
    host.open_root(session)
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,), kwargs={"poll_s": 2.0},
                              daemon=True)
    thread.start()
    try:
        _create(host, session, prompt="stretch", after_seconds=1)
        due_at = wall_clock_ms() + 1_100
        assert wait_until(lambda: wall_clock_ms() >= due_at, timeout=5, interval=0.05)
        assert owner.wake([(session, None)])[session] is WakeOutcome.SETTLED  # writes and announces
        assert wait_until(lambda: len(reminder_texts(store, session)) == 1, timeout=20)
    finally:
        stop.set()
        thread.join(10)
    assert len(dispatch_records(store, session)) == 1
    assert coordination.followups.waiting(session) == 0


# -- exactly once on the pushed path --------------------------------------------------------


def test_a_flush_after_the_announcement_is_reprojected_and_delivered_once(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    session = _open(system)
    _create(system.host, session, prompt="x", after_seconds=2)
    _dispatch(system, clock, 3)
    assert len(dispatch_records(system.store, session)) == 1
    system.flush_redis()  # the entry and its announcement are gone together
    for _ in range(12):  # the next renewal finds the lease new; the wake re-projects
        clock.advance(1)
        system.step()
    assert len(reminder_texts(system.store, session)) == 1
    assert system.coordination.followups.waiting(session) == 0


def test_a_flush_between_the_followup_and_its_announcement_is_delivered_once(
    redis_client: redis.Redis, settings: Settings, clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The due transaction announces once it lets the agent go; Redis flushed in between
    still delivers exactly once, well before the entry's stale age would announce it
    again. (A worker killed there: tests/integration/test_processes.py.)"""
    assert settings.followup_stale_s >= 30
    system = EmbeddedSystem(MemoryStore(), settings, clock=clock, sleep=clock.advance,
                            client=redis_client, injected_clock=True)
    session = _open(system)
    _create(system.host, session, prompt="x", after_seconds=2)
    owner = system.owner
    real = owner._announce

    def lose(agents: Any) -> None:
        system.flush_redis()  # entry, lease and wake gone; the announcement follows
        real(agents)

    monkeypatch.setattr(owner, "_announce", lose)
    _dispatch(system, clock, 3)
    monkeypatch.setattr(owner, "_announce", real)
    assert len(dispatch_records(system.store, session)) == 1
    assert system.host.serve(0.0) == []  # nothing announced: the host knows of nothing
    waited = 0
    while not reminder_texts(system.store, session) and waited < 25:
        clock.advance(1)
        waited += 1
        system.step()
    assert len(reminder_texts(system.store, session)) == 1, waited
    for _ in range(5):
        clock.advance(1)
        system.step()
    assert len(reminder_texts(system.store, session)) == 1
    assert len(dispatch_records(system.store, session)) == 1
    assert system.coordination.followups.waiting(session) == 0


def test_a_ready_stream_begun_anew_behind_the_hosts_place_is_read_from_its_start(
    system: EmbeddedSystem, clock: FakeClock, redis_client: redis.Redis
) -> None:
    """After a flush the stream starts again from the server's clock; a host whose place
    was ahead of it (a Redis whose clock ran ahead) must not wait for the ids to catch up."""
    session = _open(system)
    _create(system.host, session, prompt="x", after_seconds=2)
    ready_key = system.coordination.keys.ready(system.settings.queue)
    redis_client.xadd(ready_key, {"agent": "elsewhere"}, id="99999999999999-0")
    assert system.host.serve(0) == []  # the host's place is now far ahead
    _dispatch(system, clock, 3)
    system.flush_redis()
    system.host.plugin.renew_leases()  # every lease is new: the agent's wake is enqueued
    assert system.host.serve(0) == []  # the host looks at the agent at once: nothing yet
    system.worker.work(burst=True, logging_level="WARNING")  # re-projects and announces

    delivered = system.host.serve(0)

    assert [(s, d.pairs[0].scheduleId) for s, d in delivered] == [(session, "schedule-1")]
    for _ in range(5):
        clock.advance(1)
        system.step()
    assert len(reminder_texts(system.store, session)) == 1


class Killed(BaseException):
    """The host process dies here."""


@pytest.mark.parametrize("restart", ["another-host", "same-consumer"])
@pytest.mark.parametrize("held", ["announcement", "read-entry", "appended-delivery"])
def test_a_host_killed_while_holding_a_followup_leaves_it_delivered_exactly_once(
    system: EmbeddedSystem, clock: FakeClock, quick: Settings, monkeypatch: pytest.MonkeyPatch,
    held: str, restart: str,
) -> None:
    session = _open(system)
    _create(system.host, session, prompt="x", after_seconds=2)
    _dispatch(system, clock, 3)
    killed = system.host
    followups = system.coordination.followups
    # the first host takes the announcement and gets as far as ``held`` before it dies
    assert killed.plugin.bridge.ready(0) == [session]
    if held == "read-entry":
        assert len(followups.read(session, killed.plugin.bridge.consumer)) == 1
    if held == "appended-delivery":
        def die(*_args: object) -> None:
            raise Killed

        monkeypatch.setattr(followups, "done", die)
        with pytest.raises(Killed):
            killed.pump(session)
        monkeypatch.undo()
        assert len(reminder_texts(system.store, session)) == 1  # in the log, unacknowledged

    # when a host serves the agent again: restarted under its old name, or another one
    consumer = killed.plugin.bridge.consumer if restart == "same-consumer" else None
    system.host = ReferenceHost(system.store, system.coordination, quick, clock=clock,
                                consumer=consumer)
    system.host.open_root(session)
    for _ in range(20):  # an entry another consumer read is claimable once stale
        system.step()
        if followups.waiting(session) == 0:
            break
        clock.advance(1)
        time.sleep(quick.followup_stale_s)

    # then the reminder is in the session exactly once, and nothing is left to deliver
    assert len(reminder_messages(system.store, session)) == 1
    assert followups.waiting(session) == 0
    for _ in range(5):
        clock.advance(1)
        system.step()
    assert len(reminder_messages(system.store, session)) == 1


def test_hosts_on_one_queue_deliver_only_their_own_agents_and_a_shared_one_once(
    system: EmbeddedSystem, clock: FakeClock, quick: Settings
) -> None:
    first = system.host
    second = ReferenceHost(system.store, system.coordination, quick, clock=clock)
    _open(system, "mine", host=first)
    _open(system, "theirs", host=second)
    for session in ("both",):
        new_session(system.store, session)
        first.open_root(session)
        second.open_root(session)
    for host, session in ((first, "mine"), (second, "theirs"), (first, "both")):
        _create(host, session, prompt=session, after_seconds=2)
    first.serve(0)
    second.serve(0)  # each host's own first look at its agents: nothing due yet
    _dispatch(system, clock, 3)

    by_first = [s for s, _d in first.serve(0)]
    by_second = [s for s, _d in second.serve(0)]

    assert sorted(by_first + by_second) == ["both", "mine", "theirs"]
    assert "theirs" not in by_first and "mine" not in by_second
    for session in ("mine", "theirs", "both"):
        assert len(reminder_texts(system.store, session)) == 1


def test_a_followup_that_waited_for_a_turn_is_delivered_as_the_turn_ends(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    session = _open(system)
    _create(system.host, session, prompt="x", after_seconds=2)
    _dispatch(system, clock, 3)  # written and announced before the turn began
    with system.host.plugin.bridge.turn(session):
        assert system.host.serve(0) == []  # the agent's turn is busy: not now
    # the end of the turn names the agent again, without waiting for a retry
    delivered = system.host.serve(0)
    assert [s for s, _d in delivered] == [session]
    assert len(reminder_texts(system.store, session)) == 1


def test_the_bridge_names_an_agent_for_its_own_reasons_once_each(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    bridge = system.host.plugin.bridge
    for session in ("s1", "s2"):
        new_session(system.store, session)
        system.host.open_root(session)
    assert sorted(bridge.ready(0)) == ["s1", "s2"]  # once at install
    assert bridge.ready(0) == []
    bridge.later(["s2", "not-served"], 2.0)
    clock.advance(1)
    assert bridge.ready(0) == []
    clock.advance(1)
    assert bridge.ready(0) == ["s2"]
    bridge.recheck_all()  # after an outage: every served agent once more
    assert sorted(bridge.ready(0)) == ["s1", "s2"]
    assert bridge.ready(0) == []
    assert bridge.dispose(["s1"]) == []
    bridge.recheck_all()
    assert bridge.ready(0) == ["s2"]
