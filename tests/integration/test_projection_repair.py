"""Projections that repair themselves (docs/architecture.md#repairing-lost-keys): each key
of a live agent's projection lost once comes back, and its reminder is delivered exactly
once; a reconcile pass over an inconsistent projection ends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.watchdog import Watchdog
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.wake import ArmRequest
from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.integration.test_processes import Cluster
from tests.support import (
    FakeClock,
    Processes,
    delivered_counts,
    dispatch_counts,
    new_session,
    process_env,
    value,
    wait_until,
)

REPAIR_AFTER_S = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def system(redis_client: redis.Redis, settings: Settings, clock: FakeClock) -> EmbeddedSystem:
    settings = msgspec.structs.replace(settings, repair_after_s=REPAIR_AFTER_S)
    return EmbeddedSystem(
        MemoryStore(), settings, clock=clock, sleep=clock.advance, client=redis_client,
        injected_clock=True,
    )


def _open(system: EmbeddedSystem, session: str = "s1") -> str:
    new_session(system.store, session)
    system.host.open_root(session)
    system.step()  # the new lease's immediate wake finds nothing due
    return session


def _create(system: EmbeddedSystem, session: str, **args: Any) -> None:
    _definition, handler = system.host.agents[session].tools["schedule_create"]
    result = handler(args)
    assert not result.is_error, result.content
    value(result.content)


def _run(system: EmbeddedSystem, clock: FakeClock, seconds: float, tick: float = 0.5) -> None:
    for _ in range(int(seconds / tick)):
        clock.advance(tick)
        system.step()


def _lose(system: EmbeddedSystem, session: str, kind: str) -> None:
    _lose_key(system.client, system.coordination.keys, session, kind)


def _lose_key(client: redis.Redis, keys: Keys, session: str, kind: str) -> None:
    """Delete one key (or hash entry) of the agent's projection."""
    wake = client.get(keys.current_wake(session))
    if kind == "wake-entry":
        assert wake is not None
        assert client.zrem(keys.scheduled_jobs(), wake) == 1
    elif kind == "wake-job":
        assert wake is not None
        assert client.delete(f"rq:job:{wake.decode()}") == 1
    elif kind == "wake-pointer":
        assert client.delete(keys.current_wake(session)) == 1
    elif kind == "agent-host":
        assert client.hdel(keys.agent_host(), session) == 1
    elif kind == "lease-queue":
        assert client.hdel(keys.lease_queue(), session) == 1
    else:
        raise AssertionError(kind)


def _projection_whole(system: EmbeddedSystem, session: str) -> bool:
    client, keys = system.client, system.coordination.keys
    host = system.host.plugin.bridge.host
    return (client.hget(keys.agent_host(), session) == host.encode()
            and client.hget(keys.lease_queue(), session) == system.settings.queue.encode())


@pytest.mark.parametrize("kind", ["wake-entry", "wake-job", "wake-pointer", "agent-host",
                                  "lease-queue"])
def test_a_key_lost_before_the_due_moment_is_repaired_and_delivers_once(
    system: EmbeddedSystem, clock: FakeClock, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The watchdog looks at the agent once its due moment passed by ``repair_after_s``
    with the reminder still overdue (or its lease entries wrong), and repairs it."""
    session = _open(system)
    _create(system, session, prompt="x", after_seconds=5)
    _lose(system, session, kind)
    _run(system, clock, 5.0 + REPAIR_AFTER_S + 5.0)
    assert delivered_counts(system.store, session) == {"schedule-1": 1}
    assert dispatch_counts(system.store, session) == {"schedule-1": 1}
    assert _projection_whole(system, session)
    bridge = system.host.plugin.bridge  # and the host digest agrees again, by itself
    assert system.coordination.leases.renew_host(
        bridge.host, now_ms=clock(), ttl_s=system.settings.lease_ttl_s).digest == bridge.digest
    assert "lease entries of host" not in caplog.text


def test_an_agent_let_go_that_a_tool_call_noted_again_is_forgotten_not_leased_again(
    system: EmbeddedSystem, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # given a served session let go while one of its tool calls was in flight: the call's
    # re-arm noted the agent to the watchdog again after the host forgot it
    session = _open(system)
    plugin = system.host.plugin
    plugin.unload([session])
    result = plugin.tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": 5})
    assert not result.is_error, result.content

    # when its reminder stays overdue past the watchdog's look
    _run(system, clock, 5.0 + REPAIR_AFTER_S + 5.0)

    # then the host forgot it, without leasing it again or repairing it
    assert system.client.hget(system.coordination.keys.agent_host(), session) is None
    assert session not in plugin.bridge.served
    assert "repairing" not in caplog.text


class _OutStore(MemoryStore):
    """A store whose loads fail with an outage it has said itself, while ``out``."""

    def __init__(self) -> None:
        super().__init__()
        self.out = True
        self.loads: list[str] = []

    def load(self, session_id: str) -> Any:
        self.loads.append(session_id)
        if self.out:
            failure = PersistenceError("the database is unavailable")
            failure.outage_said = True
            raise failure
        return super().load(session_id)


def test_the_watchdog_waits_out_a_store_outage_the_store_said_without_a_line_per_agent(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # given three agents whose moments passed, and a store out (and saying so itself)
    store = _OutStore()
    for agent in ("a", "b", "c"):
        new_session(store, agent)
    repaired: list[list[str]] = []
    watchdog = Watchdog(store, clock=clock, repair_after_s=REPAIR_AFTER_S,
                        misplaced=lambda agents: [], repair=repaired.append)
    watchdog.watch(["a", "b", "c"], clock())
    clock.advance(REPAIR_AFTER_S + 1)

    # when the watchdog looks, then it tries one load, says nothing, and repairs nothing
    assert watchdog.check() == []
    assert store.loads == ["a"] and "watchdog" not in caplog.text

    # and once the store is back, every agent is looked at, a look later
    store.out = False
    clock.advance(REPAIR_AFTER_S + 1)
    assert watchdog.check() == [] and sorted(store.loads[1:]) == ["a", "b", "c"]
    assert repaired == []


def test_a_followup_stream_lost_after_the_dispatch_is_repaired_and_delivers_once(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    session = _open(system)
    _create(system, session, prompt="x", after_seconds=2)
    clock.advance(3)
    system.coordination.wakes.move_due(clock())
    system.worker.work(burst=True, logging_level="WARNING")  # dispatched, not delivered
    assert dispatch_counts(system.store, session) == {"schedule-1": 1}
    assert system.client.delete(system.coordination.keys.followups(session)) == 1
    _run(system, clock, REPAIR_AFTER_S + 5.0)
    assert delivered_counts(system.store, session) == {"schedule-1": 1}
    assert dispatch_counts(system.store, session) == {"schedule-1": 1}


@pytest.mark.redis
def test_the_watchdog_sends_nothing_while_no_moment_has_passed_whatever_the_agents(
    real_redis: redis.Redis, settings: Settings, clock: FakeClock, round_trips: list[int]
) -> None:
    """Its cost grows with the due work, not with the agents served: 200 agents whose
    reminders are an hour away cost it no command in 10 minutes of checks."""
    system = EmbeddedSystem(
        MemoryStore(), msgspec.structs.replace(settings, repair_after_s=REPAIR_AFTER_S),
        clock=clock, sleep=clock.advance, client=real_redis, injected_clock=True)
    sessions = [new_session(system.store, f"s{i:03d}") for i in range(200)]
    system.host.open_roots(sessions)
    for session in sessions:
        _create(system, session, prompt="x", after_seconds=3600)
    watchdog = system.host.plugin.bridge.watchdog
    clock.advance(REPAIR_AFTER_S + 1)
    for _ in range(3):  # the looks the new leases asked for, 100 a check: nothing overdue
        assert watchdog.check() == []
    sent = round_trips[0]
    for _ in range(600):
        clock.advance(1.0)
        assert watchdog.check() == []
    assert round_trips[0] == sent
    # and it still watches every agent: once their reminders are overdue (no worker ran
    # here), two checks repair all 200
    clock.advance(3600 + REPAIR_AFTER_S)
    assert sorted(watchdog.check() + watchdog.check()) == sessions


def test_a_renewal_writes_again_an_agent_host_entry_a_failover_lost(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    """A write Redis lost took the agent's entry and its share of the host digest: the
    served set still counts the agent, and only the digest tells the renewal."""
    client, keys = system.client, system.coordination.keys
    _open(system, "s0")
    before = {k: client.hgetall(k) for k in (keys.agent_host(), keys.host_digest())}
    session = _open(system, "s1")
    for key, fields in before.items():  # the failover lost the install's write
        client.delete(key)
        client.hset(key, mapping=fields)
    assert client.hget(keys.agent_host(), session) is None
    assert client.scard(keys.served(system.host.plugin.bridge.host)) == 2
    renewed = system.host.plugin.renew_leases()
    assert renewed == [session]
    assert _projection_whole(system, session)
    _create(system, session, prompt="x", after_seconds=2)
    _run(system, clock, 4.0)
    assert delivered_counts(system.store, session) == {"schedule-1": 1}


def test_a_lost_lease_queue_entry_still_announces_on_the_default_queue(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    """Dispatched and announced where the agent's wakes go, long before any repair."""
    session = _open(system)
    _create(system, session, prompt="x", after_seconds=2)
    system.client.hdel(system.coordination.keys.lease_queue(), session)
    _run(system, clock, 4.0)
    assert delivered_counts(system.store, session) == {"schedule-1": 1}


@pytest.mark.redis
def test_the_scheduler_retires_a_host_whose_agent_lost_its_entry_and_keeps_moving(
    real_redis: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    """An expired host's served set holds an agent whose agent-host entry was lost: the
    retire pass ends, the mover moves another host's wake, and SIGTERM stops it."""
    coord = Coordination(real_redis, settings)
    keys, now = coord.keys, coord.clock()
    coord.leases.install("host-a", ["a1"], settings.queue, now_ms=now - 120_000, ttl_s=1)
    real_redis.hdel(keys.agent_host(), "a1")
    coord.leases.install("host-b", ["b1"], settings.queue, now_ms=now, ttl_s=600)
    coord.wakes.arm([ArmRequest("b1", now + 2_000, settings.queue)])
    env = process_env(settings.redis_url or "", settings.sessions, PREFIX=settings.prefix,
                      QUEUE=settings.queue, RECONCILE_INTERVAL="1")
    procs = Processes(tmp_path, env)
    procs.spawn("scheduler", "scheduler")
    try:
        moved = wait_until(lambda: real_redis.zcard(keys.scheduled_jobs()) == 0, timeout=30)
        retired = wait_until(lambda: not real_redis.exists(keys.served("host-a")))
    finally:
        codes = procs.close()
    assert moved and retired, procs.describe()
    assert codes == {"scheduler": 0}, procs.describe()


PROCESS_KINDS = ("wake-entry", "wake-job", "wake-pointer", "agent-host", "lease-queue")


def lose_and_deliver(cluster: Cluster, *, due_s: float) -> dict[str, float]:
    """Real worker and scheduler processes, a host in the test: one session per key kind,
    each with a one-shot due in ``due_s``, loses that key right after its create. Returns,
    per kind, how late its reminder was first seen delivered (wall-clock seconds)."""
    sessions = {kind: cluster.session(f"lost-{kind}") for kind in PROCESS_KINDS}
    cluster.spawn("worker")
    cluster.spawn("scheduler")
    cluster.start_host(*sessions.values())
    client, keys = cluster.client, cluster.coordination.keys
    queue = f"rq:queue:{cluster.settings.queue}"
    # the new leases' wakes are done: none re-arms what is lost below
    assert wait_until(lambda: not client.llen(queue) and not client.hlen(keys.worker_holds()))
    due_ms: dict[str, int] = {}
    for kind, session in sessions.items():
        created = cluster.call(session, "schedule_create",
                               {"prompt": kind, "after_seconds": due_s})
        due_ms[kind] = parse_instant(created["scheduledAt"])
        _lose_key(client, keys, session, kind)
    late: dict[str, float] = {}

    def all_delivered() -> bool:
        for kind, session in sessions.items():
            if kind not in late and delivered_counts(cluster.store, session):
                late[kind] = (wall_clock_ms() - due_ms[kind]) / 1000
        return len(late) == len(sessions)

    assert wait_until(all_delivered, timeout=due_s + 3 * cluster.settings.repair_after_s,
                      interval=0.05), late
    time.sleep(1.0)  # a second delivery would show by now
    for kind, session in sessions.items():
        assert delivered_counts(cluster.store, session) == {"schedule-1": 1}, kind
        assert dispatch_counts(cluster.store, session) == {"schedule-1": 1}, kind
        assert late[kind] >= 0, kind  # never early
    assert cluster.check().returncode == 0
    return late


@pytest.mark.redis
@pytest.mark.slow
def test_real_processes_repair_each_lost_key_and_deliver_once(
    tmp_path: Path, real_redis: redis.Redis
) -> None:
    cluster = Cluster(tmp_path, real_redis)
    cluster.env["DSH_SCHEDULE_REPAIR_AFTER"] = str(REPAIR_AFTER_S)
    cluster.settings = Settings.from_env(cluster.env)
    try:
        lose_and_deliver(cluster, due_s=3.0)
    finally:
        codes = cluster.close()
    assert codes == [0, 0]
